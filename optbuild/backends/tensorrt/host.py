"""What a host needs to run a TensorRT or TensorRT-RTX engine, read from its Fingerprint.

Everything here is cheap and imports nothing heavy: it answers ``unavailable`` at plan time,
and it is asked again before a runtime is created, since a TensorRT runtime created on a
host without a GPU can crash the process (CUDA error 35, then a segfault on deserialize).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Sequence

from optbuild.backends.base import has_module

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

# The compute capabilities TensorRT-RTX builds for, and those an engine built with no
# targets runs on (TensorRT-RTX docs, "CPU-only AOT": 8.0, 8.6, 8.9, 12.0 and later; Turing
# only when targeted). Hopper and datacenter Blackwell (sm90, sm100) are not among them.
RTX_TARGETS = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")
RTX_DEFAULT_TARGETS = ("sm80", "sm86", "sm89", "sm120", "sm121")

_TARGET = re.compile(r"^(?:sm_?(\d{2,3})|(\d{1,2})\.(\d))$", re.IGNORECASE)


def target_number(target: str) -> int:
    """86 for "sm86": the order of compute capabilities."""
    return int(target[2:])


def canonical_targets(values: Sequence[str]) -> list[str]:
    """"sm86", "sm_86", "SM86" and "8.6" as "sm86", deduplicated, in ascending order."""
    names = set()
    for target in values:
        match = _TARGET.match(target.strip())
        if match is None:
            hint = (" ('current' would tie the engine to the build host's GPU, which this key"
                    " does not cover)" if target.strip().lower() == "current" else "")
            raise ValueError(f"not a compute capability: {target!r} (write e.g. 'sm86' or "
                             f"'8.6'){hint}")
        sm = match.group(1) or f"{match.group(2)}{match.group(3)}"
        names.add(f"sm{int(sm)}")
    return sorted(names, key=target_number)


def gpu_target(host: Fingerprint, index: int = 0) -> str:
    """gpu.<index>'s compute capability as a target name ("sm89"); "sm" when unknown."""
    return "sm" + str(host.get(f"gpu.{index}.compute_capability") or "").replace(".", "")


def gpu_missing(host: Fingerprint) -> str | None:
    """Why ``host`` has no NVIDIA GPU to use ("NVIDIA driver not loaded"), or None."""
    if host.get("gpu.count"):
        return None
    error = str(host.get("gpu.error") or "none found")
    if error.startswith("no NVIDIA GPU (") and error.endswith(")"):
        error = error[len("no NVIDIA GPU ("):-1]
    return error


def _describe_gpu(host: Fingerprint) -> str:
    return (f"gpu.0 ({host.get('gpu.0.name')}, compute capability "
            f"{host.get('gpu.0.compute_capability')})")


def rtx_target_missing(host: Fingerprint, targets: Sequence[str]) -> str | None:
    """Why gpu.0 cannot run a TensorRT-RTX engine built for ``targets`` (empty: the
    default set), or None. Assumes a GPU is present."""
    sm = gpu_target(host)
    if targets:
        if sm not in targets:
            return f"{_describe_gpu(host)} is not among the targets {', '.join(targets)}"
    elif sm not in RTX_DEFAULT_TARGETS:
        return (f"{_describe_gpu(host)} is not among the GPUs a TensorRT-RTX engine built "
                f"with default targets runs on ({', '.join(RTX_DEFAULT_TARGETS)})")
    return None


def run_obstacle(backend: str, host: Fingerprint, targets: Sequence[str] = ()) -> str | None:
    """Why gpu.0 of ``host`` cannot run an engine of ``backend`` ("tensorrt" or
    "tensorrt-rtx", the latter built for ``targets``), or None. Python modules aside."""
    if not host.get("gpu.count"):
        return host.get("gpu.error") or "no NVIDIA GPU"
    if backend == "tensorrt-rtx":
        return rtx_target_missing(host, targets)
    return None


def cudart_missing(extra: str) -> str | None:
    """What to install when cuda-python's runtime bindings are absent; None when present."""
    if has_module("cuda.bindings.runtime") or has_module("cuda.cudart"):
        return None
    return f"cuda-python (pip install 'optbuild[{extra}]')"


def runtime_distribution(module: str) -> str:
    """The installed distribution whose ``module`` ``import`` loads (its version keys what it
    builds or runs), or the name to install when it is absent. From metadata: nothing is imported."""
    from optbuild.common.toolchain import DISTRIBUTIONS, loaded_distribution

    distribution, _ = loaded_distribution(module)
    return distribution or DISTRIBUTIONS[module][-1]
