"""The worked example of select's tie rule in its docstring (docs/steps.md#select) is what
``select_rule.decide`` decides on those numbers: the docs cannot drift from the code."""

from __future__ import annotations

import inspect

import numpy as np

from optbuild.model import race
from optbuild.steps.select import Select, SelectParams
from optbuild.steps.select_rule import decide as select_decides

MIB = 1 << 20
ROUNDS_MS = {"bench_fp32": [10.0, 10.4, 9.9, 10.6, 10.1], "bench_int8": [10.2, 10.1, 10.3, 10.9, 10.4],
             "bench_ov": [12.6, 12.9, 12.4, 13.3, 12.7]}
SIZES = {"bench_fp32": 42.0 * MIB, "bench_int8": 10.7 * MIB, "bench_ov": 42.1 * MIB}


def decide(rounds_ms: dict[str, list[float]], sizes: dict[str, float]) -> tuple[dict, dict]:
    """select's verdict (runs = 5, rounds = 5: one run a round) on these times and sizes."""
    params = SelectParams(candidates=list(rounds_ms), runs=5, rounds=5, min_lead=0.03)
    times = {i: [[round(ms * 1e6)] for ms in rounds] for i, rounds in enumerate(rounds_ms.values())}
    rows = [{"index": i, "step": name, "batch": 1,
             "figures": {"p50_ms": float(np.median(rounds_ms[name])), "size_bytes": int(sizes[name])}}
            for i, name in enumerate(rounds_ms)]
    report: dict = {"tie": None}
    select_decides(params, rows, times, report)
    return report, {row["step"]: row for row in rows}


def docs() -> str:
    """Select's docstring (what docs/steps.md#select prints) with its lines joined."""
    return " ".join(inspect.getdoc(Select).split())


def test_the_worked_example_is_what_select_decides():
    doc = docs()
    report, rows = decide(ROUNDS_MS, SIZES)
    assert report == {"chosen": "bench_int8", "tie": {"with": ["bench_fp32"], "broken_by": "the smaller model"}}
    why = rows["bench_int8"]["why"]
    assert why == "chosen: tied within the noise with bench_fp32, broken by the smaller model" and why[8:] in doc
    assert "(1.02x, interval 0.99-1.04x)" in rows["bench_fp32"]["why"]
    assert rows["bench_fp32"]["winner_lead"]["ratio"] < 1.03 and "interval 0.99-1.04x" in doc
    assert rows["bench_ov"]["why"].endswith("the winner is 1.23x faster (interval 1.21-1.26x)")
    assert '"the winner is 1.23x faster (interval 1.21-1.26x)"' in doc
    fp32, ov = ([[round(ms * 1e6)] for ms in ROUNDS_MS[name]] for name in ("bench_fp32", "bench_ov"))
    assert str(race.lead(fp32, ov, "p50_ms")) == "1.26x, interval 1.25-1.26x"  # step 2: not tied
    assert "Over bench_ov: 1.26x, interval 1.25-1.26x: not tied" in doc


def test_the_worked_examples_variants_are_what_select_decides():
    same_size = {**SIZES, "bench_int8": 42.0 * MIB}
    report, _ = decide(ROUNDS_MS, same_size)
    assert report["chosen"] == "bench_fp32" and report["tie"]["broken_by"] == "the one listed first"
    noisy = {**ROUNDS_MS, "bench_int8": [15.0, 8.3, 19.0, 15.0, 16.0]}
    report, rows = decide(noisy, SIZES)
    assert report["chosen"] == "bench_fp32" and report["tie"]["broken_by"] == "the faster as measured"
    assert "(1.49x, interval 1.01-1.90x)" in rows["bench_int8"]["why"]
    assert "the lead would be 1.49x with the interval 1.01-1.90x" in docs()
