"""Where top-1 agreement means something: which axis of an output holds class scores, read
from the ONNX graph that computes it (a Softmax, a linear layer, a 1x1 Conv) and from its shape.
Verify and the INT8 report ask this before they take an argmax.

onnx and numpy are imported inside the functions: the CLI imports the step modules, and so
this one, at load time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
