"""The step graph of a project as text (``optbuild graph``): DOT or Mermaid, of the steps
the targets select and what they need."""

from __future__ import annotations

from pathlib import Path
from typing import Literal


def graph_text(directory: Path | None, targets: list[str], fmt: Literal["dot", "mermaid"] = "dot") -> str:
    """The graph of ``targets`` (every step when none) in the project at or above ``directory``."""
    from optbuild.project.graph import StepGraph
    from optbuild.project.recipe import load_project

    graph = StepGraph(load_project(directory).steps)
    selected = graph.select(targets)
    return graph.mermaid(selected) if fmt == "mermaid" else graph.dot(selected)
