"""Building what a bench measures (or, with --no-build, only restoring it), and reading the
figures of the verify steps that checked it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.app.bench.results import BenchError, BenchOptions
from optbuild.builder.status import Status
from optbuild.model import thresholds

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.builder.outcome import Outcome
    from optbuild.builder.report import Reporter


# --- building --------------------------------------------------------------------------------
def build_models(ws: Workspace, models: list[str], verifies: list[str], options: BenchOptions,
                 reporter: Reporter | None) -> tuple[dict[str, Outcome], dict[str, str]]:
    """Build (or restore) the models and their verify steps: (outcomes, verify step -> note
    for those that gave no report)."""
    from optbuild import api
    from optbuild.builder.report import Reporter

    result = api.build(ws, [*models, *verifies], reporter=reporter or Reporter(), keep_going=True,
                       fetch_only=not options.build)
    outcomes = result.outcomes
    needed = ws.graph.select(models)
    missing = [sid for sid in needed if outcomes.get(sid) is not None and outcomes[sid].status == Status.WOULD_BUILD]
    if missing:
        listed = "\n".join(f"  {sid}" + (f"  ({'; '.join(outcomes[sid].reasons)})" if outcomes[sid].reasons else "")
                           for sid in missing)
        raise BenchError(f"--no-build: {len(missing)} step(s) the bench needs are in neither the local nor "
                         f"the remote cache:\n{listed}\ndrop --no-build to build them here, or build them first "
                         f"(optbuild build {' '.join(models)})")
    problems = []
    for sid in models:
        outcome = outcomes.get(sid)
        if outcome is None or not outcome.status.ok:
            status = outcome.status if outcome is not None else "not built"
            error = (outcome.error or "").strip() if outcome is not None else ""
            if not error and outcome is not None and outcome.status == Status.SKIPPED:
                error = "an upstream step failed"
            problems.append(f"{sid} is {status}" + (f": {error}" if error else ""))
    if problems:
        raise BenchError("cannot bench what did not build:\n" + "\n".join(problems))
    notes = {}
    for sid in verifies:
        outcome = outcomes.get(sid)
        if outcome is None or not outcome.status.ok:
            status = str(outcome.status) if outcome is not None else "not built"
            what = {str(Status.FAILED): "failed (a threshold is exceeded or it could not run: see the build output)",
                    str(Status.WOULD_BUILD): "is not built (--no-build)"}.get(status, f"is {status}")
            notes[sid] = f"{sid} {what}: no verify figures from it"
    return outcomes, notes


def artifact_path(ws: Workspace, sid: str, outcome: Outcome) -> Path:
    """The model file a built step left in its folder of the build folder."""
    folder = ws.project.step_dir(sid)
    primary = outcome.entry.primary if outcome.entry is not None else None
    path = folder / primary if primary else None
    if path is None or not path.is_file():
        raise BenchError(f"{sid} has no model file in {folder}")
    return path


def verify_figures(ws: Workspace, sid: str, outcome: Outcome) -> dict[str, Any] | None:
    """The figures of a verify step's report.json: worst over outputs and the parts of outputs
    its thresholds judge (optbuild.model.thresholds.worst), and per output."""
    primary = outcome.entry.primary if outcome.entry is not None else None
    path = ws.project.step_dir(sid) / (primary or "report.json")
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    outputs = report.get("outputs") or {}

    def worst(metric: str) -> float | None:  # over outputs and their checked parts (a detector's scores)
        found = thresholds.worst(outputs, metric)
        return None if found is None else found[0]

    return {
        "step": sid, "reference": ws.project.steps[sid].deps.get("reference"),  # the report names files, not steps
        "cosine": worst("cosine"), "max_abs": worst("max_abs"), "top1": worst("top1"),
        "passed": report.get("passed"), "samples": (report.get("data") or {}).get("samples"),
        "data": (report.get("data") or {}).get("source"),
        "outputs": {name: {k: f.get(k) for k in ("cosine", "cosine_min", "max_abs", "max_rel", "top1")}
                    for name, f in outputs.items()},
    }
