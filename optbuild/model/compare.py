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


def top1(reference: list[Any], candidate: list[Any], axis: int = -1) -> float | None:
    """Share of positions (every index but ``axis``, over all samples) whose argmax over
    ``axis`` agrees: top-1 agreement of class scores (per token of [batch, seq, vocab], per
    pixel of [batch, classes, H, W] with axis 1). None when there are no positions."""
    import numpy as np

    agree = total = 0
    for r, c in zip(reference, candidate):
        a, b = _argmax(r, axis), _argmax(c, axis)
        agree += int(np.sum(a == b))
        total += a.size
    return agree / total if total else None


def _argmax(array: Any, axis: int) -> Any:
    """The argmax over ``axis`` at every other index, flat."""
    import numpy as np

    moved = np.moveaxis(np.asarray(array), axis, -1)
    return np.argmax(moved.reshape(-1, moved.shape[-1]), axis=-1)


# Fewer positions (rows, tokens, pixels over all samples) than this may all get one class by chance.
ONE_CLASS_POSITIONS = 8


def one_class(reference: list[Any], axis: int) -> int | None:
    """The class a reference's argmax over ``axis`` gives at every position of every sample,
    when it is one and there are ONE_CLASS_POSITIONS positions or more (a classifier that says
    the same for any input: comparing with it shows little); None otherwise."""
    import numpy as np

    found = np.concatenate([_argmax(r, axis) for r in reference]) if reference else np.array([])
    return int(found[0]) if found.size >= ONE_CLASS_POSITIONS and bool(np.all(found == found[0])) else None


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
# A part of an output (indices along one axis) whose reference peak is under 1/SCALE_GAP of the
# output's peak holds another quantity than the rest (a detector's scores beside its box
# coordinates): one 8-bit scale shared by both gives it under 1/16 of its steps, and whole-output
# figures, dominated by the large part, cannot see it lost. Such parts are judged on their own.
SCALE_GAP = 16
# More runs than this along the axis: small and large indices interleave (noise, not a
# concatenation of a few quantities), and the output is judged whole.
MAX_RUNS = 8
# A reference whose values span less than this fraction of its largest magnitude (over the
# elements, for the collapse check; from sample to sample, for the flat warning) is taken as not
# varying: a candidate constant there is within this max_rel of it (a reference varying in its
# 7th significant digit is float rounding), and the thresholds judge it.
FLAT_REL = 1e-4


def split_axis(shape: tuple[int, ...]) -> int | None:
    """The axis a [batch, ...] output is sliced along: the non-batch axis of the smallest size
    of 2 or more (a detector's [1, 4 + classes, anchors]: axis 1; [1, anchors, 4 + classes]:
    axis 2), the first of equals; None for rank 0 or 1, or when no such axis exists."""
    sizes = [(size, axis) for axis, size in enumerate(shape) if axis >= 1 and size >= 2]
    return min(sizes)[1] if sizes else None


def scale_runs(reference: list[Any], axis: int) -> list[tuple[int, int]]:
    """Contiguous runs [start, stop) of the indices along ``axis`` that are all large (peak
    |reference| over every sample at least the output's peak / SCALE_GAP) or all small. One run
    when the output is of one scale, or when there would be more than MAX_RUNS."""
    import numpy as np

    size = reference[0].shape[axis]
    peaks = np.zeros(size)
    for array in reference:
        values = np.abs(np.moveaxis(np.asarray(array, dtype=np.float64), axis, 0).reshape(size, -1))
        peaks = np.maximum(peaks, np.where(np.isfinite(values), values, 0.0).max(axis=1, initial=0.0))
    small = peaks < peaks.max() / SCALE_GAP
    starts = [0, *(int(i) for i in np.flatnonzero(small[1:] != small[:-1]) + 1)]
    runs = list(zip(starts, [*starts[1:], size]))
    return runs if len(runs) <= MAX_RUNS else [(0, size)]


def slice_name(output: str, rank: int, axis: int, start: int, stop: int) -> str:
    """How a report names part of an output: ``output0[:, 4:84, :]``."""
    return f"{output}[{', '.join(f'{start}:{stop}' if a == axis else ':' for a in range(rank))}]"


def constant(values: Any) -> str | None:
    """What a flat array is when it holds one value throughout ("constant 0"), or no finite
    value; None when it varies, or has fewer than 2 elements (nothing to tell)."""
    import numpy as np

    if values.size < 2:
        return None
    if not np.isfinite(values).any():
        return "no finite value"
    return f"constant {float(values[0]):.4g}" if bool(np.all(values == values[0])) else None


