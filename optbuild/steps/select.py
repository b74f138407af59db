"""kind = "select": the best of several candidates on this host, as one step to depend on.

The candidates are ``benchmark`` steps (optbuild.steps.benchmark), each of which measured a
model and carries it, with its figures and its verify verdict, in ``benchmark.json``. A
candidate is dropped when its verify step failed (``fail = false`` on a verify records a
failure instead of stopping the build) or when a figure misses a constraint
(``max_p50_ms``, ``min_throughput``, ``min_cosine``, ``max_size_mb``); the best of the rest
by the ``objective`` wins, ties going to the smaller model, then to the candidate listed
first. The output is the winner's files (so downstream steps and deploy hosts take "the
best engine for this hardware" by one name) and ``selection.json`` / ``selection.txt``: every
candidate, its figures, and why it won or lost. No candidate left fails the step, with that
table.

``candidates = ["bench[*]"]`` takes every instance of a matrix step. The key holds the
candidates' outputs (figures included), so a new measurement selects again.

A candidate that could not run here (unavailable, failed, or skipped behind one that did)
does not stop the choice: select runs while one candidate succeeded, and the table lists
the others with why (``Step.partial_inputs``). Its key names them, so a candidate that
later runs selects again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from optbuild.common.errors import StepError
from optbuild.common.recipetable import StepRef
from optbuild.steps.base import Artifact, Step, StepContext, StepParams, link_files

REPORT_VERSION = 1
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
    """Drop candidates whose verify step measured a lower cosine similarity (worst output), and
    those without a verify step."""
    max_size_mb: float | None = Field(None, gt=0, examples=[50.0])
    """Drop candidates whose model files are larger (MiB)."""


class Select(Step):
    """The best candidate that meets the constraints, and a report of the choice."""

    Params = SelectParams
    primary_output = None  # the winner's main file; known once bound (see bind)
    partial_inputs = True

    def bind(self, upstream: Mapping[str, Step]) -> None:
        """The winner's main file is the candidates' one, when they agree on its name."""
        primaries = {step.primary_output for name, step in upstream.items() if name.startswith("candidates.")}
        self.primary_output = primaries.pop() if len(primaries) == 1 else None

    def run(self, ctx: StepContext) -> None:
        rows = [_row(name, art) for name, art in ctx.inputs.items()]
        for row in rows:
            row["rejected"] = self._rejections(row)
        rows = sorted(rows + [_absent(name, why) for name, why in ctx.missing.items()], key=lambda r: r["index"])
        eligible = [r for r in rows if not r["rejected"]]
        better = OBJECTIVES[self.params.objective]
        report: dict[str, Any] = {
            "format": "optbuild.selection", "version": REPORT_VERSION, "objective": self.params.objective,
            "constraints": {k: v for k, v in self.params.model_dump().items()
                            if k not in ("candidates", "objective") and v is not None},
            "candidates": rows, "chosen": None,
        }
        if eligible:
            best = better(r["figures"][self.params.objective] for r in eligible)
            tied = [r for r in eligible if r["figures"][self.params.objective] == best]
            winner = min(tied, key=lambda r: (r["figures"]["size_bytes"], r["index"]))
            report["chosen"] = winner["step"]
            for row in eligible:
                if row is winner:
                    row["why"] = "chosen"
                elif row in tied:
                    row["why"] = "tied with the winner, which is smaller or listed first"
                else:
                    row["why"] = f"{self.params.objective} {row['figures'][self.params.objective]:g}"
        text = _table(report)
        ctx.log(text)
        if not eligible:
            raise StepError(f"no candidate meets the constraints:\n{text}")
        chosen = ctx.inputs[winner["input"]]
        link_files({n: f for n, f in chosen.files.items() if n != "benchmark.json"}, ctx.out_dir)
        (ctx.out_dir / "selection.json").write_text(json.dumps(report, indent=1) + "\n")
        (ctx.out_dir / "selection.txt").write_text(text + "\n")
        ctx.metrics.update(chosen=winner["step"], candidates=len(rows), eligible=len(eligible),
                           **{self.params.objective: winner["figures"][self.params.objective]})

    def _rejections(self, row: dict[str, Any]) -> list[str]:
        p, figures, verify = self.params, row["figures"], row["verify"]
        why = []
        if verify is not None and not verify.get("passed", False):
            why.append("its verify step failed")
        if p.max_p50_ms is not None and figures["p50_ms"] > p.max_p50_ms:
            why.append(f"p50 {figures['p50_ms']:.3f} ms > {p.max_p50_ms}")
        if p.min_throughput is not None and figures["throughput_per_s"] < p.min_throughput:
            why.append(f"throughput {figures['throughput_per_s']:.1f}/s < {p.min_throughput}")
        if p.max_size_mb is not None and figures["size_bytes"] > p.max_size_mb * (1 << 20):
            why.append(f"size {figures['size_bytes'] / (1 << 20):.2f} MiB > {p.max_size_mb}")
        if p.min_cosine is not None:
            cosine = None if verify is None else verify.get("cosine")
            if cosine is None:
                why.append("no verify cosine to check min_cosine against")
            elif cosine < p.min_cosine:
                why.append(f"cosine {cosine:.6f} < {p.min_cosine}")
        return why


def _index(name: str) -> int:
    return int(name.rpartition(".")[2])


def _absent(name: str, why: str) -> dict[str, Any]:
    """A candidate whose step did not succeed: ``why`` is "<step> <status>: <reason>"."""
    return {"index": _index(name), "input": name, "step": why.split(" ", 1)[0], "runtime": None,
            "figures": None, "verify": None, "rejected": [why.split(" ", 1)[1]], "why": None}


def _row(name: str, artifact: Artifact) -> dict[str, Any]:
    """A candidate as the report shows it, from its benchmark.json."""
    path = artifact.files.get("benchmark.json")
    if path is None:
        raise StepError(f"candidate {artifact.step} has no benchmark.json: candidates must be benchmark steps")
    try:
        report = json.loads(path.read_text())
        figures = {k: float(report[k]) for k in OBJECTIVES}
    except (ValueError, KeyError, TypeError) as exc:
        raise StepError(f"candidate {artifact.step}: unreadable benchmark.json ({exc})") from None
    return {"index": _index(name), "input": name, "step": artifact.step, "runtime": report.get("runtime"),
            "figures": figures, "verify": report.get("verify"), "rejected": [], "why": None}


def _table(report: dict[str, Any]) -> str:
    objective = report["objective"]
    lines = [f"select by {objective}" + (f", constraints {report['constraints']}" if report["constraints"] else ""),
             f"{'candidate':32} {'p50 ms':>9} {'thr/s':>9} {'MiB':>7} {'cosine':>9}  verdict"]
    for row in report["candidates"]:
        f, verify = row["figures"], row["verify"] or {}
        cosine = verify.get("cosine")
        verdict = "; ".join(row["rejected"]) if row["rejected"] else (row["why"] or "")
        mark = "*" if row["step"] == report["chosen"] else " "
        if f is None:  # it did not run here
            lines.append(f"{mark}{row['step']:31} {'-':>9} {'-':>9} {'-':>7} {'-':>9}  {verdict}")
            continue
        lines.append(f"{mark}{row['step']:31} {f['p50_ms']:9.3f} {f['throughput_per_s']:9.1f} "
                     f"{f['size_bytes'] / (1 << 20):7.2f} {'-' if cosine is None else f'{cosine:9.6f}':>9}  {verdict}")
    return "\n".join(lines)
