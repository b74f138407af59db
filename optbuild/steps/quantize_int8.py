"""What INT8 quantization knows of a graph, apart from the step: the warnings of a Concat
whose inputs' ranges one scale serves badly and of weights that one per-tensor scale serves
badly (each a first group for exclude_until), the -inf fills static INT8 keeps float, which
operators are integer or quantized ones, a next step for onnxruntime's known quantizer errors,
and the calibration table as onnxruntime's cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optbuild.model.onnxgraph import all_nodes
from optbuild.steps.base import StepContext
from optbuild.steps.quantize_params import QuantizeParams


def warn_shared_scales(ctx: StepContext, p: QuantizeParams, model: Any, ranges: dict[str, list[float]]) -> list[list[str]]:
    """Warn of Concat nodes whose inputs' ranges differ so much that the one scale of
    their quantized output wipes the small ones (a detector's boxes 0..320 beside its
    scores 0..1: scale 1.25, every score under 0.63 became 0). Returns, per Concat, the
    Concat alone and with the nodes that read it: what exclude_until tries first."""
    from optbuild.model.int8report import SHARED_SCALE_RATIO, shared_scales

    found = [s for s in shared_scales(model.graph, ranges) if s.node not in p.nodes_to_exclude
             and (not p.nodes_to_quantize or s.node in p.nodes_to_quantize)
             and (not p.op_types_to_quantize or "Concat" in p.op_types_to_quantize)]
    ctx.metrics["shared_scales"] = [s.node for s in found]
    for s in found:
        exclude = [n for n in s.exclude if n not in p.nodes_to_exclude]
        ctx.log(f"warning: Concat {s.node!r} joins {s.small!r} (range [{s.small_range[0]:.4g}, "
                f"{s.small_range[1]:.4g}]) and {s.large!r} ([{s.large_range[0]:.4g}, {s.large_range[1]:.4g}]), "
                f"more than {SHARED_SCALE_RATIO}x apart: quantized, its output has one scale and "
                f"{s.small!r} keeps about {s.levels} of 256 levels. If verify fails, keep it float: "
                f"nodes_to_exclude = {[*p.nodes_to_exclude, *exclude]!r} on this step")
    return [group for s in found for group in ([s.node], s.exclude)]


def warn_outlier_weights(ctx: StepContext, p: QuantizeParams, model: Any, reduce_range: bool) -> list[list[str]]:
    """Warn of weights that one per-tensor scale serves badly (per_channel = false): a few
    values far beyond the rest of the tensor (convnext_tiny with random weights held 2.0
    beside a std of 0.02 in three weights; quantized per tensor, the other channels kept
    about 2 of 63 levels and the logits' cosine fell to 0.83, per channel it was 0.997).
    Returns each such node alone: a group exclude_until tries early."""
    from optbuild.model.int8report import SHARED_SCALE_RATIO, outlier_weights

    if p.per_channel:
        return []
    found = [w for w in outlier_weights(model.graph) if w.node not in p.nodes_to_exclude
             and (not p.nodes_to_quantize or w.node in p.nodes_to_quantize)
             and (not p.op_types_to_quantize or w.op in p.op_types_to_quantize)]
    ctx.metrics["outlier_weights"] = [w.node for w in found]
    full = (127 if p.weight_type == "int8" else 255) // (2 if reduce_range else 1)
    for w in found:
        ctx.log(f"warning: the weight {w.weight!r} of {w.op} {w.node!r} peaks at |w| = {w.peak:.4g}, "
                f"{w.peak / w.typical:.0f}x its output channels' typical peak ({w.typical:.4g}; more than "
                f"{SHARED_SCALE_RATIO}x): with one scale for the whole tensor (per_channel = false), most "
                f"channels keep about {w.levels(full)} of {full} levels. per_channel = true gives each output "
                f"channel its own scale; or keep the node float: nodes_to_exclude = "
                f"{[*p.nodes_to_exclude, w.node]!r}")
    return [[w.node] for w in found]


# --- graph walks -------------------------------------------------------------------------------
_QUANTIZED_CONTRIB = ("QGemm", "QAttention", "QEmbedLayerNormalization", "DynamicQuantizeLSTM",
                      "DynamicQuantizeMatMul", "MatMulIntegerToFloat")


def infinite_fill_nodes(graph: Any) -> list[str]:
    """Names of the nodes of ``graph`` that read a float initializer holding an infinity (the
    -inf fill of masked_fill, or an additive mask), then of the nodes that read what those
    make; an unnamed one is named '<op>_<index>' here, as nodes_to_exclude needs a name. Static
    INT8 keeps them float: the fill has no finite scale (quantized as a weight, it gave NaN
    scales), and the masked scores, quantized, saturate to the finite end of their range,
    where a Softmax weighs them."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
    filled = {t.name for t in graph.initializer if t.data_type in floats
              and t.data_location != TensorProto.EXTERNAL and not np.isfinite(numpy_helper.to_array(t)).all()}
    makers = [n for n in graph.node if filled & set(n.input)]
    made = {o for n in makers for o in n.output}
    readers = [n for n in graph.node if made & set(n.input)]
    for index, node in enumerate(graph.node):
        if not node.name and (node in makers or node in readers):
            node.name = f"{node.op_type}_{index}"
    return list(dict.fromkeys(n.name for n in (*makers, *readers)))


def integer_op(op: str) -> bool:
    return op.endswith("Integer") or op.startswith("QLinear") or op in _QUANTIZED_CONTRIB


def quantized_op(op: str) -> bool:
    return op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear") or integer_op(op)


def quantizer_hint(exc: BaseException, model: Any) -> str:
    """A next step for onnxruntime's known quantization errors, else ''."""
    import re

    match = re.search(r"Expected (\S+) to be an initializer", str(exc))
    if match is None:
        return ""
    name = match.group(1)
    producer = next((n for n in all_nodes(model.graph) if name in n.output), None)
    user = next((n for n in all_nodes(model.graph) if name in n.input), None)
    made = f"computed by {producer.op_type} node {producer.name!r}" if producer else "a graph input"
    exclude = f", or keep its node float: nodes_to_exclude = [{user.name!r}]" if user is not None else ""
    return (f"\nhint: the weight {name!r} is {made}, not stored, and onnxruntime quantizes stored "
            f"weights (initializers) only: fold it into one with a simplify step before this one{exclude}")


def write_ort_cache(path: Path, method: Any, tensors: dict[str, list[float]]) -> None:
    """The table as onnxruntime's calibration cache (TensorsData as JSON)."""
    import numpy as np
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    data = {name: TensorData(lowest=np.array(lo, dtype=np.float32), highest=np.array(hi, dtype=np.float32))
            for name, (lo, hi) in tensors.items()}
    save_tensors_data(TensorsData(method, data), path)
