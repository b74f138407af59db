"""kind = "select": the best of several candidates on this host, as one step to depend on.

The candidates are ``benchmark`` steps (optbuild.steps.benchmark), each of which measured a
model and carries it, with its figures, the shapes it measured and its verify verdict, in
``benchmark.json``. A candidate is dropped when its verify step failed (``fail = false`` on a
verify records a failure instead of stopping the build) or when a figure misses a constraint
(``max_p50_ms``, ``min_throughput``, ``min_cosine``, ``max_size_mb``); the best of the rest by
the ``objective`` wins. The output is the winner's files (so downstream steps and deploy hosts
take "the best engine for this hardware" by one name) and ``selection.json`` /
``selection.txt``: every candidate, its figures, and why it won or lost. No candidate left
fails the step, with that table.

Like for like (``measure = "together"``, the default): a benchmark's figure is a fact about
the moment it was taken, and the benchmarks of a build ran minutes apart, under different
loads, some of them cached from another day. So select measures the candidates again,
together, in its own process (optbuild.model.race): each model opened by the runtime its
benchmark used (optbuild.backends.registry, with the benchmark's threads: not set, all cores), fed the shapes its
benchmark recorded (values as ``inputs`` and the recipe's ``[inputs.NAME]`` declare, from
``seed``), ``warmup`` untimed runs each, then ``runs`` timed runs each in ``rounds`` rounds,
every candidate taking its turn in each round in an order that rotates. The figures judged are
those; the benchmark's are shown beside them. A winner whose lead over another eligible
candidate could be noise (the 90 % interval of its per-round lead reaches below 1 +
``min_lead``) is tied with it, once more rounds, for up to ``max_seconds``, could not decide a
lead whose interval reaches above 1 + ``min_lead`` too. The tie goes to the smaller model (by more than 5 %), then to
the candidate listed first, among those measured within ``min_lead`` of the fastest; where
the fastest is alone there, to it: a lead measured at 1.50x whose interval reaches 1.03 on a
busy host could be noise, but the faster is still the better guess. A candidate this host cannot open is listed with why and not chosen.
The race runs in a forked child (optbuild.model.isolation): a candidate that crashes
onnxruntime (SIGSEGV, SIGBUS, SIGILL, SIGFPE) as it loads or first runs at onnxruntime's
default graph optimization level is measured at the next lower one ("all", "extended",
"basic", "disable"), the others keeping theirs, and a note says so; one that crashes at every
level, or in another runtime, is listed with why and the rest race without it. Each
candidate's level is recorded with its figures (``together.level``). The
objective ``size_bytes`` without a latency or throughput constraint measures nothing.
``measure = "cached"`` compares the benchmarks' own figures, ties being equal figures.

Because it measures, select is then bound to the host as benchmark is: its key holds what its
candidates' keys hold of the host and of the runtimes' versions, and it builds with nothing
beside it (``exclusive``). Its key holds the candidates' outputs, so a rebuilt candidate makes
it measure all of them again: a new model never races a stale figure. What is cached is the
verdict of a race on the same models and host.

``candidates = ["bench[*]"]`` takes every instance of a matrix step. A candidate that could not
run here (unavailable, failed, or skipped behind one that did) does not stop the choice: select
runs while one candidate succeeded, and the table lists the others with why
(``Step.partial_inputs``). Its key names them, so a candidate that later runs selects again.
"""

from __future__ import annotations

import contextlib
import json
import time
import typing
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal

from pydantic import Field, model_validator

from optbuild.common.errors import StepError, first_line
from optbuild.common.recipetable import StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs, inputs_field, narrowed
from optbuild.model.isolation import Stage
from optbuild.steps import fields
from optbuild.steps.base import ONNX_TOOLS, Artifact, Step, StepContext, StepParams, link_files

if typing.TYPE_CHECKING:
    from optbuild.backends.base import Backend, Manifest
    from optbuild.common.fingerprint import Fingerprint

# 2: figures measured together, with their spread, the load and the leads; 3: each candidate's
# level measured together (onnxruntime's graph optimization level), the race's notes (a level
# that crashed, measured lower); 4: more rounds while a lead is undecided (rounds_run, seconds,
# max_seconds, undecided), each candidate's threads; verify's cosine the worst part's
REPORT_VERSION = 4
OBJECTIVES = {  # what is better: lower or higher
    "p50_ms": min, "p90_ms": min, "throughput_per_s": max, "size_bytes": min,
}


