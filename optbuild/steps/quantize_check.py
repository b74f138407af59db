"""What kind = "quantize" checks of its result: that it loads, passes onnx.checker and runs
(``check_result``), and, when onnxruntime quantized nothing, why (``unchanged``), so a float
model never passes for an INT8 one unnoticed."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from optbuild.common.errors import StepError
from optbuild.model.onnxgraph import all_nodes, subgraphs
from optbuild.steps.base import StepContext
from optbuild.steps.quantize_fp16 import fp16_hint
from optbuild.steps.quantize_params import QuantizeParams


def subgraphs_quantized(p: QuantizeParams, model: Any) -> bool:
    """onnxruntime quantizes If/Loop/Scan subgraphs in dynamic mode only (its docs, and
    QDQQuantizer ignores EnableSubgraph); on unless extra_options turns it off."""
    return (p.mode == "dynamic" and p.extra_options.get("EnableSubgraph", True)
            and any(subgraphs(n) for n in model.graph.node))


def unchanged(p: QuantizeParams, model: Any, label: str) -> str:
    """Why onnxruntime likely quantized nothing, and how to accept that."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    handled = set(IntegerOpsRegistry if p.mode == "dynamic" else
                  QDQRegistry if p.format == "qdq" else QLinearOpsRegistry)
    wanted = handled & set(p.op_types_to_quantize) if p.op_types_to_quantize else handled
    top = [n for n in model.graph.node if n.op_type in wanted]
    inner = [n for t in model.graph.node for g in subgraphs(t) for n in all_nodes(g) if n.op_type in wanted]
    reachable = top + inner if subgraphs_quantized(p, model) else top
    chosen = [n for n in reachable if n.name not in p.nodes_to_exclude
              and (not p.nodes_to_quantize or n.name in p.nodes_to_quantize)]
    weighted = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "Attention")
    first = min(chosen or inner, key=lambda n: n.op_type not in weighted, default=None)
    where = f" (first: {first.op_type} {first.name!r})" if first is not None else ""
    if p.op_types_to_quantize and not wanted:
        reason = (f"onnxruntime's {p.mode} quantization handles none of op_types_to_quantize "
                  f"{p.op_types_to_quantize} (it handles {', '.join(sorted(handled))})")
    elif not top and not inner:
        reason = (f"the model has no node of an op type that onnxruntime's {p.mode} quantization "
                  f"handles ({', '.join(sorted(wanted))})")
    elif not top and p.mode == "static":
        reason = (f"its {len(inner)} quantizable nodes{where} all sit inside If/Loop/Scan "
                  f"subgraphs, which onnxruntime's static quantization does not enter (only "
                  f"mode = \"dynamic\" quantizes subgraphs)")
    elif not top and not reachable:
        reason = (f"its {len(inner)} quantizable nodes{where} all sit inside If/Loop/Scan "
                  f"subgraphs, and extra_options EnableSubgraph = false keeps onnxruntime out")
    elif not chosen:
        reason = f"nodes_to_quantize / nodes_to_exclude leave none of its {len(reachable)} quantizable nodes"
    else:
        reason = (f"onnxruntime passed over all {len(chosen)} candidate nodes{where}: weights computed "
                  f"in the graph rather than stored, inputs of unknown type"
                  + (", no calibrated range for their inputs" if p.mode == "static" else "")
                  + ", or ops (such as Relu) quantized only beside a quantized neighbour")
    return (f"{label}: the {p.mode} INT8 result quantizes nothing (no QuantizeLinear, "
            f"DequantizeLinear, DynamicQuantizeLinear, *Integer or QLinear* node, subgraphs "
            f"included): it is the float model. Likely why: {reason}. To keep it anyway, set "
            f"allow_unchanged = true on this step.")


def check_result(ctx: StepContext, p: QuantizeParams, source: Path, out: Path, label: str) -> None:
    """The result passes onnx.checker (full_check) and opens on the backend that runs ONNX
    models (onnxruntime, CPU), whatever ``check`` says: a cached model must at least load.
    With ``check``, it also runs once on check 0's feeds. It is opened as written, with no
    graph optimization: whether it loads is this step's question; how the runtime's
    optimizer treats it is the engine's and verify's (a ViT in float16 crashed
    onnxruntime at ORT_ENABLE_ALL only, and no model came out of this step)."""
    import onnx

    from optbuild.backends import registry
    from optbuild.model.inputdecl import check_declarations
    from optbuild.model.samples import describe_tried, feeds
    from optbuild.steps.rewrite_check import blame

    what = f"the {p.mode} model"
    backend = registry.onnx_backend()
    with contextlib.ExitStack() as stack:
        try:
            runner = stack.enter_context(registry.open_onnx(out, ctx.host, literal=True))
        except Exception as exc:
            hint = fp16_hint(exc, p.node_block_list) if p.mode == "fp16" else ""
            raise StepError(f"{what} does not load in {backend.label} (CPU): {type(exc).__name__}: "
                            f"{exc}{hint}") from None
        try:
            onnx.checker.check_model(str(out), full_check=True)
        except Exception as exc:  # ValidationError, or an InferenceError of the strict shape inference
            raise StepError(f"{what} fails onnx.checker (full_check): {type(exc).__name__}: {exc}") from None
        if not p.check:
            return
        specs = runner.input_specs()
        check_declarations(specs, p.inputs, label)
        feed = feeds(specs, p.inputs, 0)
        try:
            runner.infer(feed)
        except Exception as exc:
            error = str(blame(exc, source, feed, label, what, describe_tried(specs, p.inputs, [0]),
                              ctx.host))
            if "ConvInteger" in str(exc) or "NOT_IMPLEMENTED" in str(exc):
                error += ("\nhint: onnxruntime's CPU kernels lack this quantized op for these types; try "
                          "weight_type = \"uint8\", or leave the op out (op_types_to_quantize / nodes_to_exclude)")
            raise StepError(error) from None
