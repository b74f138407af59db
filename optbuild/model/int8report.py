"""Where INT8 hurts: per-tensor errors of a quantized model against its float model, Concat
nodes whose inputs have such different ranges that one scale wipes the small ones, and
weights whose few outlying values do the same to the rest of the tensor under one scale.

Names: onnxruntime keeps a float tensor's name in its quantized model as the output of the
node that makes it (in QDQ format the value downstream nodes see is then the output of the
DequantizeLinear fed by a QuantizeLinear of it, named ``<tensor>_DequantizeLinear_Output``);
a graph output keeps its name as that DequantizeLinear's output. ``layer_errors`` compares
what downstream nodes see, found by that structure, not by the suffix.

A tensor that joins quantities of different scales (a detector's boxes 0..320 beside its
scores 0..1) is also judged by parts, as verify judges outputs (optbuild.model.compare's
scale runs): its whole cosine, dominated by the large part, cannot see the small part lost.
A graph output that holds class scores is judged whole, as verify judges it: some logits are
far below the top ones by nature, and a part cut there (one of a classifier's 1000 logits,
small on the few samples the report runs) would judge noise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SHARED_SCALE_RATIO = 16  # input spans this many times apart share one scale badly
DEPARTS = 0.99  # cosine under which a tensor is said to depart from the float model


@dataclass(frozen=True)
class LayerError:
    """How far one tensor of the quantized model is from the float model's."""

    tensor: str
    node: str
    op: str
    cosine: float
    relative_error: float  # ||quantized - float|| / ||float||
    part: str | None = None  # the worst part of a tensor of parts of different scales ("y[:, 4:7]")
    part_cosine: float | None = None  # that part's cosine

    @property
    def worst(self) -> float:
        """The lower of the whole tensor's cosine and its worst part's."""
        return self.cosine if self.part_cosine is None else min(self.cosine, self.part_cosine)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _seen(graph: Any) -> dict[str, str]:
    """Float tensor name -> the name of the value its consumers read in the quantized graph."""
    produced = {o for n in graph.node for o in n.output}
    seen = {name: name for name in produced}
    dequant = {n.input[0]: n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] in dequant:
            seen[node.input[0]] = dequant[node.output[0]]
    return seen


def _run_exposed(model: Any, names: list[str], feeds: list[dict[str, Any]]) -> list[list[Any]]:
    """Run ``model`` with ``names`` made graph outputs (no graph optimization, so none is
    fused away); per feed, the values of ``names``."""
    import onnx

    from optbuild.backends.onnxruntime.loader import session

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    known = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                for n in names if n not in known)
    sess = session(exposed.SerializeToString(), level="disable")
    return [sess.run(names, feed) for feed in feeds]


