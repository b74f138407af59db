"""How far a candidate model's outputs are from a reference's: the metrics, the threshold
checks and verify's report table, in one place so that every step measures alike.

Two entry points share the per-output metrics:
- ``compare_outputs``: one feed, every output, pass or fail against a relative tolerance
  with an absolute floor: the checks of export, simplify, opset, quantize and the engines.
- ``output_figures``: one output over many samples, max_abs / max_rel / cosine / top-1:
  verify's figures, checked by ``threshold_checks`` and shown by ``table``.

numpy (and onnx) are imported inside the functions: the CLI imports the step modules, and
so this one, at load time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# An output passes a comparison when its errors are within the relative tolerance or within
# this many epsilons of its element type (float32: 9.5e-07): rounding of values near 1 inside
# the model, which is all an output whose values are tiny (a sigmoid far from 0.5) can show.
ROUNDING_EPS = 8


# --- the metrics ------------------------------------------------------------------------------
def max_errors(reference: Any, candidate: Any) -> tuple[float, float]:
    """(max_abs, max_rel) of one output: the largest |candidate - reference|, and that over the
    reference's largest finite magnitude. Relative to the output's scale, not element-wise, so
    values near zero do not blow it up. NaN or inf in the same places on both sides count as
    equal; anywhere else they make the error inf. Arrays of the same shape; empty: (0, 0)."""
    import numpy as np

    r, o = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    if r.size == 0:
        return 0.0, 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(r - o)
    same = (np.isnan(r) & np.isnan(o)) | (np.isinf(r) & (r == o))
    diff = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
    err = float(diff.max())
    finite = np.abs(r[np.isfinite(r)])
    scale = float(finite.max()) if finite.size else 0.0
    return err, err / max(scale, 1e-12)


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two flat arrays: whether the outputs point the same way, whatever
    their scale (quantization noise lowers it, a sign flip makes it negative). 1 when both are
    all zeros, 0 when one is; NaN when either holds NaN or inf."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def top1(reference: list[Any], candidate: list[Any]) -> float | None:
    """Share of positions (every index but the last axis, over all samples) whose argmax over
    the last axis agrees: top-1 agreement of class scores. None when there are no positions."""
    import numpy as np

    agree = total = 0
    for r, c in zip(reference, candidate):
        a = np.argmax(np.asarray(r).reshape(-1, r.shape[-1]), axis=-1)
        b = np.argmax(np.asarray(c).reshape(-1, c.shape[-1]), axis=-1)
        agree += int(np.sum(a == b))
        total += a.size
    return agree / total if total else None


# --- one feed, every output: pass or fail ---------------------------------------------------
@dataclass(frozen=True)
class OutputError:
    """One output's max abs error, max error relative to the reference's largest magnitude,
    and the machine epsilon of its element type (0 for integers and booleans)."""

    name: str
    max_abs: float
    max_rel: float
    eps: float


class Comparison:
    """How far ``candidate`` outputs are from ``reference`` ones (see compare_outputs)."""

    def __init__(self, max_abs: float, max_rel: float, worst: str | None, problem: str | None,
                 outputs: list[OutputError] | None = None):
        self.max_abs, self.max_rel, self.worst, self.problem = max_abs, max_rel, worst, problem
        self.outputs = outputs or []

    def describe(self, tolerance: float) -> str:
        if self.problem:
            return self.problem
        return (f"max relative error {self.max_rel:.3g} > tolerance {tolerance:g} (output "
                f"{self.worst!r}, max abs error {self.max_abs:.3g})")

    def failure(self, tolerance: float, atol: float | None = None) -> str | None:
        """Why the candidate fails, None when it passes: every output must be within
        ``tolerance`` (relative) or within ``atol`` (absolute; None: ROUNDING_EPS epsilons
        of its element type), so that float rounding does not fail an output of tiny values."""
        if self.problem:
            return self.problem
        for out in sorted(self.outputs, key=lambda o: -o.max_rel):
            floor = ROUNDING_EPS * out.eps if atol is None else atol
            if not (out.max_rel <= tolerance or out.max_abs <= floor):
                return (f"output {out.name!r}: max relative error {out.max_rel:.3g} > tolerance "
                        f"{tolerance:g} and max abs error {out.max_abs:.3g} > atol {floor:.3g}")
        return None


def compare_outputs(names: list[str], reference: list[Any], candidate: list[Any]) -> Comparison:
    """Max abs and relative errors (``max_errors``) of each output of one feed, and the worst
    of them (see Comparison.failure). A different output count or shape is a ``problem``
    (errors are then inf)."""
    import numpy as np

    if len(reference) != len(candidate):
        return Comparison(float("inf"), float("inf"), None,
                          f"{len(candidate)} outputs where {len(reference)} were expected")
    worst_abs = worst_rel = 0.0
    worst = None
    outputs = []
    for i, (ref, out) in enumerate(zip(reference, candidate)):
        name = names[i] if i < len(names) else f"#{i}"
        ref, out = np.asarray(ref), np.asarray(out)
        if ref.shape != out.shape:
            return Comparison(float("inf"), float("inf"), name,
                              f"output {name!r} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        if ref.size == 0:
            continue
        err, rel = max_errors(ref, out)
        eps = max(float(np.finfo(a.dtype).eps) if np.issubdtype(a.dtype, np.floating) else 0.0
                  for a in (ref, out))
        outputs.append(OutputError(name, err, rel, eps))
        if rel > worst_rel or worst is None:
            worst = name
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
    return Comparison(worst_abs, worst_rel, worst, None, outputs)


# --- one output over many samples: verify's figures -----------------------------------------
def output_figures(reference: list[Any], candidate: list[Any], top1_applies: bool) -> dict[str, Any]:
    """Figures of one output over all samples (arrays per sample): shape, dtype, max_abs,
    max_rel and cosine over all samples concatenated, the worst sample's cosine (cosine_min),
    and top1 where ``top1_applies`` (its last axis holds class scores). Samples of different
    shapes give ``shape_mismatch`` instead."""
    import numpy as np

    shapes = [(tuple(r.shape), tuple(c.shape)) for r, c in zip(reference, candidate)]
    figures: dict[str, Any] = {"shape": list(shapes[0][0]), "dtype": str(candidate[0].dtype)}
    bad = [(i, r, c) for i, (r, c) in enumerate(shapes) if r != c]
    if bad:
        i, r, c = bad[0]
        figures["shape_mismatch"] = f"sample {i}: {c} vs {r}"
        return figures

    def flat(arrays: list[Any]) -> list[Any]:
        return [np.asarray(a, dtype=np.float64).ravel() for a in arrays]

    refs, cands = flat(reference), flat(candidate)
    ref, cand = np.concatenate(refs), np.concatenate(cands)
    if ref.size == 0:
        return figures | {"max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "cosine_min": 1.0, "top1": None}
    figures["max_abs"], figures["max_rel"] = max_errors(ref, cand)
    overall = cosine(ref, cand)  # NaN when any sample holds NaN or inf, and then so is the worst
    figures["cosine"] = overall
    figures["cosine_min"] = overall if math.isnan(overall) else min(map(cosine, refs, cands))
    figures["top1"] = top1(reference, candidate) if top1_applies else None
    return figures


# --- where top-1 applies ---------------------------------------------------------------------
# Ops whose output holds their input's values in its layout: a graph output behind them is
# what the op before them computed (a Softmax's probabilities behind an Identity or a Cast).
_PASS_THROUGH = frozenset({"Identity", "Cast", "QuantizeLinear", "DequantizeLinear"})


def softmax_axes(model: Path) -> dict[str, int]:
    """Graph output -> the axis of the Softmax / LogSoftmax that computes it (through
    Identity, Cast and Q/DQ nodes); the outputs that other ops compute are absent, and so is
    every output of an ORT-format model, which onnx cannot read."""
    if model.suffix != ".onnx":
        return {}
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    producer = {out: node for node in proto.graph.node for out in node.output}
    axes = {}
    for output in proto.graph.output:
        node = producer.get(output.name)
        while node is not None and node.op_type in _PASS_THROUGH:
            node = producer.get(node.input[0])
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            default = -1 if opset >= 13 else 1  # opset 13 moved the default from 1 to -1
            axes[output.name] = next((a.i for a in node.attribute if a.name == "axis"), default)
    return axes


def argmax_applies(array: Any) -> bool:
    """Whether an argmax over the last axis can be taken at all: float, 2 or more entries."""
    import numpy as np

    return np.issubdtype(array.dtype, np.floating) and array.ndim >= 1 and array.shape[-1] >= 2


def class_scores(array: Any, softmax_axis: int | None) -> bool:
    """Whether the last axis of an output (``array``, one sample) holds class scores, so that
    its argmax means something: a Softmax / LogSoftmax over that axis computed it
    (``softmax_axis``, from ``softmax_axes``), or, with no Softmax, it is [batch, classes]
    (rank 2). A pixel map or a recurrent state has a last axis too, and no classes on it."""
    if not argmax_applies(array):
        return False
    if softmax_axis is not None:
        return softmax_axis in (-1, array.ndim - 1)
    return array.ndim == 2


# --- thresholds ------------------------------------------------------------------------------
# figure -> (its threshold's name, how the figure must compare with it)
THRESHOLDS = {"max_abs": ("max_abs", "<="), "max_rel": ("max_rel", "<="),
              "cosine": ("min_cosine", ">="), "top1": ("min_top1", ">=")}


def threshold_checks(figures: dict[str, dict[str, Any]], thresholds: dict[str, float | None],
                     top1_outputs: list[str]) -> list[dict[str, Any]]:
    """One check per output and set threshold (``thresholds`` by the names of THRESHOLDS;
    min_top1 only on ``top1_outputs``); an output whose samples differ in shape gets a
    failed shape check instead. A NaN or infinite figure fails its check."""
    checks = []
    for name, f in figures.items():
        if f.get("shape_mismatch"):
            checks.append(_check(name, "shape", f["shape_mismatch"], "==", "reference", False))
            continue
        for metric, (key, op) in THRESHOLDS.items():
            threshold = thresholds.get(key)
            if threshold is None or (metric == "top1" and name not in top1_outputs):
                continue
            value = f[metric]
            ok = value is not None and math.isfinite(value) and (
                value <= threshold if op == "<=" else value >= threshold)
            checks.append(_check(name, metric, value, op, threshold, ok))
    return checks


def _check(output: str, metric: str, value: Any, op: str, threshold: Any, ok: bool) -> dict[str, Any]:
    return {"output": output, "metric": metric, "value": value, "op": op, "threshold": threshold, "ok": ok}


# --- the report ------------------------------------------------------------------------------
def table(report: dict[str, Any]) -> str:
    """Verify's readable report: a header, one row per figure (checked or not), a verdict. It
    names models by file and digest, no step (see optbuild.steps.verify)."""
    checks = {(c["output"], c["metric"]): c for c in report["checks"]}
    rows = [("output", "figure", "value", "threshold", "result")]
    for name, f in report["outputs"].items():
        if f.get("shape_mismatch"):
            rows.append((name, "shape", f["shape_mismatch"], "== reference", "FAIL"))
            continue
        for metric in ("max_abs", "max_rel", "cosine", "cosine_min", "top1"):
            if f.get(metric) is None and (name, metric) not in checks:
                continue
            check = checks.get((name, metric))
            threshold = f"{check['op']} {_fmt_threshold(metric, check['threshold'])}" if check else ""
            result = ("ok" if check["ok"] else "FAIL") if check else ""
            rows.append((name, metric, _fmt(metric, f.get(metric)), threshold, result))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        f"verify: candidate {_model(report['candidate'])} vs reference {_model(report['reference'])}",
        f"{report['data']['samples']} samples from {report['data']['source']}",
        "",
    ]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    lat = report["latency_ms"]
    lines.append("")
    lines.append(f"latency per sample (this host): reference {lat['reference']:.3f} ms on "
                 f"{report['runtime']['reference']}, candidate {lat['candidate']:.3f} ms on "
                 f"{report['runtime']['candidate']}")
    failed = [c for c in report["checks"] if not c["ok"]]
    total = len(report["checks"])
    if failed:
        what = "; ".join(f"{c['output']} {c['metric']} {_fmt(c['metric'], c['value'])} (needs {c['op']} "
                         f"{_fmt_threshold(c['metric'], c['threshold'])})" for c in failed)
        lines.append(f"FAILED: {len(failed)} of {total} checks: {what}")
    else:
        lines.append(f"passed: {total} of {total} checks")
    return "\n".join(lines)


def _fmt(metric: str, value: Any) -> str:
    if value is None:
        return "-"
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
    if isinstance(value, str):
        return value
    return f"{value * 100:g}%" if metric == "top1" else f"{value:g}"


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
