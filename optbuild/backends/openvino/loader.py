"""Importing OpenVINO and NNCF, describing OpenVINO models as ``TensorSpec``s and manifest
entries, and compiling them for the CPU: one way for the engine step and the runner.

OpenVINO's model converter (``openvino.convert_model``, imported by ``import openvino``
itself) and NNCF report usage to Google Analytics through the ``openvino_telemetry``
package unless the user opted out on this machine, and write a client id under ~/intel as
soon as they are imported. A build must not phone home nor write outside its own folders,
so the imports here block that package first: both libraries then fall back to their
built-in no-op stubs (they import it inside ``try ... except ImportError``). Import
openvino and nncf through this module only.

Everything heavy is imported inside the functions.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from optbuild.backends.base import TensorSpec

# Where the engine step records its performance hint in the IR (rt_info), beside engine.json.
RT_INFO_HINT = ["optbuild", "hint"]
RT_INFO_PRECISION = ["optbuild", "precision"]
# The inference precision an IR of each precision (engine step's ``precision``) runs at,
# whatever the CPU; the others run at the CPU plugin's default (bf16 or f16 where the CPU
# computes it natively: AVX512_BF16, AMX, ARM fp16).
PINNED_PRECISION = {"fp32": "f32"}

_DTYPES = {
    "f32": "float32", "f16": "float16", "f64": "float64", "bf16": "bfloat16", "i64": "int64",
    "i32": "int32", "i16": "int16", "i8": "int8", "u64": "uint64", "u32": "uint32", "u16": "uint16",
    "u8": "uint8", "boolean": "bool", "string": "str",
}


def block_telemetry() -> None:
    """Keep ``openvino_telemetry`` from being imported in this process (see the module
    docstring). Has no effect once it has been imported."""
    if "openvino_telemetry" not in sys.modules:
        sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]  # import raises ImportError


def import_openvino() -> Any:
    block_telemetry()
    import openvino

    return openvino


def import_nncf() -> Any:
    """NNCF, its own log quietened to warnings (it imports torch when torch is installed:
    about 3 s more)."""
    import logging

    block_telemetry()
    import nncf

    nncf.set_log_level(logging.WARNING)
    return nncf


def short_version(ov: Any) -> str:
    """"2026.4.1" of "2026.4.1-22982-e213a147257-releases/2026/4"."""
    return str(ov.get_version()).split("-")[0]


def dtype_name(element_type: Any) -> str:
    """The numpy dtype name of an OpenVINO element type ("float32"); its own name when numpy
    has none."""
    name = element_type.get_type_name()
    return _DTYPES.get(name, name)


def port_name(port: Any, index: int, kind: str) -> str:
    """A port's tensor name (the ONNX name it came from); "input0" / "output0" when it has none."""
    names = port.get_names()
    return port.get_any_name() if names else f"{kind}{index}"


def dims(partial_shape: Any) -> tuple[int | None, ...]:
    """Static dims as ints, dynamic (bounded or not) as None; () for a dynamic rank."""
    if partial_shape.rank.is_dynamic:
        return ()
    return tuple(d.get_length() if d.is_static else None for d in partial_shape)


def shape_entry(partial_shape: Any) -> list[Any] | None:
    """A shape for engine.json: a size for a fixed dim, [min, max] for a bounded one, [min,
    null] for one bounded below only, null for an unbounded one; null for a dynamic rank.
    The openvino backend's ``unfit`` reads it back."""
    if partial_shape.rank.is_dynamic:
        return None
    out: list[Any] = []
    for d in partial_shape:
        low, high = d.get_min_length(), d.get_max_length()
        if d.is_static:
            out.append(d.get_length())
        elif high < 0:
            out.append([low, None] if low > 0 else None)
        else:
            out.append([low, high])
    return out


def input_specs(model: Any) -> list[TensorSpec]:
    """The inputs of an ``openvino.Model`` or ``CompiledModel``."""
    return _specs(model.inputs, "input")


def output_specs(model: Any) -> list[TensorSpec]:
    """The outputs of an ``openvino.Model`` or ``CompiledModel``."""
    return _specs(model.outputs, "output")


def _specs(ports: Any, kind: str) -> list[TensorSpec]:
    return [TensorSpec(port_name(p, i, kind), dtype_name(p.get_element_type()), dims(p.get_partial_shape()))
            for i, p in enumerate(ports)]


