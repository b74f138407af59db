"""Small ONNX models made with onnx.helper, shared by the step tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def save(model, path: Path) -> Path:
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_mlp(path: Path, seed: int = 0, scale: float = 1.0) -> Path:
    """x: float32 [batch, 4] -> MatMul 4x8 -> Add -> Relu -> MatMul 8x3 -> y: float32 [batch, 3]."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 8)) * scale).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
         helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w1, b1, w2],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def make_two_inputs(path: Path) -> Path:
    """a: float32 [batch, 4], ids: int64 [batch, 2] -> mean of embeddings + a -> MatMul -> y [batch, 3]."""
    rng = np.random.default_rng(1)
    emb = numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "emb")
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
         helper.make_node("ReduceMean", ["e"], ["m"], name="pool", axes=[1], keepdims=0),
         helper.make_node("Add", ["m", "a"], ["s"], name="add"),
         helper.make_node("MatMul", ["s", "w"], ["y"], name="fc")],
        "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [emb, w],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def make_linear(path: Path, w: Any, output: str = "y") -> Path:
    """``output`` = x @ w: one MatMul ("fc") over x [batch, rows of w], ``w`` a float32 matrix."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], [output], name="fc")], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w.shape[0]])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", w.shape[1]])],
        [numpy_helper.from_array(w, "w")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def graph_model(path: Path, nodes: list, inputs: list, outputs: list, initializers: Sequence[Any] = (),
                opsets: Sequence[tuple[str, int]] = (("", 17),)) -> Path:
    """A model of ``nodes`` saved unchecked (some are meant to fail onnx.checker)."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]), str(path))
    return path


def value(name: str, dims: list, elem: int | None = None):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, elem or TensorProto.FLOAT, dims)


def input_dims(path: Path) -> list:
    import onnx

    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    return [d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
            for d in dims]


def cancelling_model(path: Path) -> Path:
    """Conv with bias 1 and tiny weights, then a BatchNormalization subtracting that 1 again:
    outputs near 1e-6 computed through values near 1, as in PaddleOCR's detector, whose
    sigmoid output peaks at 1e-5. Folding BN into the conv drops the detour through 1, so the
    result differs from the input model by float32 rounding at 1 (6e-8): 1% of its outputs."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((4, 3, 3, 3)) * 1e-6, "cb": np.ones(4), "s": np.ones(4),
              "b": np.zeros(4), "m": np.ones(4), "v": np.ones(4) - 1e-5}
    return graph_model(path, [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
        [value("x", ["batch", 3, 8, 8])], [value("y", ["batch", 4, 8, 8])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()])


def make_convnet(path: Path) -> Path:
    """x: float32 [batch, 8, 16, 16] -> Conv 3x3 + bias -> Relu -> Conv 3x3 -> y [batch, 16, 16, 16]."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2, "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])],
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, 16, 16])],
        [w1, b1, w2],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
