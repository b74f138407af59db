"""onnxruntime sessions on the CPU, made one way for every caller, and their inputs as
``TensorSpec``. onnxruntime is imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from optbuild.backends.base import TensorSpec

Level = Literal["disable", "basic", "extended", "all"]

_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64", "tensor(int32)": "int32",
    "tensor(int16)": "int16", "tensor(int8)": "int8", "tensor(uint64)": "uint64",
    "tensor(uint32)": "uint32", "tensor(uint16)": "uint16", "tensor(uint8)": "uint8",
    "tensor(bool)": "bool", "tensor(string)": "str",
}


def session(path: Path, level: Level | None = None, threads: int = 0) -> Any:
    """A CPU InferenceSession over an .onnx or ORT-format (.ort) model; ``level`` None keeps
    onnxruntime's default graph optimizations, "disable" runs the graph as written."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if level is not None:
        options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[level]
    if Path(path).suffix == ".ort":
        options.add_session_config_entry("session.load_model_format", "ORT")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def input_specs(sess: Any) -> list[TensorSpec]:
    """A session's inputs; dims it leaves open are names or None."""
    return _specs(sess.get_inputs())


def output_specs(sess: Any) -> list[TensorSpec]:
    """A session's outputs, as ``input_specs``."""
    return _specs(sess.get_outputs())


def _specs(args: Any) -> list[TensorSpec]:
    specs = []
    for arg in args:
        dims = tuple(d if isinstance(d, int) and d >= 0 else (d if isinstance(d, str) and d else None)
                     for d in arg.shape)
        specs.append(TensorSpec(arg.name, _ORT_TYPES.get(arg.type, arg.type), dims))
    return specs
