"""Verify's checks: each output's and part's figures (optbuild.model.compare.output_figures)
against the thresholds a recipe sets, a reference that is constant and a candidate that
collapsed; and the worst figure over what the thresholds judge, for summaries (report, bench).
"""

from __future__ import annotations

import math
from typing import Any

# figure -> (its threshold's name, how the figure must compare with it)
THRESHOLDS = {"max_abs": ("max_abs", "<="), "max_rel": ("max_rel", "<="),
              "cosine": ("min_cosine", ">="), "top1": ("min_top1", ">=")}


def threshold_checks(figures: dict[str, dict[str, Any]], thresholds: dict[str, float | None],
                     top1_outputs: list[str], samples: int | None = None) -> list[dict[str, Any]]:
    """One check per output and set threshold (``thresholds`` by the names of THRESHOLDS;
    min_top1 only on ``top1_outputs``), a failed one for a degenerate reference and for a
    collapsed candidate, then the same (top-1 aside) for each slice whose reference is not
    constant; an output whose samples differ in shape gets a failed shape check instead. A
    NaN or infinite figure fails its check. ``samples``: how many, for the messages."""
    on = f" on all {samples} samples" if samples else ""
    checks = []
    for name, f in figures.items():
        if f.get("shape_mismatch"):
            checks.append(_check(name, "shape", f["shape_mismatch"], "==", "reference", False))
            continue
        checks += _figure_checks(name, f, thresholds, top1=name in top1_outputs)
        if f.get("degenerate"):
            checks.append(_check(
                name, "reference", f["degenerate"], "is", "not constant", False,
                why=f"the reference's {name} is {f['degenerate']}{on}: any candidate agrees with it, so comparing "
                    "shows nothing. Give the reference real weights (e.g. not a zero-initialised head), or samples "
                    "that make it vary (data); or leave the output out of outputs"))
        checks += _collapsed_check(name, f)
        for part, g in (f.get("slices") or {}).items():
            if not g["degenerate"]:
                checks += _figure_checks(part, g, thresholds, top1=False) + _collapsed_check(part, g)
    return checks


def judged(figures: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every output and part the thresholds are checked on (threshold_checks), by name: the
    outputs, then each part whose reference is not constant. A detector's [1, 84, N] output
    gives cosine 0.99998 whole while its scores part gives 0.0: a summary of the figures
    (the worst cosine) must look at the parts, as the thresholds do."""
    found = {}
    for name, f in figures.items():
        if f.get("shape_mismatch"):
            continue
        found[name] = f
        found |= {part: g for part, g in (f.get("slices") or {}).items() if not g["degenerate"]}
    return found


def worst(figures: dict[str, dict[str, Any]], metric: str) -> tuple[float, str] | None:
    """The worst ``metric`` (of THRESHOLDS: the lowest cosine or top-1, the highest max_abs or
    max_rel) over the outputs and parts thresholds are checked on, and the output or part it
    is of; None where none has it. A NaN is the worst of all (it fails every check)."""
    found = [(float(f[metric]), name) for name, f in judged(figures).items()
             if isinstance(f.get(metric), (int, float)) and not isinstance(f.get(metric), bool)]
    if not found:
        return None
    if nan := next(((v, n) for v, n in found if math.isnan(v)), None):
        return nan
    lowest = THRESHOLDS[metric][1] == ">="
    return min(found, key=lambda vn: vn[0]) if lowest else max(found, key=lambda vn: vn[0])


def _figure_checks(name: str, f: dict[str, Any], thresholds: dict[str, float | None], top1: bool) -> list[dict]:
    checks = []
    for metric, (key, op) in THRESHOLDS.items():
        threshold = thresholds.get(key)
        if threshold is None or (metric == "top1" and not top1):
            continue
        value = f[metric]
        ok = value is not None and math.isfinite(value) and (
            value <= threshold if op == "<=" else value >= threshold)
        checks.append(_check(name, metric, value, op, threshold, ok))
    return checks


def _collapsed_check(name: str, f: dict[str, Any]) -> list[dict[str, Any]]:
    if not f.get("collapsed"):
        return []
    return [_check(name, "candidate", f["collapsed"].partition(" where")[0], "is", "not constant", False,
                   why=f"the candidate's {name} is {f['collapsed']}: it lost what this part holds (e.g. INT8 "
                       "with one scale over values of very different ranges); exclude the nodes that compute "
                       "it from quantization")]


def _check(output: str, metric: str, value: Any, op: str, threshold: Any, ok: bool,
           why: str | None = None) -> dict[str, Any]:
    check = {"output": output, "metric": metric, "value": value, "op": op, "threshold": threshold, "ok": ok}
    return check | {"why": why} if why else check