def _part_figures(reference: list[Any], candidate: list[Any]) -> dict[str, Any]:
    """max_abs, max_rel, cosine, cosine_min of one output or part of it (arrays per sample);
    ``degenerate``: what the reference is when it is constant (comparing with it shows
    nothing); ``collapsed``: what the candidate is when it is constant where the reference
    spans more than FLAT_REL of its largest magnitude (it lost what the part holds; a smaller
    span is rounding, within that max_rel of a constant)."""
    import numpy as np

    refs = [np.asarray(a, dtype=np.float64).ravel() for a in reference]
    cands = [np.asarray(a, dtype=np.float64).ravel() for a in candidate]
    ref, cand = np.concatenate(refs), np.concatenate(cands)
    if ref.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "cosine_min": 1.0, "degenerate": None,
                "collapsed": None}
    figures: dict[str, Any] = dict(zip(("max_abs", "max_rel"), max_errors(ref, cand)))
    overall = cosine(ref, cand)  # NaN when any sample holds NaN or inf, and then so is the worst
    figures["cosine"] = overall
    figures["cosine_min"] = overall if math.isnan(overall) else min(map(cosine, refs, cands))
    figures["degenerate"] = constant(ref)
    figures["collapsed"] = None
    finite = ref[np.isfinite(ref)]
    varies = figures["degenerate"] is None and finite.size and (
        np.ptp(finite) > FLAT_REL * float(np.abs(finite).max()))
    if varies and (flat := constant(cand)) is not None:
        figures["collapsed"] = f"{flat} where the reference spans [{finite.min():.4g}, {finite.max():.4g}]"
    return figures


def _flat(reference: list[Any]) -> str | None:
    """What a float reference is when it barely depends on its input: its largest change from
    sample to sample under FLAT_REL of its largest magnitude (with such a reference any
    candidate passes); None when it varies, or with fewer than 2 samples of one shape."""
    import numpy as np

    arrays = [np.asarray(a, dtype=np.float64) for a in reference]
    if (len(arrays) < 2 or any(a.shape != arrays[0].shape for a in arrays)
            or not np.issubdtype(np.asarray(reference[0]).dtype, np.floating)):
        return None
    stack = np.stack(arrays)
    finite = np.isfinite(stack).all(axis=0)
    if not finite.any():
        return None
    values = stack[:, finite]
    spread, scale = float(np.ptp(values, axis=0).max()), float(np.abs(values).max())
    if spread > FLAT_REL * scale:
        return None
    return f"changes by at most {spread:.3g} from sample to sample (its values reach {scale:.4g})"


