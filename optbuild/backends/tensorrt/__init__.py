"""TensorRT and TensorRT-RTX engines at run time: what a host needs (``host``), loading
(``loader``), feeding numpy arrays through an engine (``runner``), fitting input shapes to
optimization profiles (``profiles``), and TensorRT's log as data (``logger``, which the
engine step's builder shares). Both libraries have the same runtime API; they differ in
module name, pip extra and the GPUs an engine runs on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Runtime:
    """One TensorRT flavour: the engine step's backend name and how to get its module."""

    backend: str  # "tensorrt" | "tensorrt-rtx", as recipes spell it
    module: str  # the Python module
    label: str  # for messages
    extra: str  # the optbuild pip extra that installs it (with cuda-python)


RUNTIMES: dict[str, Runtime] = {
    "tensorrt": Runtime("tensorrt", "tensorrt", "TensorRT", "gpu"),
    "tensorrt-rtx": Runtime("tensorrt-rtx", "tensorrt_rtx", "TensorRT-RTX", "rtx"),
}
