"""What the outcomes of a step's upstream mean for it: parked (disabled, or below a disabled
step), free to run without some inputs (partial inputs), which inputs it lacks and why, and
the notes a plan adds where a build may count otherwise."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from optbuild.builder.outcome import Outcome
from optbuild.builder.status import Status
from optbuild.project.graph import StepGraph
from optbuild.project.recipe import Project, StepSpec


def parked(project: Project, graph: StepGraph, outcomes: Mapping[str, Outcome], sid: str) -> str | None:
    """Why ``sid`` is parked: ``enabled = false`` on it, or on a step it depends on (for a
    step that takes partial inputs, on all the steps it depends on)."""
    spec = project.steps[sid]
    if not spec.enabled:
        return f"disabled (enabled = false in {project.recipes[spec.recipe].name})"
    below = [d for d in graph.deps[sid] if d in outcomes and outcomes[d].parked]
    if not below or partial_ok(spec, below):
        return None
    return f"upstream {below[0]} is disabled"


def partial_ok(spec: StepSpec, bad: list[str]) -> bool:
    """Whether ``spec`` may run without ``bad``: its kind takes partial inputs, each of them
    is one of a list (select's candidates), and one of its inputs is left."""
    if not spec.step.partial_inputs:
        return False
    fields = {dep: field_name for field_name, dep in spec.deps.items()}
    return all("." in fields[d] for d in bad) and len(set(bad)) < len(set(spec.deps.values()))


def missing(spec: StepSpec, outcomes: Mapping[str, Outcome]) -> dict[str, dict[str, str]]:
    """The inputs of ``spec`` whose steps did not succeed (or are disabled): field ->
    {"step", "why": its status and the first line of its error or reason}."""
    found = {}
    for field_name, dep in spec.deps.items():
        outcome = outcomes[dep]
        if outcome.status.usable:
            continue
        why = "disabled" if outcome.parked else str(outcome.status)
        detail = (outcome.error or (outcome.reasons[0] if outcome.reasons else "")).strip().splitlines()
        found[field_name] = {"step": dep, "why": why + (f": {detail[0][:200]}" if detail and not outcome.parked else "")}
    return found


def plan_notes(outcomes: Mapping[str, Outcome], would_stop: str | None, built_before: Collection[str]) -> list[str]:
    """Where a build's counts may differ from a plan's: at the step that would stop it
    (which steps had started by then is timing), and below steps that will build (a
    rebuild that reproduces its output leaves the steps after it cached; only those built
    before, ``built_before``, can be)."""
    notes = []
    if would_stop is not None:
        if outcomes[would_stop].status == Status.FAILED:
            what, flags = "fails", "-k"
        else:
            what, flags = "cannot run here", "--skip-unavailable or -k"
        notes.append(f"{would_stop} {what}: without {flags}, the build stops there and skips the steps "
                     "not started by then")
    after = [sid for sid, o in outcomes.items()
             if o.key is None and o.status in (Status.WOULD_BUILD, Status.UNAVAILABLE) and sid in built_before]
    if after:
        notes.append(f"{len(after)} step{'s come' if len(after) > 1 else ' comes'} after steps that will "
                     "build: their keys are known only then, and any whose inputs come out unchanged "
                     "will be cached, not built")
    return notes
