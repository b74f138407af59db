"""Verify's report in its two forms: the readable table (figures, checks, verdict) and the
report.json values kept strict JSON. It names models by file and digest, no step (see
optbuild.steps.verify).
"""

from __future__ import annotations

import math
from typing import Any

_ROW_METRICS = ("max_abs", "max_rel", "cosine", "cosine_min", "top1")


def table(report: dict[str, Any]) -> str:
    """Verify's readable report: a header, one row per figure (checked or not) of each output,
    then of each of its slices, then the user metric's, and a verdict."""
    checks = {(c["output"], c["metric"]): c for c in report["checks"]}
    rows = [("output", "figure", "value", "threshold", "result")]

    def row(name: str, metric: str, value: Any) -> None:
        check = checks.get((name, metric))
        threshold = f"{check['op']} {_fmt_threshold(metric, check['threshold'])}" if check else ""
        result = ("ok" if check["ok"] else "FAIL") if check else ""
        rows.append((name, metric, _fmt(metric, value), threshold, result))

    def part(name: str, f: dict[str, Any]) -> None:
        for metric in _ROW_METRICS:
            if f.get(metric) is not None or (name, metric) in checks:
                row(name, metric, f.get(metric))
        for metric in ("reference", "candidate"):
            if (check := checks.get((name, metric))) is not None:
                row(name, metric, check["value"])

    for name, f in report["outputs"].items():
        if f.get("shape_mismatch"):
            rows.append((name, "shape", f["shape_mismatch"], "== reference", "FAIL"))
            continue
        part(name, f)
        for sliced, g in (f.get("slices") or {}).items():
            part(sliced, g)
    if (user := report.get("metric")) is not None:
        for figure, value in user["figures"].items():
            row(user["callable"], figure, value)
        row(user["callable"], "passed", user["passed"])
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        f"verify: candidate {_model(report['candidate'])} vs reference {_model(report['reference'])}",
        f"{report['data']['samples']} samples from {report['data']['source']}",
        "",
    ]
    for index, cells in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    lat = report["latency_ms"]
    lines.append("")
    lines.append(f"latency per sample (this host): reference {lat['reference']:.3f} ms on "
                 f"{report['runtime']['reference']}, candidate {lat['candidate']:.3f} ms on "
                 f"{report['runtime']['candidate']}")
    lines += [f"note: {note}" for note in report.get("notes", [])]
    lines += [f"warning: {warning}" for warning in report.get("warnings", [])]
    failed = [c for c in report["checks"] if not c["ok"]]
    total = len(report["checks"])
    if failed:
        what = "; ".join(f"{c['output']}: {c['why']}" if c.get("why") else
                         f"{c['output']} {c['metric']} {_fmt(c['metric'], c['value'])} (needs {c['op']} "
                         f"{_fmt_threshold(c['metric'], c['threshold'])})" for c in failed)
        lines.append(f"FAILED: {len(failed)} of {total} checks: {what}")
    else:
        lines.append(f"passed: {total} of {total} checks")
    return "\n".join(lines)


def _fmt(metric: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if metric in ("top1", "min_top1"):
        return f"{value * 100:.1f}%"
    if metric in ("cosine", "cosine_min"):
        return f"{value:.5f}"
    return f"{value:.4g}"


def _fmt_threshold(metric: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value
    # as written: ``:g`` would print min_cosine = 0.9999999 as 1 (a check seen to fail against 1)
    return f"{value * 100:.15g}%" if metric == "top1" else repr(value)


def _model(entry: dict[str, str]) -> str:
    """A report's model entry as 'file (algorithm digest-prefix)'."""
    algorithm, _, digest = entry["digest"].partition(":")
    return f"{entry['file']} ({algorithm} {digest[:12]})"


def jsonable(value: Any) -> Any:
    """NaN and infinities as strings, so that a report stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value