def describe_ports(ports: Any, kind: str) -> list[dict[str, Any]]:
    """[{"name", "dtype", "shape"}] for engine.json."""
    return [{"name": port_name(p, i, kind), "dtype": dtype_name(p.get_element_type()),
             "shape": shape_entry(p.get_partial_shape())} for i, p in enumerate(ports)]


def rt_info(model: Any, path: list[str]) -> str | None:
    """A string the IR carries in its rt_info at ``path``, or None."""
    if not model.has_rt_info(path):
        return None
    return str(model.get_rt_info(path).astype(str))


def compile_config(hint: str | None = None, inference_precision: str | None = None,
                   threads: int | None = None) -> dict[str, Any]:
    """CPU plugin properties: PERFORMANCE_HINT ("latency" -> LATENCY), INFERENCE_PRECISION_HINT
    ("f32"), INFERENCE_NUM_THREADS; what is None is left to the plugin."""
    config: dict[str, Any] = {}
    if hint:
        config["PERFORMANCE_HINT"] = hint.upper()
    if inference_precision:
        config["INFERENCE_PRECISION_HINT"] = inference_precision
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


def compile_model(model: Any, *, hint: str | None = None, inference_precision: str | None = None,
                  threads: int | None = None, core: Any = None) -> Any:
    """``model`` (an ``openvino.Model`` or an IR path) compiled for the CPU. Without a
    ``hint``, the one the engine step stored in the IR's rt_info applies, if any; without an
    ``inference_precision``, the one its precision there pins (PINNED_PRECISION). A pinned
    precision is read back from the compiled model: the plugin may silently pick another
    (f16 asked of an x86 CPU without AMX-FP16 gives bf16 or f32), and a figure said to be
    f32 must be one."""
    ov = import_openvino()
    core = core or ov.Core()
    if not hasattr(model, "inputs"):
        model = core.read_model(str(model))
    hint = hint or rt_info(model, RT_INFO_HINT)
    inference_precision = inference_precision or PINNED_PRECISION.get(rt_info(model, RT_INFO_PRECISION) or "")
    compiled = core.compile_model(model, "CPU", compile_config(hint, inference_precision, threads))
    if inference_precision and (actual := compiled_precision(compiled)) != inference_precision:
        raise ValueError(f"inference precision {inference_precision} was asked, the CPU plugin compiled the model "
                         f"at {actual} (this CPU has no {inference_precision} kernels)")
    return compiled


def compiled_precision(compiled: Any) -> str:
    """The inference precision a compiled model computes at, in OpenVINO's notation ("f32",
    "bf16", "f16")."""
    return compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()


# --- OpenVINO's messages -------------------------------------------------------------------
_NOISE = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:\d+:|FrontEnd API failed with \w+:|"
                    r"Model wasn't fully converted\..*|Summary:|Failed operations detailed log:)\s*")
_NO_RULE = re.compile(r"No conversion rule found for operations: (.+)")
_FAILED_OP = re.compile(r"^-- (\S+) with a message:")
_NODE = re.compile(r"While validating ONNX node '<Node\((\w+)\): ([^>]*)>'")


def message(exc: BaseException, limit: int = 400) -> str:
    """OpenVINO's message without its source locations ("Exception from src/...cpp:84:",
    "Check '...' failed at ..."), on one line."""
    lines = [_NOISE.sub("", line).strip() for line in str(exc).splitlines()]
    text = " ".join(line for line in lines if line) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def conversion_failure(exc: BaseException) -> str:
    """What OpenVINO could not convert, from its OpConversionFailure: the ops it has no rule
    for, or the ops (and ONNX nodes, by output) whose conversion failed, with the reason."""
    text = str(exc)
    missing = _NO_RULE.search(text)
    if missing:
        return f"OpenVINO has no conversion rule for {missing.group(1).strip()}"
    lines = [line.strip() for line in text.split("Summary:")[0].splitlines()]
    failed = [m.group(1) for line in lines if (m := _FAILED_OP.match(line))]
    nodes = [f"{m.group(1)} node (output {m.group(2)!r})" for m in _NODE.finditer(text)]
    if not (failed or nodes):
        return message(exc)
    reasons = [line for line in lines if line and not _NOISE.match(line) and not _FAILED_OP.match(line)
               and not line.startswith(("[ONNX Frontend] Conversion failed", "While validating"))]
    return (f"converting {', '.join(nodes or failed)} failed"
            + (f": {message(Exception(' '.join(reasons)))}" if reasons else ""))