class SelectParams(StepParams):
    candidates: list[StepRef] = Field(min_length=1, examples=[["bench[*]"]])
    """The benchmark steps to choose among, in order of preference for ties; 'NAME[*]' stands
    for every instance of a matrix step."""
    objective: Literal["p50_ms", "p90_ms", "throughput_per_s", "size_bytes"] = Field(
        "p50_ms", examples=["throughput_per_s"])
    """What makes a candidate best: the lowest p50 or p90 latency, the highest throughput, or
    the smallest model."""
    max_p50_ms: float | None = Field(None, gt=0, examples=[5.0])
    """Drop candidates whose p50 latency is above this (ms)."""
    min_throughput: float | None = Field(None, gt=0, examples=[200.0])
    """Drop candidates that run fewer inferences per second."""
    min_cosine: float | None = Field(None, ge=-1, le=1, examples=[0.99])
    """Drop candidates whose verify step measured a lower cosine similarity (the worst output,
    or part of one: a detector's class scores, see verify's slices), and those without a verify
    step."""
    max_size_mb: float | None = Field(None, gt=0, examples=[50.0])
    """Drop candidates whose model files are larger (MiB)."""
    measure: Literal["together", "cached"] = Field("together", examples=["cached"])
    """'together': measure the candidates again, together in this step, interleaved in rounds,
    and judge by those figures (a lead within the noise is a tie); the step is then bound to
    this host like a benchmark. 'cached': judge by the figures each benchmark step took when
    it ran (for candidates that cannot all run on one host)."""
    runs: int = Field(50, ge=1, examples=[200])
    """Timed inferences per candidate when measuring together, split over the rounds."""
    rounds: int = Field(10, ge=3, examples=[20])
    """Rounds when measuring together: in each, every candidate runs its share of the runs in
    turn, the order rotating each round; the noise of a lead is judged over them."""
    warmup: int = Field(5, ge=0, examples=[20])
    """Untimed inferences per candidate before the rounds."""
    max_seconds: float = Field(30.0, ge=0, examples=[120.0])
    """When measuring together: where the rounds leave a lead undecided (its interval reaches
    below and above 1 + min_lead: 0.62-1.58x on a loaded host), more rounds are measured, all
    candidates in turn, until every lead is decided or the rounds have taken this many seconds;
    only then is such a lead a tie. The first `rounds` always run in full. 0: no more rounds."""
    min_lead: float = Field(0.03, ge=0, examples=[0.05])
    """A lead by less than this fraction (0.03: 3 %) is a tie even when it is beyond the noise:
    smaller than what a host drifts between builds."""
    seed: int = fields.seed_field(note=" The shapes are those each candidate's benchmark recorded; "
                                       "values as declared, else as the benchmark draws them.")
    inputs: StepInputs = inputs_field(" Only values (range, values) are taken from it: the shapes are "
                                      "the benchmarks'.", example={"tokens": {"range": [0, 30521]}})

    def inputs_read(self) -> InputDecls | None:
        """Values only: the shapes timed are those the benchmarks recorded."""
        return narrowed(self.inputs, ("dtype", "range", "values"))

    @model_validator(mode="after")
    def _rounds_filled(self) -> SelectParams:
        if self.runs < self.rounds:
            raise ValueError(f"runs ({self.runs}) < rounds ({self.rounds}): every round times each candidate "
                             "at least once")
        return self


