"""Select measuring its candidates together (``measure = "together"``): each opened by the runtime
its benchmark used, on the shapes it recorded, and timed in rotating rounds (optbuild.model.race)
in a forked child (optbuild.model.runmodels), with more rounds while a lead is undecided. A
candidate that crashes onnxruntime is measured at a lower level, or raced without.
"""

from __future__ import annotations

import contextlib
import time
import typing
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from optbuild.common.errors import StepError, first_line
from optbuild.model.isolation import Stage, opened_stack
from optbuild.steps.base import StepContext

if typing.TYPE_CHECKING:
    from optbuild.backends.base import Backend, Manifest
    from optbuild.steps.select_params import SelectParams


def race_candidates(p: SelectParams, ctx: StepContext, rows: list[dict[str, Any]]
                    ) -> tuple[dict[str, Any] | None, dict[int, list[list[int]]]]:
    """Time ``rows`` together (optbuild.model.race), in a forked child (runmodels.run_models): a
    candidate that crashes onnxruntime at its default level is measured at a lower one, one
    that crashes at every level (or another runtime) is not measured and the rest race
    again. Each row gets its figures measured together and its level, or a rejection saying
    why it cannot be measured here. The race's settings, the load before and after, and the
    notes of crashes; the times per row index, per round."""
    from optbuild.backends import registry
    from optbuild.model import race
    from optbuild.model.runmodels import ModelsCrashed, run_models

    by_index = {row["index"]: row for row in rows}
    sides, names = {}, {}
    for row in rows:
        art = ctx.inputs[row["input"]]
        what = f"the candidate {art.step}"
        try:
            if art.primary is None:
                raise StepError(f"{what} gives no model")
            sides[row["index"]] = registry.for_artifact(art.primary, what)
            names[row["index"]] = what
        except StepError as exc:
            row["rejected"].append(f"not measured here: {exc}")
    while True:
        if not sides:
            return None, {}
        try:
            measured, levels, notes = run_models(
                partial(_measure, p, ctx, [by_index[i] for i in sides], sides),
                sides, names, "select")
            break
        except ModelsCrashed as exc:  # the others race without it
            if exc.side is None:
                raise
            by_index[exc.side]["rejected"].append(f"not measured here: {exc}")
            sides = {i: side for i, side in sides.items() if i != exc.side}
    for index, why in measured["rejected"].items():
        by_index[index]["rejected"].append(why)
    if measured["times"] is None:
        return None, {}
    for index, timed in measured["times"].items():
        row = by_index[index]
        row["together"] = {"runtime": measured["labels"][index], "level": levels[index], "threads": row["threads"],
                           **race.figures(timed, row["batch"])}
        row["figures"] = {k: row["together"][k] for k in ("p50_ms", "p90_ms", "throughput_per_s")} | {
            "size_bytes": row["benchmark"]["size_bytes"]}
    for note in notes:
        ctx.log(f"note: {note}")
    raced = list(measured["times"])
    open_leads = undecided(p, list(measured["times"].values()), [by_index[i]["batch"] for i in raced])
    settings = {"runs": p.runs, "rounds": p.rounds, "warmup": p.warmup, "order": "rotating",
                "min_lead": p.min_lead, "interval": race.CONFIDENCE, "max_seconds": p.max_seconds,
                "rounds_run": len(next(iter(measured["times"].values()))), "seconds": measured["seconds"],
                "undecided": [by_index[raced[i]]["step"] for i in open_leads],
                "load": measured["load"], "load_after": measured["after"], "notes": notes}
    return settings, measured["times"]

