"""onnxruntime: ONNX and ORT-format models, on the execution provider their artifact names.

A plain model runs on the CPU. An onnxruntime engine step writes an ``engine.json`` beside
its model naming the provider it optimized for ({"backend": "onnxruntime", "provider":
"CUDAExecutionProvider"}): verify and benchmark run it there, never silently on the CPU. On an
NVIDIA provider (CUDA, TensorRT) the results depend on the GPU's model and compute
capability, which key them (not its serial or UUID: two H100s give the same key); on the CPU,
on its arch and flags. The loaded distribution's version (onnxruntime-gpu where it is the one
``import onnxruntime`` loads) keys both. ``loader`` makes sessions, ``runner`` feeds them;
this module only describes the backend and imports nothing heavy.
"""

from __future__ import annotations

import typing
from functools import cache
from pathlib import Path

from optbuild.backends.base import Backend, Manifest, Runner, module_missing
from optbuild.backends.onnxruntime import providers
from optbuild.backends.onnxruntime.loader import LEVELS, SESSION_LEVELS
from optbuild.backends.onnxruntime.providers import CPU

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

GPU_FIELDS = ("gpu.0.name", "gpu.0.compute_capability")  # the kernels that ran on the GPU
CPU_FIELDS = ("cpu.arch", "cpu.flags")  # quantized kernels differ between CPUs (VNNI or not)


@cache
def distribution() -> str:
    """The installed distribution whose onnxruntime ``import onnxruntime`` loads ("onnxruntime",
    "onnxruntime-gpu", ...): its version keys the steps that run onnxruntime. Read from
    metadata, not imported."""
    from optbuild.common.toolchain import loaded_distribution

    return loaded_distribution("onnxruntime")[0] or "onnxruntime"


def provider(manifest: Manifest) -> str:
    """The execution provider ``manifest``'s model runs on: the one its engine step names,
    the CPU for a plain model."""
    return str(manifest.get("provider") or CPU)


class OnnxRuntime(Backend):
    name = "onnxruntime"
    label = "onnxruntime"
    short = "ORT"
    extra = "onnx"
    suffixes = (".onnx", ".ort")
    levels = LEVELS  # graph optimization levels; a level an engine step fixed is kept

    def level_setting(self, level: str) -> str:
        engine = f", or an onnxruntime engine step with level = \"{level}\"" if level in ("basic", "extended") else ""
        return f"graph_optimization_level = {SESSION_LEVELS[level]}{engine}"

    def distributions(self) -> tuple[str, ...]:
        return (distribution(), "numpy")

    def host_fields(self, manifest: Manifest) -> tuple[str, ...]:
        return GPU_FIELDS if providers.nvidia(provider(manifest)) else CPU_FIELDS

    def unavailable(self, host: Fingerprint, manifest: Manifest) -> str | None:
        if (missing := module_missing("onnxruntime", "onnxruntime", self.extra)) is not None:
            return f"needs {missing}"
        wanted = provider(manifest)
        if wanted == CPU:
            return None
        if not providers.nvidia(wanted):
            listed = wanted in _listed(host)
            return None if listed else f"needs the onnxruntime build with the {wanted}"
        gpu = bool(host.get("gpu.count"))
        # The probe lists an NVIDIA provider only where a GPU is, so without one (NVML says so)
        # the answer needs no import of onnxruntime: a plan stays light on a CPU host.
        listed = gpu and wanted in _listed(host)
        needs = []
        if not gpu:
            needs.append(f"a CUDA GPU (here: {host.get('gpu.error') or 'none found'})")
        # onnxruntime-gpu lists its NVIDIA providers only where a GPU is: without one, it is
        # the GPU alone that is missing
        if not listed and (gpu or host.get("onnxruntime.distribution") != "onnxruntime-gpu"):
            needs.append(providers.get(wanted).needs or f"the onnxruntime build with the {wanted}")
        return f"needs {' and '.join(needs)} for the {wanted}" if needs else None

    def open(self, model: Path, manifest: Manifest, host: Fingerprint, *, threads: int | None = None,
             literal: bool = False) -> Runner:
        from optbuild.backends.onnxruntime.runner import OrtRunner

        wanted = provider(manifest)
        device = f"gpu.0 ({host.get('gpu.0.name')})" if providers.nvidia(wanted) else ""
        return OrtRunner(model, provider=wanted, device=device, threads=threads,
                         level="disable" if literal else None)


def _listed(host: Fingerprint) -> list[str]:
    """The providers onnxruntime lists that can load on ``host`` (probing imports onnxruntime)."""
    return str(host.get("ort_providers.available") or "").split(",")


BACKEND = OnnxRuntime()