class Select(Step[SelectParams]):
    """The best candidate that meets the constraints, measured together, and a report of the choice.

    The tie rule, measuring together: the fastest by the objective wins unless its lead over
    another candidate could be noise, that is unless the 90 % interval of the lead, from the
    ratio of their times in each round, reaches below 1 + `min_lead`. Those candidates are tied
    with it. Among the tied, only those measured within `min_lead` of the fastest count as
    equal; the tie goes to the smallest of them (smaller by more than 5 %), else to the one
    listed first in `candidates`. Where the fastest is alone within `min_lead`, it wins.

    A lead is called a tie only once more rounds cannot decide it: where, after `rounds`, the
    interval of a lead over the fastest reaches both below and above 1 + `min_lead` (0.62-1.58x
    on a loaded host, for a static INT8 that quiet rounds measured 1.5x faster), select measures
    more rounds, all candidates in turn, until every such lead is beyond the noise or within
    `min_lead` throughout, or the rounds have taken `max_seconds`. selection.json
    records the rounds run and the seconds (`race.rounds_run`, `race.seconds`), and the leads
    still undecided when the time ran out (`race.undecided`), which selection.txt notes.

    Each candidate runs on the threads its benchmark ran on (its `threads`; not set: the
    runtime's default, all the host's cores), which the table shows ("all"), and its cosine
    column is its verify step's worst cosine, of an output or of a part of one (a detector's
    class scores), the figure `min_cosine` is checked against.

    A worked example: `candidates = ["bench_fp32", "bench_int8", "bench_ov"]`, `runs = 5`,
    `rounds = 5` (one timed run per candidate a round), `min_lead = 0.03`, objective p50_ms.

    | ms in round | 1 | 2 | 3 | 4 | 5 | p50 | model |
    |---|---|---|---|---|---|---|---|
    | bench_fp32 | 10.0 | 10.4 | 9.9 | 10.6 | 10.1 | 10.1 ms | 42.0 MiB |
    | bench_int8 | 10.2 | 10.1 | 10.3 | 10.9 | 10.4 | 10.3 ms | 10.7 MiB |
    | bench_ov | 12.6 | 12.9 | 12.4 | 13.3 | 12.7 | 12.7 ms | 42.1 MiB |

    1. The fastest is bench_fp32 (10.1 ms).
    2. Its lead over bench_int8 is 10.3 / 10.1 = 1.02x; the ratios of the rounds (1.02, 0.97,
       1.04, 1.03, 1.03) give the interval 0.99-1.04x (Student's t over their logs). It
       reaches below 1.03: tied. Over bench_ov: 1.26x, interval 1.25-1.26x: not tied.
    3. bench_int8 was measured within 3 % of the fastest (1.02 <= 1.03): the two are equal.
    4. bench_int8's model is the smaller by more than 5 %: it is chosen, "tied within the noise
       with bench_fp32, broken by the smaller model". bench_ov's row says "the winner is 1.23x
       faster (interval 1.21-1.26x)".

    Had bench_int8's model been 42.0 MiB too (within 5 %, as an onnxruntime engine of the
    fp32 model is), the tie would go to bench_fp32, listed first ("the one listed first").
    Had bench_int8 run 15.0, 8.3, 19.0, 15.0, 16.0 ms instead, the lead would be 1.49x with
    the interval 1.01-1.90x: a tie (round 2 says bench_int8 could be the faster), but it was
    measured more than 3 % slower, so bench_fp32 is chosen ("the faster as measured"). With
    `measure = "cached"`, only equal figures tie.
    """

    Params = SelectParams
    primary_output = None  # the winner's main file; known once bound (see bind)
    partial_inputs = True
    preload = ONNX_TOOLS
    # 2: candidates measured together; host-bound when measuring; 3: more rounds while a lead is
    # undecided, threads in the report
    version = "3"

    rivals: tuple[Step, ...] = ()  # the candidate steps (see bind)

    def bind(self, upstream: Mapping[str, Step]) -> None:
        """The winner's main file is the candidates' one, when they agree on its name; the
        candidates' steps say what a measurement here depends on."""
        self.rivals = tuple(step for name, step in upstream.items() if name.startswith("candidates."))
        primaries = {step.primary_output for step in self.rivals}
        self.primary_output = primaries.pop() if len(primaries) == 1 else None

    def measures(self) -> bool:
        """Whether this step times the candidates: a figure of time decides."""
        p = self.params
        return p.measure == "together" and (
            p.objective != "size_bytes" or p.max_p50_ms is not None or p.min_throughput is not None)

    @property
    def exclusive(self) -> bool:  # type: ignore[override]  # an instance property over Step's class attribute
        return self.measures()  # timings taken beside other builds would measure those

    def tool_names(self) -> tuple[str, ...]:
        if not self.measures():
            return ()
        return tuple(dict.fromkeys(name for step in self.rivals for name in step.tool_names()))

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        """When measuring: what the candidates' keys hold of the host (a benchmark's runtime
        fields and the CPU's or GPU's model), all together."""
        if not self.measures():
            return {}
        return {name: value for step in self.rivals for name, value in step.host_key(host).items()}

    def unavailable(self, host: Fingerprint) -> str | None:
        if not self.measures() or not self.rivals:
            return None
        reasons = [step.unavailable(host) for step in self.rivals]
        if all(reasons):
            return "no candidate can be measured on this host: " + "; ".join(dict.fromkeys(r for r in reasons if r))
        return None

    def run(self, ctx: StepContext) -> None:
        p = self.params
        rows = [_row(name, art) for name, art in ctx.inputs.items()]
        for row in rows:
            row["rejected"] = self._checks(row)
        race: dict[str, Any] | None = None
        times: dict[int, list[list[int]]] = {}
        if self.measures():
            for row in rows:
                row["figures"] = None  # until measured together
            race, times = self._race(ctx, [r for r in rows if not r["rejected"]])
        for row in rows:
            if row["figures"] is not None:
                row["rejected"] += self._limits(row["figures"])
        rows = sorted(rows + [_absent(name, entry) for name, entry in ctx.missing.items()], key=lambda r: r["index"])
        eligible = [r for r in rows if not r["rejected"]]
        report: dict[str, Any] = {
            "format": "optbuild.selection", "version": REPORT_VERSION, "objective": p.objective,
            "measure": "together" if self.measures() else "cached",
            "constraints": {k: v for k, v in p.model_dump().items()
                            if k in ("max_p50_ms", "min_throughput", "min_cosine", "max_size_mb") and v is not None},
            "race": race, "candidates": rows, "chosen": None, "tie": None,
        }
        if eligible:
            winner = self._decide(eligible, times, report)
        text = _table(report)
        ctx.log(text)
        if not eligible:
            raise StepError(f"no candidate meets the constraints:\n{text}")
        chosen = ctx.inputs[winner["input"]]
        link_files({n: f for n, f in chosen.files.items() if n != "benchmark.json"}, ctx.out_dir)
        (ctx.out_dir / "selection.json").write_text(json.dumps(report, indent=1) + "\n")
        (ctx.out_dir / "selection.txt").write_text(text + "\n")
        ctx.metrics.update(chosen=winner["step"], candidates=len(rows), eligible=len(eligible),
                           tie=report["tie"] is not None, **{p.objective: winner["figures"][p.objective]})

    # --- measuring --------------------------------------------------------------------
    def _race(self, ctx: StepContext, rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None,
                                                                          dict[int, list[list[int]]]]:
        """Time ``rows`` together (optbuild.model.race), in a forked child (runmodels.run_models): a
        candidate that crashes onnxruntime at its default level is measured at a lower one, one
        that crashes at every level (or another runtime) is not measured and the rest race
        again. Each row gets its figures measured together and its level, or a rejection saying
        why it cannot be measured here. The race's settings, the load before and after, and the
        notes of crashes; the times per row index, per round."""
        from optbuild.backends import registry
        from optbuild.model import race
        from optbuild.model.runmodels import ModelsCrashed, run_models

        p = self.params
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
                    partial(self._measure, ctx, [by_index[i] for i in sides], sides),
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
        open_leads = self._undecided(list(measured["times"].values()), [by_index[i]["batch"] for i in raced])
        settings = {"runs": p.runs, "rounds": p.rounds, "warmup": p.warmup, "order": "rotating",
                    "min_lead": p.min_lead, "interval": race.CONFIDENCE, "max_seconds": p.max_seconds,
                    "rounds_run": len(next(iter(measured["times"].values()))), "seconds": measured["seconds"],
                    "undecided": [by_index[raced[i]]["step"] for i in open_leads],
                    "load": measured["load"], "load_after": measured["after"], "notes": notes}
        return settings, measured["times"]

    def _measure(self, ctx: StepContext, rows: list[dict[str, Any]], sides: Mapping[int, tuple[Backend, Manifest]],
                 levels: Mapping[int, str | None], stage: Stage) -> dict[str, Any]:
        """``rows`` opened (onnxruntime's at ``levels``) and raced, with more rounds while a lead
        is undecided: per row index, a rejection or the runtime's label and the times per round;
        the seconds the race took, the load before and after. Run in a forked child: ``stage``
        says which candidate loads or runs, for a crash to be told."""
        from optbuild.model import race
        from optbuild.model.timing import busy_note, host_load, watch_load

        p = self.params

        def on_round(r: int) -> None:
            ctx.progress(f"measuring round {r + 1} of {p.rounds}" if r < p.rounds else
                         f"measuring round {r + 1}: a lead is undecided (more rounds for up to {p.max_seconds:g} s)")

        rejected: dict[int, str] = {}
        with contextlib.ExitStack() as stack:
            lanes = []
            for row in rows:
                try:
                    stage((row["index"], "loading"))
                    lanes.append((row["index"], self._open(stack, ctx, row, sides[row["index"]],
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
                                  decided=lambda times: not self._undecided(times, batches),
                                  max_seconds=p.max_seconds)
                seconds = round(time.monotonic() - began, 3)
            after = host_load()
            if (busy := busy_note(load)) is not None:
                ctx.log(f"note: {busy}")
        return {"rejected": rejected, "labels": {index: label for index, (_, label) in lanes},
                "times": {index: timed for (index, _), timed in zip(lanes, raced, strict=True)},
                "seconds": seconds, "load": load, "after": after}

    def _undecided(self, times: list[list[list[int]]], batches: list[int]) -> list[int]:
        """The raced candidates (positions in ``times``) whose lead against the fastest the
        rounds cannot decide yet (race.undecided); none where the objective is not a time."""
        from optbuild.model import race

        p = self.params
        if p.objective == "size_bytes":
            return []
        return race.undecided(times, p.objective, batches, p.min_lead)

    def _open(self, stack: contextlib.ExitStack, ctx: StepContext, row: dict[str, Any],
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
        values = {name: decl.model_copy(update={"shape": None}) for name, decl in (self.params.inputs or {}).items()}
        feed = runner.cast(random_samples(specs, 1, self.params.seed, decls=values).feeds[0])
        call = runner.timed_call(feed)
        stage((row["index"], "running"))
        try:
            call()
        except Exception as exc:
            raise StepError(f"{what} fails on {runner.label}: {type(exc).__name__}: {first_line(exc)}") from None
        return call, at_level(runner.label, level)

    # --- judging ----------------------------------------------------------------------
    def _checks(self, row: dict[str, Any]) -> list[str]:
        """Why the candidate is dropped whatever its speed: its verify, cosine and size."""
        p, verify, size = self.params, row["verify"], row["benchmark"]["size_bytes"]
        why = []
        if verify is not None and not verify.get("passed", False):
            why.append("its verify step failed")
        if p.max_size_mb is not None and size > p.max_size_mb * (1 << 20):
            why.append(f"size {size / (1 << 20):.2f} MiB > {p.max_size_mb}")
        if p.min_cosine is not None:
            cosine = None if verify is None else verify.get("cosine")
            if cosine is None:
                why.append("no verify cosine to check min_cosine against")
            elif cosine < p.min_cosine:
                why.append(f"cosine {cosine:.6f} < {p.min_cosine}")
        return why

    def _limits(self, figures: dict[str, float]) -> list[str]:
        """Why the candidate is dropped for its speed, by the figures judged."""
        p, why = self.params, []
        if p.max_p50_ms is not None and figures["p50_ms"] > p.max_p50_ms:
            why.append(f"p50 {figures['p50_ms']:.3f} ms > {p.max_p50_ms}")
        if p.min_throughput is not None and figures["throughput_per_s"] < p.min_throughput:
            why.append(f"throughput {figures['throughput_per_s']:.1f}/s < {p.min_throughput}")
        return why

    def _decide(self, eligible: list[dict[str, Any]], times: dict[int, list[list[int]]],
                report: dict[str, Any]) -> dict[str, Any]:
        """The winner among ``eligible``, each row's verdict, and the tie when there is one.
        Measured together: the best, and every candidate whose lead it may not beat beyond the
        noise, are tied. Cached: equal figures are tied. A tie goes to the smaller model (by more
        than SIZE_MARGIN), then to the candidate listed first, among those measured within
        ``min_lead`` of the best; where the best is alone there, to it (the faster as measured)."""
        from optbuild.model import race

        p, objective = self.params, self.params.objective
        best = OBJECTIVES[objective](r["figures"][objective] for r in eligible)
        fastest = next(r for r in eligible if r["figures"][objective] == best)

        def lead(winner: dict[str, Any], other: dict[str, Any]) -> race.Lead:
            return race.lead(times[winner["index"]], times[other["index"]], objective,
                             (winner["batch"], other["batch"]))

        if times:
            behind = {r["index"]: lead(fastest, r) for r in eligible if r is not fastest}  # each by the fastest
            tied = [r for r in eligible if r is fastest or behind[r["index"]].within(p.min_lead)]
            # as fast as measured: a 1.50x lead whose interval reaches 1.03 on a noisy host is
            # a tie, but the faster is still the better guess; size decides among the equal only
            level = [r for r in tied if r is fastest or behind[r["index"]].ratio <= 1 + p.min_lead]
        else:
            tied = level = [r for r in eligible if r["figures"][objective] == best]
        smallest = min(r["figures"]["size_bytes"] for r in level)
        as_small = [r for r in level if r["figures"]["size_bytes"] <= smallest * SIZE_MARGIN]
        winner = min(as_small, key=lambda r: r["index"])
        report["chosen"] = winner["step"]
        others = [r for r in tied if r is not winner]
        if others:
            rule = ("the faster as measured" if len(level) == 1 else
                    "the smaller model" if len(as_small) == 1 else "the one listed first")
            report["tie"] = {"with": [r["step"] for r in others], "broken_by": rule}
        for row in eligible:
            winning = lead(winner, row) if times and row is not winner else None
            row["winner_lead"] = winning.as_json() if winning else None
            if row is winner:
                row["why"] = "chosen" + (f": tied{' within the noise' if times else ''} with {', '.join(report['tie']['with'])}, "
                                         f"broken by {report['tie']['broken_by']}" if others else "")
            elif row in tied:  # judged against the fastest, as the tie was
                if not times:
                    row["why"] = "tied with the winner"
                elif row is fastest:
                    row["why"] = f"the fastest, tied with the winner within the noise ({lead(row, winner)})"
                else:
                    row["why"] = f"tied with the fastest, {fastest['step']}, within the noise ({behind[row['index']]})"
                row["why"] += f"; the tie goes to {report['tie']['broken_by']}"
            else:
                row["why"] = f"{objective} {row['figures'][objective]:g}" + (
                    f": the winner is {winning.ratio:.2f}x faster (interval {winning.low:.2f}-{winning.high:.2f}x)"
                    if winning else "")
        return winner


# A tie goes to the smaller model only when it is smaller by more than this; within it (an
# onnxruntime-optimized copy 20 KB off its 109 MB source), to the candidate listed first.
SIZE_MARGIN = 1.05


def _index(name: str) -> int:
    return int(name.rpartition(".")[2])


def _absent(name: str, missing: dict[str, str]) -> dict[str, Any]:
    """A candidate whose step did not succeed (``StepContext.missing``: its step and why)."""
    return {"index": _index(name), "input": name, "step": missing["step"], "runtime": None,
            "figures": None, "benchmark": None, "together": None, "winner_lead": None, "shapes": None,
            "verify": None, "rejected": [missing["why"]], "why": None}


def _row(name: str, artifact: Artifact) -> dict[str, Any]:
    """A candidate as the report shows it, from its benchmark.json: ``benchmark`` its figures
    as the benchmark measured them, ``figures`` those judged (the same, until measured
    together), ``shapes`` the inputs it measured."""
    path = artifact.files.get("benchmark.json")
    if path is None:
        raise StepError(f"candidate {artifact.step} has no benchmark.json: candidates must be benchmark steps")
    try:
        report = json.loads(path.read_text())
        figures = {k: float(report[k]) for k in OBJECTIVES}
    except (ValueError, KeyError, TypeError) as exc:
        raise StepError(f"candidate {artifact.step}: unreadable benchmark.json ({exc})") from None
    return {"index": _index(name), "input": name, "step": artifact.step, "runtime": report.get("runtime"),
            "figures": figures, "benchmark": dict(figures), "together": None, "winner_lead": None,
            "shapes": report.get("inputs"),
            "batch": int(report.get("batch") or 1), "threads": report.get("threads"),
            "verify": report.get("verify"), "rejected": [], "why": None}


def _more_rounds(race: dict[str, Any]) -> str:
    """What the header says of the rounds measured past ``rounds`` while a lead was undecided."""
    more = race["rounds_run"] - race["rounds"]
    return f" + {more} more while a lead was undecided ({race['seconds']:g} s in all)" if more > 0 else ""


def _table(report: dict[str, Any]) -> str:
    """selection.txt: per candidate the figures judged, the threads it ran on ("all": the
    runtime's default, all cores), its worst verify cosine (of an output or part), and when
    measured together their spread (p10-p90), the benchmark's p50 beside them and how much
    faster the winner is."""
    from optbuild.model.timing import busy_note

    together = report["measure"] == "together"
    head = f"select by {report['objective']}"
    if race := report["race"]:
        load = race["load"]
        others = f", other processes {load['others_cpu']:.0%} of them" if load.get("others_cpu") is not None else ""
        head += (f", measured together: {race['runs']} runs each in {race['rounds']} rounds{_more_rounds(race)}, "
                 f"order rotating, load average {load['load_average']} on {load['cpu_count']} CPUs{others}")
    elif together:
        head += ", measured together: no candidate could be measured"
    else:
        head += ", by the benchmarks' figures"
    if report["constraints"]:
        head += f", constraints {report['constraints']}"
    # real models raced at load 4 on 2 CPUs: a 1.24x lead that measured 0.99x on a quiet host
    if race and (busy := busy_note(race["load"])) is not None:
        head += f"\nnote: {busy}; a lead measured so may not hold on a quiet host"
    if race and race["undecided"]:
        head += (f"\nnote: after {race['rounds_run']} rounds in {race['seconds']:g} s (max_seconds {race['max_seconds']:g})"
                 f" the lead over {', '.join(race['undecided'])} is still undecided: judged a tie; a larger max_seconds, "
                 "or a quieter host, may decide it")
    if report["tie"]:
        head += f"\ntie{' within the noise' if race else ''}, broken by {report['tie']['broken_by']}"
    columns = [("candidate", 32), ("p50 ms", 9)] + ([("p10-p90 ms", 17)] if together else []) + [
        ("thr/s", 9), ("threads", 7)] + ([("bench p50", 9), ("won by", 9)] if together else []) + [
        ("MiB", 7), ("cosine", 9)]
    lines = [head, " ".join(f"{name:{width}}" if i == 0 else f"{name:>{width}}"
                            for i, (name, width) in enumerate(columns)) + "  verdict"]
    for row in report["candidates"]:
        f, measured, verify = row["figures"], row["together"], row["verify"] or {}
        cosine = verify.get("cosine")
        cells = [f"{'*' if row['step'] == report['chosen'] else ' '}{row['step']}"]
        cells.append("-" if f is None else f"{f['p50_ms']:.3f}")
        if together:
            cells.append(f"{measured['p10_ms']:.3f}-{measured['p90_ms']:.3f}" if measured else "-")
        cells.append("-" if f is None else f"{f['throughput_per_s']:.1f}")
        cells.append("-" if row["benchmark"] is None else str(row["threads"] or "all"))
        if together:
            lead = row["winner_lead"]
            cells.append("-" if row["benchmark"] is None else f"{row['benchmark']['p50_ms']:.3f}")
            cells.append(f"{lead['ratio']:.2f}x" if lead else "-")
        cells.append("-" if row["benchmark"] is None else f"{row['benchmark']['size_bytes'] / (1 << 20):.2f}")
        cells.append("-" if cosine is None else f"{cosine:.6f}")
        verdict = "; ".join(row["rejected"]) if row["rejected"] else (row["why"] or "")
        lines.append(" ".join(f"{cell:{width}}" if i == 0 else f"{cell:>{width}}"
                              for i, (cell, (_, width)) in enumerate(zip(cells, columns, strict=True))) + "  " + verdict)
    if levels := [f"{row['step']} {row['together']['level']}" for row in report["candidates"]
                  if row["together"] and row["together"].get("level")]:
        lines.append(f"measured at onnxruntime graph optimization level: {', '.join(levels)}")
    lines += [f"note: {note}" for note in (race or {}).get("notes") or []]
    return "\n".join(lines)