def _measure(p: SelectParams, ctx: StepContext, rows: list[dict[str, Any]],
             sides: Mapping[int, tuple[Backend, Manifest]], levels: Mapping[int, str | None],
             stage: Stage) -> dict[str, Any]:
    """``rows`` opened (onnxruntime's at ``levels``) and raced, with more rounds while a lead
    is undecided: per row index, a rejection or the runtime's label and the times per round;
    the seconds the race took, the load before and after. Run in a forked child: ``stage``
    says which candidate loads or runs, for a crash to be told."""
    from optbuild.model import race
    from optbuild.model.timing import busy_note, host_load, watch_load

    def on_round(r: int) -> None:
        ctx.progress(f"measuring round {r + 1} of {p.rounds}" if r < p.rounds else
                     f"measuring round {r + 1}: a lead is undecided (more rounds for up to {p.max_seconds:g} s)")

    rejected: dict[int, str] = {}
    with opened_stack() as stack:
        lanes = []
        for row in rows:
            try:
                stage((row["index"], "loading"))
                lanes.append((row["index"], _open(p, stack, ctx, row, sides[row["index"]],
                                                   levels[row["index"]], stage)))
            except StepError as exc:
                rejected[row["index"]] = f"not measured here: {exc}"
        if not lanes:
            return {"rejected": rejected, "times": None}
        ctx.log(f"measuring {len(lanes)} candidates together: {p.warmup} warm-up + {p.runs} timed runs each, "
                f"in {p.rounds} rounds, the order rotating" + (
                    f"; more rounds while a lead is undecided, for up to {p.max_seconds:g} s in all"
                    if p.objective != "size_bytes" and p.max_seconds else ""))
        stage("racing the candidates")
        batches = [next(r["batch"] for r in rows if r["index"] == index) for index, _ in lanes]
        with watch_load() as load:
            began = time.monotonic()
            raced = race.race([call for _, (call, _) in lanes], p.runs, p.rounds, p.warmup, on_round=on_round,
                              decided=lambda times: not undecided(p, times, batches),
                              max_seconds=p.max_seconds)
            seconds = round(time.monotonic() - began, 3)
        after = host_load()
        if (busy := busy_note(load)) is not None:
            ctx.log(f"note: {busy}")
    return {"rejected": rejected, "labels": {index: label for index, (_, label) in lanes},
            "times": {index: timed for (index, _), timed in zip(lanes, raced, strict=True)},
            "seconds": seconds, "load": load, "after": after}

def undecided(p: SelectParams, times: list[list[list[int]]], batches: list[int]) -> list[int]:
    """The raced candidates (positions in ``times``) whose lead against the fastest the
    rounds cannot decide yet (race.undecided); none where the objective is not a time."""
    from optbuild.model import race

    if p.objective == "size_bytes":
        return []
    return race.undecided(times, p.objective, batches, p.min_lead)

def _open(p: SelectParams, stack: contextlib.ExitStack, ctx: StepContext, row: dict[str, Any],
          side: tuple[Backend, Manifest], level: str | None, stage: Stage) -> tuple[Callable[[], object], str]:
    """A call that runs the candidate of ``row`` once on the shapes its benchmark
    measured, by the runtime its benchmark used (onnxruntime's at ``level``), and that
    runtime's label."""
    from optbuild.backends.base import TensorSpec
    from optbuild.model.runmodels import at_level, entered_runner
    from optbuild.model.samples import random_samples

    art = ctx.inputs[row["input"]]
    what = f"the candidate {art.step}"
    assert art.primary is not None
    if not row["shapes"]:
        raise StepError(f"the benchmark.json of {art.step} records no shapes (made before version 2): "
                        "rebuild it, or set measure = 'cached'")
    runner = entered_runner(stack, side, art.primary, ctx.host, what, threads=row["threads"], level=level)
    specs = [TensorSpec(name, s["dtype"], tuple(s["shape"])) for name, s in row["shapes"].items()]
    values = {name: decl.model_copy(update={"shape": None}) for name, decl in (p.inputs or {}).items()}
    feed = runner.cast(random_samples(specs, 1, p.seed, decls=values).feeds[0])
    call = runner.timed_call(feed)
    stage((row["index"], "running"))
    try:
        call()
    except Exception as exc:
        raise StepError(f"{what} fails on {runner.label}: {type(exc).__name__}: {first_line(exc)}") from None
    return call, at_level(runner.label, level)
