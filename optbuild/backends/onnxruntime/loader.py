"""onnxruntime sessions, made one way for every caller (verify, benchmark, the engine step,
the steps' checks, calibration and the INT8 report) on the execution provider they name, at
one of onnxruntime's graph optimization levels (``LEVELS``), and their inputs as
``TensorSpec``. onnxruntime is imported inside the functions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from optbuild.backends.base import TensorSpec
from optbuild.backends.onnxruntime.providers import CPU, session_list

Level = Literal["disable", "basic", "extended", "all"]
# onnxruntime's graph optimization levels, highest first, and the GraphOptimizationLevel each
# is (what a server sets: graph_optimization_level = ORT_ENABLE_BASIC, ...)
LEVELS: tuple[Level, ...] = ("all", "extended", "basic", "disable")
SESSION_LEVELS: dict[str, str] = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED",
                                  "basic": "ORT_ENABLE_BASIC", "disable": "ORT_DISABLE_ALL"}

DEVICE_ID = 0  # gpu.0: where a provider that runs on an NVIDIA GPU (providers.Provider.nvidia) runs

_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64", "tensor(int32)": "int32",
    "tensor(int16)": "int16", "tensor(int8)": "int8", "tensor(uint64)": "uint64",
    "tensor(uint32)": "uint32", "tensor(uint16)": "uint16", "tensor(uint8)": "uint8",
    "tensor(bool)": "bool", "tensor(string)": "str",
}


def providers_for(provider: str) -> list[Any]:
    """The providers list a session on ``provider`` is made with: it first, then what
    onnxruntime assigns the nodes it has no kernel for (``Provider.then``: TensorRT hands its
    leftovers to CUDA; every provider, to the CPU). NVIDIA providers on gpu.0."""
    return session_list(provider, DEVICE_ID)


def session(path: Path | bytes, level: Level | None = None, threads: int = 0, provider: str = CPU, *,
            save: Path | None = None) -> Any:
    """An InferenceSession over an .onnx or ORT-format (.ort) model, or a serialized ONNX
    model's bytes, on ``provider`` (``providers_for``); ``level`` None keeps onnxruntime's
    default graph optimizations, "disable" runs the graph as written. ``save``: write the
    optimized graph there (ORT format for a .ort name). The session's first provider is the
    one asked for, or RuntimeError: onnxruntime falls back to the CPU when a listed provider
    does not load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if level is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, SESSION_LEVELS[level])
    if not isinstance(path, bytes) and Path(path).suffix == ".ort":
        options.add_session_config_entry("session.load_model_format", "ORT")
    if save is not None:
        options.optimized_model_filepath = str(save)
        if save.suffix == ".ort":
            options.add_session_config_entry("session.save_model_format", "ORT")
    model = path if isinstance(path, bytes) else str(path)
    sess = ort.InferenceSession(model, options, providers=providers_for(provider))
    if (got := sess.get_providers()[0]) != provider:
        raise RuntimeError(f"onnxruntime fell back to {got}: {provider} is listed but did not load "
                           f"(onnxruntime {ort.__version__} lists {', '.join(ort.get_available_providers())})")
    return sess


def short_names(providers: Sequence[str]) -> str:
    """Providers as reports name them: "CUDA, CPU"."""
    return ", ".join(name.removesuffix("ExecutionProvider") for name in providers)


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
