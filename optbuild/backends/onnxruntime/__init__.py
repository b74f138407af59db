"""onnxruntime on the CPU: ONNX and ORT-format models. ``loader`` makes sessions, ``runner``
feeds them; this module only describes the backend and imports nothing heavy."""

from __future__ import annotations

import typing
from functools import cache
from pathlib import Path

from optbuild.backends.base import Backend, Manifest, Runner, module_missing

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


@cache
def distribution() -> str:
    """The installed distribution whose onnxruntime ``import onnxruntime`` loads ("onnxruntime",
    "onnxruntime-gpu", ...): its version keys the steps that run onnxruntime. Read from
    metadata, not imported."""
    from optbuild.common.toolchain import loaded_distribution

    return loaded_distribution("onnxruntime")[0] or "onnxruntime"


class OnnxRuntime(Backend):
    name = "onnxruntime"
    label = "onnxruntime"
    short = "ORT"
    extra = "onnx"
    suffixes = (".onnx", ".ort")

    def distributions(self) -> tuple[str, ...]:
        return (distribution(), "numpy")

    def host_fields(self, manifest: Manifest) -> tuple[str, ...]:
        return ("cpu.arch", "cpu.flags")  # quantized kernels differ between CPUs (VNNI or not)

    def unavailable(self, host: Fingerprint, manifest: Manifest) -> str | None:
        missing = module_missing("onnxruntime", "onnxruntime", self.extra)
        return f"needs {missing}" if missing else None

    def open(self, model: Path, manifest: Manifest, host: Fingerprint, *, threads: int | None = None,
             literal: bool = False) -> Runner:
        from optbuild.backends.onnxruntime.runner import OrtRunner

        return OrtRunner(model, threads=threads, level="disable" if literal else None)


BACKEND = OnnxRuntime()
