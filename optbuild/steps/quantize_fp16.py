"""quantize's mode 'fp16': float32 to float16 with onnxconverter-common, and the repair of the
nodes the converter types wrong (kept float32, found in the graph or named by onnxruntime)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.common.errors import StepError
from optbuild.model.onnxgraph import (
    all_nodes,
    drop_value_info,
    outer_reads,
    rename_uses,
    sort_topologically,
    subgraphs,
)

if TYPE_CHECKING:
    from optbuild.steps.base import StepContext

FP16_AUTO_BLOCKS = 32  # conversions retried with one more node kept float32, at most


def to_float16(ctx: StepContext, model: Any, out: Path, *, keep_io_types: bool | list[str],
               op_block_list: list[str], node_block_list: list[str], min_positive_val: float,
               max_finite_val: float) -> None:
    """``model`` converted to float16 into ``out``, the nodes the converter types wrong kept float32
    (see mode 'fp16' and its parameters)."""
    import onnx

    try:
        from onnxconverter_common import float16
    except ImportError:
        raise StepError("mode 'fp16' needs onnxconverter-common (pip install onnxconverter-common)") from None
    if isinstance(keep_io_types, list):
        floats = {v.name for v in (*model.graph.input, *model.graph.output)
                  if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
        io_names = [v.name for v in (*model.graph.input, *model.graph.output)]
        unknown = [n for n in keep_io_types if n not in io_names]
        if unknown:
            raise StepError(f"keep_io_types: the model has no input or output {unknown} "
                            f"(it has {io_names})")
        if not_float := [n for n in keep_io_types if n not in floats]:
            raise StepError(f"keep_io_types: {not_float} are not float32 tensors")
    if keep_io_types is True and (read := split_read_outputs(model.graph)):
        ctx.metrics["fp16_outputs_read_inside"] = read
        ctx.log(f"fp16: output(s) {', '.join(read)} also read inside the graph: their readers read "
                f"the float16 tensor, an Identity makes the float32 output (the converter's border "
                f"Cast alone leaves them reading float32)")
    dropped = drop_value_info(model.graph)
    ctx.metrics["value_info_dropped"] = dropped
    if dropped:
        ctx.log(f"fp16: {dropped} value_info entries dropped before converting (shape inference "
                f"re-derives them; a duplicated or stale entry keeps a float16 tensor typed float32)")
    kwargs = {"min_positive_val": min_positive_val, "max_finite_val": max_finite_val,
              "keep_io_types": keep_io_types is True,
              "op_block_list": [*float16.DEFAULT_OP_BLOCK_LIST, *op_block_list]}
    names = {n.name for n in all_nodes(model.graph)}
    auto: list[str] = []
    converted = _convert(ctx, model, node_block_list, keep_io_types, kwargs)
    for _ in range(FP16_AUTO_BLOCKS):
        wrong = [n for n in mistyped_nodes(converted.graph) or _ort_type_error(converted)
                 if n in names and n not in auto and n not in node_block_list]
        if not wrong:  # loads, or an error no block can fix: Quantize._check reports it
            break
        auto.extend(wrong)
        converted = _convert(ctx, model, [*node_block_list, *auto], keep_io_types, kwargs)
    ctx.metrics["fp16_blocked_nodes"] = auto
    if auto:
        ctx.log(f"fp16: onnxconverter-common typed {len(auto)} node(s) wrong (their outputs declared "
                f"float16 while they make float32): kept in float32, as node_block_list would: "
                f"{', '.join(auto)}")
    onnx.save(converted, str(out))


def _convert(ctx: StepContext, model: Any, blocked: list[str], keep_io_types: bool | list[str],
             kwargs: dict[str, Any]) -> Any:
    """One conversion of a copy of ``model`` with the nodes ``blocked`` kept float32,
    the named float32 inputs/outputs restored and every graph sorted."""
    from onnxconverter_common import float16

    try:  # the converter works on the copy its shape inference returns: model stays as it is
        converted = float16.convert_float_to_float16(model, node_block_list=blocked, **kwargs)
    except Exception as exc:
        raise StepError(f"float16 conversion of {ctx.inputs['input'].step} failed: "
                        f"{type(exc).__name__}: {exc}") from exc
    if isinstance(keep_io_types, list):
        _keep_float32(converted, keep_io_types)
    sort_topologically(converted.graph)  # the converter sorts the main graph only
    return converted


def split_read_outputs(graph: Any) -> list[str]:
    """Graph outputs that nodes of ``graph`` also read, each now made by an Identity from a
    tensor ``<name>/inner`` that its readers read instead. With ``keep_io_types = true`` the
    converter Casts such an output back to float32 at the border, and its readers, converted to
    float16, then read float32: onnxruntime refuses the model ('Type parameter (T) of Optype
    (Conv) bound to different types'). Returns the outputs split."""
    from onnx import helper

    read = {i for n in graph.node for i in n.input} | {r for n in graph.node for sub in subgraphs(n)
                                                       for r in outer_reads(sub)}
    made = {o for n in graph.node for o in n.output}
    split = [o.name for o in graph.output if o.name in read and o.name in made]
    for name in split:
        inner = f"{name}/inner"
        rename_uses(graph, name, inner)
        for node in graph.node:
            node.output[:] = [inner if o == name else o for o in node.output]
        graph.node.append(helper.make_node("Identity", [inner], [name], name=f"{name}/output"))
    return split


def mistyped_nodes(graph: Any) -> list[str]:
    """Nodes of ``graph`` (subgraphs included) whose ``to`` or ``dtype`` attribute makes
    float32 where the graph declares their first output float16: onnxconverter-common
    retypes every float32 tensor but leaves such attributes as they were."""
    from onnx import AttributeProto, TensorProto

    declared: dict[str, int] = {}

    def collect(g: Any) -> None:
        for info in (*g.value_info, *g.output):
            declared[info.name] = info.type.tensor_type.elem_type
        for node in g.node:
            for sub in subgraphs(node):
                collect(sub)

    collect(graph)
    return [n.name for n in all_nodes(graph) for a in n.attribute
            if a.name in ("to", "dtype") and a.type == AttributeProto.INT and a.i == TensorProto.FLOAT
            and n.output and declared.get(n.output[0]) == TensorProto.FLOAT16]


def _ort_type_error(model: Any) -> list[str]:
    """The node onnxruntime names when it refuses ``model`` for a type error, or []."""
    import re

    from optbuild.backends.onnxruntime.loader import session

    try:
        session(model.SerializeToString(), level="disable")
    except Exception as exc:
        found = re.findall(r"Type Error: .* of node \(([^()]+)\)", str(exc))
        return found[-1:]
    return []


def fp16_hint(exc: BaseException, node_block_list: list[str]) -> str:
    """For a float16 model onnxruntime refuses naming a node: how to keep it float32."""
    import re

    nodes = re.findall(r"of node \(([^()]+)\)", str(exc))
    if not nodes:
        return ""
    return (f"\nhint: keep the node float32 with node_block_list = {[*node_block_list, nodes[-1]]!r} "
            f"on this step (a node of the converter's own, such as '<node>_input_cast0', names the "
            f"node to block before its suffix), or its op type in op_block_list")


def _keep_float32(model: Any, names: list[str]) -> None:
    """Turn the named float16 graph inputs/outputs back to float32 with Cast nodes at the border."""
    from onnx import TensorProto, helper

    graph = model.graph
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name: v for v in graph.output}
    new_nodes = []
    for name in names:
        if name in inputs and inputs[name].type.tensor_type.elem_type == TensorProto.FLOAT16:
            inner = f"{name}/float16"
            rename_uses(graph, name, inner)
            inputs[name].type.tensor_type.elem_type = TensorProto.FLOAT
            new_nodes.append(helper.make_node("Cast", [name], [inner], name=f"{name}/to_float16",
                                              to=TensorProto.FLOAT16))
    if new_nodes:
        nodes = [*new_nodes, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    for name in names:
        if name in outputs and outputs[name].type.tensor_type.elem_type == TensorProto.FLOAT16:
            inner = f"{name}/float16"
            for node in graph.node:
                node.output[:] = [inner if o == name else o for o in node.output]
            rename_uses(graph, name, inner)
            for info in graph.value_info:
                if info.name == name:
                    info.name = inner
            outputs[name].type.tensor_type.elem_type = TensorProto.FLOAT
            graph.node.append(helper.make_node("Cast", [inner], [name], name=f"{name}/to_float32",
                                               to=TensorProto.FLOAT))
