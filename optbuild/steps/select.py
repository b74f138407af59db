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

This module is the step: what its key holds, and the report it assembles. Its parameters
live in ``select_params``, the race in ``select_race``, the constraints and the tie rule in
``select_rule``, and selection.txt in ``select_table``.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Any

from optbuild.common.errors import StepError
from optbuild.steps.base import ONNX_TOOLS, Artifact, Step, StepContext, link_files
from optbuild.steps.select_params import SelectParams
from optbuild.steps.select_race import race_candidates
from optbuild.steps.select_rule import OBJECTIVES, decide, over_limits, rejections
from optbuild.steps.select_table import table

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

# 2: figures measured together, with their spread, the load and the leads; 3: each candidate's
# level measured together (onnxruntime's graph optimization level), the race's notes (a level
# that crashed, measured lower); 4: more rounds while a lead is undecided (rounds_run, seconds,
# max_seconds, undecided), each candidate's threads; verify's cosine the worst part's
REPORT_VERSION = 4


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
    carries_model = True  # its model is a copy of the one it chose
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
            row["rejected"] = rejections(p, row)
        race: dict[str, Any] | None = None
        times: dict[int, list[list[int]]] = {}
        if self.measures():
            for row in rows:
                row["figures"] = None  # until measured together
            race, times = race_candidates(p, ctx, [r for r in rows if not r["rejected"]])
        for row in rows:
            if row["figures"] is not None:
                row["rejected"] += over_limits(p, row["figures"])
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
            winner = decide(p, eligible, times, report)
        text = table(report)
        ctx.log(text)
        if not eligible:
            raise StepError(f"no candidate meets the constraints:\n{text}")
        chosen = ctx.inputs[winner["input"]]
        link_files({n: f for n, f in chosen.files.items() if n != "benchmark.json"}, ctx.out_dir)
        (ctx.out_dir / "selection.json").write_text(json.dumps(report, indent=1) + "\n")
        (ctx.out_dir / "selection.txt").write_text(text + "\n")
        ctx.metrics.update(chosen=winner["step"], candidates=len(rows), eligible=len(eligible),
                           tie=report["tie"] is not None, **{p.objective: winner["figures"][p.objective]})


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
