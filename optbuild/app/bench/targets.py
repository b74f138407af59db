"""What to bench: the steps whose models a backend runs on this host, the verify steps that
checked them, and how each model is labelled."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from optbuild.app.bench.results import BenchError

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.backends.base import Backend, Manifest
    from optbuild.common.fingerprint import Fingerprint
    from optbuild.project.recipe import StepSpec


# --- what to bench -------------------------------------------------------------------------
def runs_on(spec: StepSpec) -> tuple[Backend, Manifest] | None:
    """What runs the step's main output (optbuild.backends.registry); None: not a model."""
    from optbuild.backends import registry

    return registry.for_step(spec.step)


def not_benched(spec: StepSpec, host: Fingerprint) -> str | None:
    """Why bench cannot run the step's output on this host; None when it can."""
    if spec.step.carries_model:
        return "carries the model of the step it measured or chose"
    on = runs_on(spec)
    if on is None:
        return "no model output"
    backend, manifest = on
    return backend.unavailable(host, manifest)


def _refusal(spec: StepSpec, why: str) -> str:
    """Why a step named as a target cannot be benched, and what to bench instead."""
    if spec.step.carries_model:
        return f"{spec.id} is a {spec.kind} step: it {why}; bench that step, or the recipe"
    on = runs_on(spec)
    if on is None:
        return (f"{spec.id} is a {spec.kind} step: its output ({spec.step.primary_output or 'no file'}) is "
                "not a model a backend runs; bench takes steps that give models (onnx, export, simplify, "
                "quantize, engine) or a recipe")
    source = spec.deps.get("input")
    hint = f"; bench the model it is built from ({source})" if source else ""
    return (f"{spec.id} is a {on[0].label} engine ({spec.step.primary_output}) and this host cannot run it: "
            f"{why}{hint}")


def select(ws: Workspace, targets: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(recipe -> model steps to bench, recipe -> notes on the steps skipped), in graph order."""
    if not targets:
        raise BenchError("name a recipe or a recipe:step to bench")
    steps = ws.project.steps
    wanted: set[str] = set()
    skipped: dict[str, dict[str, list[str]]] = {}
    host = host_fingerprint()
    for text in targets:
        target = ws.graph.target(text)  # "unknown target ...; did you mean ...?"
        if not target.recipe:  # each step named must be benched
            for sid in target.steps:
                if (why := not_benched(steps[sid], host)) is not None:
                    raise BenchError(_refusal(steps[sid], why))
            wanted.update(target.steps)
            continue
        found = False
        for sid in target.steps:
            spec = steps[sid]
            if (why := not_benched(spec, host)) is None:
                wanted.add(sid)
                found = True
            else:
                if not spec.step.carries_model and (on := runs_on(spec)) is not None:
                    why = f"{on[0].label} engines: {why}"  # this host cannot run them
                skipped.setdefault(text, {}).setdefault(why, []).append(spec.name)
        if not found:
            raise BenchError(f"recipe {text!r} has no step that gives a model this host can run")
    chosen: dict[str, list[str]] = {}
    for sid in ws.graph.order:
        if sid in wanted:
            chosen.setdefault(steps[sid].recipe, []).append(sid)
    notes = {recipe: [f"not benched ({why}): {', '.join(names)}" for why, names in by_reason.items()]
             for recipe, by_reason in skipped.items() if recipe in chosen}
    return chosen, notes


def verify_steps(ws: Workspace, models: list[str]) -> dict[str, list[str]]:
    """model step -> the steps that check it (verify: ``Step.checks_model``)."""
    found: dict[str, list[str]] = {}
    for sid in ws.graph.order:
        spec = ws.project.steps[sid]
        field = spec.step.checks_model
        if field is not None and (checked := spec.deps.get(field)) in models:
            found.setdefault(checked, []).append(sid)
    return found


# --- labels ----------------------------------------------------------------------------------
def precision(ws: Workspace, sid: str, _seen: frozenset[str] = frozenset()) -> str:
    """What a model computes in, as its step decides it (``Step.precision``: a quantize step's
    mode, an engine's precision), else as the model it came from."""
    spec = ws.project.steps[sid]
    chosen = spec.step.precision()
    if chosen is not None and chosen != "fp32":
        return chosen.upper() if chosen.startswith("int") else chosen
    source = spec.deps.get("input")
    if source is not None and source not in _seen and source in ws.project.steps:
        return precision(ws, source, _seen | {sid})
    return "fp32"


def label(ws: Workspace, sid: str, backend: Backend) -> str:
    """"ORT static INT8", "OV INT8": the backend and the precision. An engine built for the
    runtime that also runs the model it came from (onnxruntime's offline-optimized model) is
    told apart from that model as "ORT-optimized"."""
    spec = ws.project.steps[sid]
    source = ws.project.steps.get(spec.deps.get("input", ""))
    same = spec.step.builds_engine and source is not None and (on := runs_on(source)) is not None \
        and on[0].name == backend.name
    return f"{backend.short}{'-optimized' if same else ''} {precision(ws, sid)}"


@cache
def host_fingerprint() -> Fingerprint:
    """This host, as the backends judge whether they can run here."""
    from optbuild.common.fingerprint import Fingerprint

    return Fingerprint()
