"""Helpers for the engine tests: small ONNX models made with onnx.helper, step contexts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optbuild.common.fingerprint import Fingerprint
from optbuild.steps.base import Artifact, StepContext

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
requires_rtx = pytest.mark.skipif(not HAS_RTX, reason="tensorrt-rtx is not installed (pip install 'optbuild[rtx]')")


def _save(model: Any, path: Path) -> Path:
    import onnx

    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def matmul_relu(path: Path, fp16: bool = False) -> Path:
    """x[batch, 16] -> MatMul(16x8) -> Relu -> y[batch, 8]; fp16 makes every tensor float16."""
    from onnx import TensorProto, helper, numpy_helper

    dtype, np_dtype = (TensorProto.FLOAT16, np.float16) if fp16 else (TensorProto.FLOAT, np.float32)
    weight = numpy_helper.from_array(np.random.default_rng(1).standard_normal((16, 8)).astype(np_dtype), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["mm_out"], name="matmul"),
         helper.make_node("Relu", ["mm_out"], ["y"], name="relu")],
        "matmul_relu",
        [helper.make_tensor_value_info("x", dtype, ["batch", 16])],
        [helper.make_tensor_value_info("y", dtype, ["batch", 8])],
        [weight],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def small_convnet(path: Path, fp16: bool = False) -> Path:
    """image[N, 3, H, W] -> Conv-Relu-MaxPool-Conv-GlobalAveragePool -> out[N, 4, 1, 1]."""
    from onnx import TensorProto, helper, numpy_helper

    dtype, np_dtype = (TensorProto.FLOAT16, np.float16) if fp16 else (TensorProto.FLOAT, np.float32)
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np_dtype), name)
             for name, shape in (("W1", (8, 3, 3, 3)), ("B1", (8,)), ("W2", (4, 8, 3, 3)))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Conv", ["p1", "W2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
         helper.make_node("GlobalAveragePool", ["c2"], ["out"], name="gap")],
        "convnet",
        [helper.make_tensor_value_info("image", dtype, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("out", dtype, ["N", 4, 1, 1])],
        inits,
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def qdq_matmul(path: Path) -> Path:
    """The MatMul+Relu model with INT8 QuantizeLinear/DequantizeLinear on input and weight."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "zero"),
    ]
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "x_scale", "zero"], ["xq"], name="quant_x"),
         helper.make_node("DequantizeLinear", ["xq", "x_scale", "zero"], ["xd"], name="dequant_x"),
         helper.make_node("QuantizeLinear", ["W", "w_scale", "zero"], ["wq"], name="quant_w"),
         helper.make_node("DequantizeLinear", ["wq", "w_scale", "zero"], ["wd"], name="dequant_w"),
         helper.make_node("MatMul", ["xd", "wd"], ["mm_out"], name="matmul"),
         helper.make_node("Relu", ["mm_out"], ["y"], name="relu")],
        "qdq_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        inits,
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def unknown_op(path: Path) -> Path:
    """Valid protobuf, but node 'mystery' uses an operator no parser knows."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("FrobnicateOp", ["r"], ["y"], name="mystery", domain="example.custom")],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("example.custom", 1)])
    path.parent.mkdir(parents=True, exist_ok=True)
    import onnx

    onnx.save(model, str(path))
    return path


MATMUL_PROFILE = [{"x": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}]
CONV_PROFILE = [{"image": {"min": [1, 3, 32, 32], "opt": [4, 3, 64, 64], "max": [8, 3, 64, 64]}}]


def make_ctx(tmp_path: Path, model: Path, name: str = "engine", host: Fingerprint | None = None,
             state_dir: Path | None = None) -> StepContext:
    """A fresh output folder for one run of an engine step on ``model``."""
    out_dir = tmp_path / "out" / name
    n = 0
    while out_dir.exists():
        n += 1
        out_dir = tmp_path / "out" / f"{name}-{n}"
    out_dir.mkdir(parents=True)
    artifact = Artifact(step="model", dir=model.parent, files={model.name: model}, primary=model)
    return StepContext(
        step_id=f"test:{name}", base_dir=tmp_path, project_root=tmp_path, out_dir=out_dir,
        inputs={"input": artifact}, host=host if host is not None else Fingerprint(),
        state_dir=state_dir if state_dir is not None else tmp_path / "state",
    )


def needs_module(name: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (pip install 'optbuild[{extra}]')")