def output_figures(reference: list[Any], candidate: list[Any], top1_axis: int | None, name: str = "output",
                   slices: tuple[int, list[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """Figures of one output ``name`` over all samples (arrays per sample): shape, dtype,
    max_abs, max_rel and cosine over all samples concatenated, the worst sample's cosine
    (cosine_min), degenerate and collapsed (see _part_figures), flat (see _flat), and with
    ``top1_axis`` (the axis that holds class scores) top1 and one_class (see one_class);
    with ``slices`` (axis, runs [start, stop) along it; more than one run; the last taken to
    each sample's end) the same figures, top1 aside, of each part under ``slices``, keyed by
    slice_name. Samples of different shapes give ``shape_mismatch`` instead."""
    import numpy as np

    shapes = [(tuple(r.shape), tuple(c.shape)) for r, c in zip(reference, candidate)]
    figures: dict[str, Any] = {"shape": list(shapes[0][0]), "dtype": str(candidate[0].dtype)}
    bad = [(i, r, c) for i, (r, c) in enumerate(shapes) if r != c]
    if bad:
        i, r, c = bad[0]
        figures["shape_mismatch"] = f"sample {i}: {c} vs {r}"
        return figures
    figures |= _part_figures(reference, candidate)
    figures["flat"] = None if figures["degenerate"] else _flat(reference)
    figures["top1"] = None if top1_axis is None else top1(reference, candidate, top1_axis)
    figures["top1_axis"] = top1_axis
    figures["one_class"] = None if top1_axis is None else one_class(reference, top1_axis)
    if slices is not None and len(slices[1]) > 1:
        axis, runs = slices
        rank = len(shapes[0][0])

        def part(arrays: list[Any], start: int, stop: int | None) -> list[Any]:
            return [np.asarray(a)[(slice(None),) * axis + (slice(start, stop),)] for a in arrays]

        figures["slices"] = {}
        for start, stop in runs:
            end = None if stop == runs[-1][1] else stop  # the last part runs to each sample's end
            figures["slices"][slice_name(name, rank, axis, start, stop)] = _part_figures(
                part(reference, start, end), part(candidate, start, end))
    return figures


# --- where top-1 applies ---------------------------------------------------------------------
# Ops whose output holds their input's values in its layout: a graph output behind them is
# what the op before them computed (a Softmax's probabilities behind an Identity or a Cast).
_PASS_THROUGH = frozenset({"Identity", "Cast", "QuantizeLinear", "DequantizeLinear"})
_LINEAR = frozenset({"Gemm", "MatMul"})


def _heads(model: Path) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(graph output -> the node that computes it, seen through _PASS_THROUGH nodes; tensor ->
    the node that makes it; the default-domain opset) of an ONNX model; ({}, {}, 0) for an
    ORT-format model, which onnx cannot read."""
    if model.suffix != ".onnx":
        return {}, {}, 0
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    producer = {out: node for node in proto.graph.node for out in node.output}
    heads = {}
    for output in proto.graph.output:
        node = producer.get(output.name)
        if (node := _through(node, producer)) is not None:
            heads[output.name] = node
    return heads, producer, opset


def _through(node: Any, producer: dict[str, Any]) -> Any:
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producer.get(node.input[0])
    return node


def softmax_axes(model: Path) -> dict[str, int]:
    """Graph output -> the axis of the Softmax / LogSoftmax that computes it (through
    Identity, Cast and Q/DQ nodes); the outputs that other ops compute are absent, and so is
    every output of an ORT-format model, which onnx cannot read."""
    heads, _, opset = _heads(model)
    default = -1 if opset >= 13 else 1  # opset 13 moved the default from 1 to -1
    return {name: next((a.i for a in node.attribute if a.name == "axis"), default)
            for name, node in heads.items() if node.op_type in ("Softmax", "LogSoftmax")}


def linear_heads(model: Path) -> set[str]:
    """The graph outputs that a Gemm or MatMul (+ bias) computes: ``linear_axes`` -1."""
    return {name for name, axis in linear_axes(model).items() if axis == -1}


def linear_axes(model: Path) -> dict[str, int]:
    """The graph outputs that a linear layer computes, as a classifier's head does, and the
    axis its features are on: -1 for a Gemm, a MatMul, or an Add of a MatMul's result and a
    bias; 1 for a 1x1 Conv (a per-pixel linear layer: a segmentation head), also behind a
    Resize (upsampled to the input's size) or an Add of such Convs; read through Identity, Cast
    and Q/DQ nodes. An activation (BERT's pooler ends in Tanh), a normalisation, a pooling or a
    wider Conv is not one; nor is anything of an ORT-format model."""
    heads, producer, _ = _heads(model)
    found = {}
    for name, node in heads.items():
        while node is not None and node.op_type in ("Resize", "Upsample"):
            node = _through(producer.get(node.input[0]), producer)
        if node is not None and node.op_type == "Add":
            node = next((n for i in node.input if (n := _through(producer.get(i), producer)) is not None
                         and (n.op_type in _LINEAR or _pointwise_conv(n, producer))), node)
        if node is None:
            continue
        if node.op_type in _LINEAR:
            found[name] = -1
        elif _pointwise_conv(node, producer):
            found[name] = 1
    return found


def _pointwise_conv(node: Any, producer: dict[str, Any]) -> bool:
    """A Conv whose kernel_shape is 1 on every spatial axis (torch writes kernel_shape)."""
    if node.op_type != "Conv":
        return False
    kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), None)
    return kernel is not None and all(k == 1 for k in kernel)


def argmax_applies(array: Any, axis: int = -1) -> bool:
    """Whether an argmax over ``axis`` can be taken at all: float, 2 or more entries there."""
    import numpy as np

    return (np.issubdtype(array.dtype, np.floating) and array.ndim >= 1 and -array.ndim <= axis < array.ndim
            and array.shape[axis] >= 2)


def class_axis(array: Any, softmax_axis: int | None, linear_axis: int | None) -> int | None:
    """The axis of an output (``array``, one sample) that holds class scores, so that its argmax
    means something; None where none does. The last axis when a Softmax / LogSoftmax over it
    (``softmax_axis``, from ``softmax_axes``) or a linear layer (``linear_axis`` -1, from
    ``linear_axes``) computes [batch, classes] or [batch, seq, vocab] (rank 2 or 3: a
    classifier's or a language model's logits); axis 1 of a [batch, classes, H, W] map that a
    Softmax over axis 1 or a 1x1 Conv (``linear_axis`` 1) computes (a segmentation head). A
    pixel map [N, 1, H, W], a recurrent state, an embedding (a pooler's Tanh), a feature map of
    a wider Conv has axes too, and no classes."""
    rank = array.ndim
    if softmax_axis is not None:
        axis = softmax_axis % rank if rank else None
        found = axis if axis == rank - 1 or (rank == 4 and axis == 1) else None
    elif linear_axis == -1 and rank in (2, 3):
        found = rank - 1
    elif linear_axis == 1 and rank == 4:
        found = 1
    else:
        found = None
    return found if found is not None and argmax_applies(array, found) else None


def class_scores(array: Any, softmax_axis: int | None, linear: bool) -> bool:
    """Whether the last axis of an output holds class scores (``class_axis``, ``linear``: a
    Gemm / MatMul computes it)."""
    return class_axis(array, softmax_axis, -1 if linear else None) == array.ndim - 1


# --- thresholds ------------------------------------------------------------------------------
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


# --- the report ------------------------------------------------------------------------------
_ROW_METRICS = ("max_abs", "max_rel", "cosine", "cosine_min", "top1")


def table(report: dict[str, Any]) -> str:
    """Verify's readable report: a header, one row per figure (checked or not) of each output,
    then of each of its slices, then the user metric's, and a verdict. It names models by file
    and digest, no step (see optbuild.steps.verify)."""
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
