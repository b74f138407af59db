"""Load a serialized engine for running: the host checked first, then the runtime.

The order matters: a TensorRT runtime created on a host without a usable GPU can take the
process down, so ``load_engine`` asks the host Fingerprint (NVML, no CUDA context) before
it creates one, and reports what is missing as ``StepUnavailable``, never as a crash.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.backends.tensorrt import Runtime
from optbuild.backends.tensorrt.host import run_obstacle
from optbuild.backends.tensorrt.logger import capture_logger, errors, quote
from optbuild.common.errors import StepError, StepUnavailable

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


@dataclass
class LoadedEngine:
    """A deserialized engine and what must outlive it (its runtime) or run it (cudart)."""

    trt: Any  # the tensorrt / tensorrt_rtx module
    runtime: Any
    engine: Any
    cudart: Any  # cuda-python's runtime bindings
    label: str  # "TensorRT-RTX 1.7.1.116", for messages
    device: str  # "gpu.0 (NVIDIA GeForce RTX 4090)", for messages


def import_cudart() -> Any | None:
    """cuda-python's CUDA runtime bindings, or None when cuda-python is not installed."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python before 12.6
        except ImportError:
            return None
    return cudart


def _diagnostics(trt: Any, bits: Any) -> str:
    """Names of the EngineInvalidityDiagnostics flags set in ``bits``."""
    flags = getattr(trt, "EngineInvalidityDiagnostics", None)
    members = getattr(flags, "__members__", {})
    names = [name.lower().replace("_", " ") for name, m in members.items() if int(bits) & int(m)]
    return ", ".join(names) or f"diagnostics {int(bits)}"


def load_engine(trt: Any, plan: Any, host: Fingerprint, *, runtime: Runtime,
                targets: Sequence[str] = (), logger: Any = None) -> LoadedEngine:
    """Deserialize ``plan`` (bytes or TensorRT's host memory) with module ``trt`` on gpu.0.

    StepUnavailable when the host cannot run it (no GPU, a TensorRT-RTX engine whose
    ``targets`` exclude gpu.0, no cuda-python, an engine the runtime calls invalid here);
    StepError when the runtime fails to load it, with the runtime's logged errors.
    """
    reason = run_obstacle(runtime.backend, host, targets)
    if reason is not None:
        raise StepUnavailable(reason)
    cudart = import_cudart()
    if cudart is None:
        raise StepUnavailable(f"cuda-python is not installed (pip install 'optbuild[{runtime.extra}]')")
    logger = logger if logger is not None else capture_logger(trt)
    device = f"gpu.0 ({host.get('gpu.0.name')})"
    trt_runtime = trt.Runtime(logger)
    if hasattr(trt_runtime, "get_engine_validity"):
        validity, diagnostics = trt_runtime.get_engine_validity(plan)
        if validity == trt.EngineValidity.INVALID:
            raise StepUnavailable(f"the engine is not valid on gpu.0 ({_diagnostics(trt, diagnostics)})")
    engine = trt_runtime.deserialize_cuda_engine(plan)
    label = f"{runtime.label} {trt.__version__}"
    if engine is None:
        raise StepError(f"{label} cannot load the engine on {device}:\n" + quote(errors(trt, logger)))
    return LoadedEngine(trt, trt_runtime, engine, cudart, label, device)


def open_engine(path: Path, host: Fingerprint, *, runtime: Runtime,
                targets: Sequence[str] = ()) -> LoadedEngine:
    """Load the engine file ``path`` for ``runtime``, importing its module only once the
    host is known to be able to run it."""
    reason = run_obstacle(runtime.backend, host, targets)
    if reason is not None:
        raise StepUnavailable(reason)
    try:
        trt = importlib.import_module(runtime.module)
    except ImportError as exc:
        raise StepUnavailable(f"{runtime.label}'s Python module {runtime.module!r} does not import "
                              f"({exc}; pip install 'optbuild[{runtime.extra}]')") from None
    return load_engine(trt, Path(path).read_bytes(), host, runtime=runtime, targets=targets)