def layer_errors(reference: Path, quantized: Path, feeds: list[dict[str, Any]]) -> list[LayerError]:
    """The error of every float tensor made by a node of ``reference`` (top graph) that the
    ``quantized`` model also computes, over ``feeds``, in ``reference``'s node order
    (topological for a valid model)."""
    import numpy as np
    import onnx

    ref = onnx.shape_inference.infer_shapes(onnx.load(str(reference)))
    quant = onnx.load(str(quantized))
    floats = {v.name for v in (*ref.graph.value_info, *ref.graph.output)
              if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    seen = _seen(quant.graph)
    tensors = [(o, n) for n in ref.graph.node for o in n.output if o in floats and o in seen]
    if not tensors:
        return []
    ref_values = _run_exposed(ref, [t for t, _ in tensors], feeds)
    quant_values = _run_exposed(quant, [seen[t] for t, _ in tensors], feeds)
    classes = _class_scores(reference, [t for t, _ in tensors], ref_values)
    errors = []
    for i, (tensor, node) in enumerate(tensors):
        refs = [np.asarray(v[i], np.float64) for v in ref_values]
        quants = [np.asarray(v[i], np.float64) for v in quant_values]
        if [a.shape for a in refs] != [a.shape for a in quants]:
            continue
        r = np.concatenate([a.ravel() for a in refs])
        q = np.concatenate([a.ravel() for a in quants])
        r_norm = float(np.linalg.norm(r))
        relative = float(np.linalg.norm(q - r) / r_norm) if r_norm else float(np.linalg.norm(q) > 0)
        part, part_cosine = (None, None) if tensor in classes else _worst_part(tensor, refs, quants)
        errors.append(LayerError(tensor, node.name, node.op_type, _cosine(r, q), relative, part, part_cosine))
    return errors


def _class_scores(reference: Path, names: list[str], values: list[list[Any]]) -> set[str]:
    """The graph outputs among ``names`` that hold class scores, as verify tells them
    (classaxes.class_scores: a Softmax over the last axis, or [batch, classes] from a linear
    layer); ``values``: per feed, the values of ``names``."""
    from optbuild.model import classaxes

    if not values:
        return set()
    axes, linear = classaxes.softmax_axes(reference), classaxes.linear_heads(reference)
    outputs = set(axes) | linear
    return {name for i, name in enumerate(names)
            if name in outputs and classaxes.class_scores(values[0][i], axes.get(name), name in linear)}


def _cosine(r: Any, q: Any) -> float:
    """Cosine of two flat arrays: 1 when both are all zeros, 0 when only one is."""
    import numpy as np

    r_norm, q_norm = float(np.linalg.norm(r)), float(np.linalg.norm(q))
    if not (r_norm and q_norm):
        return 1.0 if r_norm == q_norm else 0.0
    return float(np.dot(r, q) / (r_norm * q_norm))


def _worst_part(tensor: str, refs: list[Any], quants: list[Any]) -> tuple[str | None, float | None]:
    """(name, cosine) of the worst part of a tensor whose parts along one axis differ in
    scale (compare.scale_runs), leaving out parts constant in the float model; (None, None)
    for a tensor of one scale, or samples of different sizes along that axis (samples may
    differ in batch)."""
    import numpy as np

    from optbuild.model import compare
    from optbuild.model.metrics import constant

    shape = refs[0].shape
    axis = compare.split_axis(shape)
    if axis is None or any(a.ndim != len(shape) or a.shape[axis] != shape[axis] for a in refs):
        return None, None
    runs = compare.scale_runs(refs, axis)
    if len(runs) < 2:
        return None, None
    parts = []
    for start, stop in runs:
        index = (slice(None),) * axis + (slice(start, stop),)
        r = np.concatenate([a[index].ravel() for a in refs])
        if constant(r) is None:
            q = np.concatenate([a[index].ravel() for a in quants])
            parts.append((_cosine(r, q), compare.slice_name(tensor, len(shape), axis, start, stop)))
    if not parts:
        return None, None
    cosine, name = min(parts)
    return name, cosine


def first_departure(errors: list[LayerError], threshold: float = DEPARTS) -> LayerError | None:
    """The first tensor, in node order, whose cosine (or its worst part's) falls under ``threshold``."""
    return next((e for e in errors if e.worst < threshold), None)


def table(errors: list[LayerError], rows: int = 10) -> str:
    """The ``rows`` worst tensors (lowest cosine, whole or of a part, first) as a text table."""
    worst = sorted(errors, key=lambda e: (e.worst, -e.relative_error))[:rows]
    width = max([len(e.tensor) for e in worst] + [6])
    lines = [f"{'tensor':<{width}}  {'op':<16} {'cosine':>9} {'rel err':>9}  node"]
    for e in worst:
        part = f"  (worst part {e.part}: cosine {e.part_cosine:.5f})" if e.part_cosine is not None else ""
        lines.append(f"{e.tensor:<{width}}  {e.op:<16} {e.cosine:9.5f} {e.relative_error:9.4f}  {e.node}{part}")
    return "\n".join(lines)


@dataclass(frozen=True)
class SharedScale:
    """A Concat whose inputs' ranges differ by more than SHARED_SCALE_RATIO: quantized, its
    output has one scale, and the inputs of small range keep few of its levels."""

    node: str
    small: str
    small_range: tuple[float, float]
    large: str
    large_range: tuple[float, float]
    exclude: list[str]  # the Concat and the nodes that read its output

    @property
    def levels(self) -> int:
        """About how many of 256 levels the small input keeps."""
        span = self.large_range[1] - self.large_range[0]
        return max(1, round(255 * (self.small_range[1] - self.small_range[0]) / span))


def shared_scales(graph: Any, ranges: dict[str, list[float]]) -> list[SharedScale]:
    """Concat nodes of ``graph`` (top level) whose calibrated inputs' spans (from ``ranges``,
    tensor -> [min, max]) differ by more than SHARED_SCALE_RATIO times."""
    found = []
    for node in graph.node:
        if node.op_type != "Concat":
            continue
        spans = {i: ranges[i] for i in node.input if i in ranges}
        if len(spans) < 2:
            continue
        small = min(spans, key=lambda i: spans[i][1] - spans[i][0])
        large = max(spans, key=lambda i: spans[i][1] - spans[i][0])
        small_span, large_span = (spans[t][1] - spans[t][0] for t in (small, large))
        if large_span > SHARED_SCALE_RATIO * max(small_span, 1e-12):
            readers = [n.name for n in graph.node if set(node.output) & set(n.input)]
            found.append(SharedScale(node.name, small, (spans[small][0], spans[small][1]), large,
                                     (spans[large][0], spans[large][1]), [node.name, *readers]))
    return found


@dataclass(frozen=True)
class OutlierWeight:
    """A weight whose peak |value| is more than SHARED_SCALE_RATIO times the typical peak of
    its output channels: under one scale for the whole tensor, most channels keep few levels."""

    node: str
    op: str
    weight: str
    peak: float  # max |w| over the tensor
    typical: float  # the median over output channels of their max |w|

    def levels(self, full: int) -> int:
        """About how many of ``full`` levels a typical channel keeps under one scale."""
        return max(1, round(full * self.typical / self.peak))


# op type -> the axis of its weight (input 1) that holds output channels (onnxruntime's per-channel axis)
_WEIGHT_AXIS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "Gemm": None}


def outlier_weights(graph: Any, ratio: float = SHARED_SCALE_RATIO) -> list[OutlierWeight]:
    """The Conv / ConvTranspose / MatMul / Gemm nodes of ``graph`` (top level) whose weight, an
    initializer of rank 2 or more, peaks at more than ``ratio`` times its output channels'
    median peak."""
    import numpy as np
    from onnx import numpy_helper

    weights = {i.name: i for i in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type not in _WEIGHT_AXIS or len(node.input) < 2 or node.input[1] not in weights:
            continue
        w = np.abs(numpy_helper.to_array(weights[node.input[1]]).astype(np.float64))
        if w.ndim < 2 or w.size == 0 or not np.isfinite(w).all():
            continue
        axis = _WEIGHT_AXIS[node.op_type]
        if axis is None:  # Gemm: B is [K, N], or [N, K] with transB
            axis = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
        peaks = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
        typical = float(np.median(peaks))
        if typical > 0 and float(w.max()) > ratio * typical:
            found.append(OutlierWeight(node.name, node.op_type, node.input[1], float(w.max()), typical))
    return found
