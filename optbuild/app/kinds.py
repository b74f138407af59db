"""The step kinds a project can use and their reference (``optbuild kinds``), as data: the
steps' manual and registry, with the project's own [kinds], without loading a recipe."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KindRow:
    kind: str
    backend: str  # "" for a kind without backends
    summary: str  # its first line, with "[project: FILE]" for the project's own kinds


def kinds(start: Path) -> list[KindRow]:
    """Every step kind (and backend), the project's own at or above ``start`` marked."""
    from optbuild.project.recipe import project_kinds
    from optbuild.steps import manual, registry

    local = project_kinds(start)
    return [KindRow(kind, name.partition("/")[2], manual.summary(manual.step_class(name, local))
                    + (f" [project: {Path(local[name].rpartition(':')[0]).name}]" if name in local else ""))
            for kind in registry.known_kinds(local)
            for name in manual.step_names(kind, local=local)]


def reference(start: Path, kind: str, backend: str | None = None) -> str:
    """The parameters of ``kind`` (or ``kind/backend``; every backend when none is named), as
    docs/steps.md has them. OptbuildError, with a "did you mean", for an unknown name."""
    from optbuild.project.recipe import project_kinds
    from optbuild.steps import manual

    local = project_kinds(start)
    return "\n".join(manual.kind_reference(name, local) for name in manual.step_names(kind, backend, local))


def known_kinds(local: dict[str, str]) -> list[str]:
    """The kinds' names, with the project-local ones ``local`` (name -> "file.py:Class")."""
    from optbuild.steps import registry

    return registry.known_kinds(local)
