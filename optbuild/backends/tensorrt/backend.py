"""TensorRT and TensorRT-RTX as backends (optbuild.backends.base): engines with an
``engine.json`` naming them, run on gpu.0 through ``TrtRunner``. Nothing heavy is imported
until a runner is entered."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optbuild.backends.base import Backend, Manifest, Runner, module_missing
from optbuild.backends.tensorrt import RUNTIMES, Runtime
from optbuild.backends.tensorrt.host import (
    cudart_missing,
    gpu_missing,
    rtx_target_missing,
    runtime_distribution,
)

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


def manifest_targets(manifest: Manifest) -> list[str]:
    """The compute capabilities an engine runs on, from its manifest; empty: the default."""
    targets = manifest.get("targets")
    return [] if targets in (None, "default") else list(targets)


class TensorRT(Backend):
    """TensorRT: an engine runs on GPUs of the compute capability it was built on."""

    name = "tensorrt"
    label = "TensorRT"
    short = "TRT"
    extra = "gpu"
    runtime: Runtime = RUNTIMES["tensorrt"]
    gpu_fields: tuple[str, ...] = ("gpu.0.compute_capability",)

    def distributions(self) -> tuple[str, ...]:
        return (runtime_distribution(self.runtime.module), "numpy")

    def host_fields(self, manifest: Manifest) -> tuple[str, ...]:
        return self.gpu_fields  # the kernels that ran depend on the GPU

    def unavailable(self, host: Fingerprint, manifest: Manifest) -> str | None:
        needs = []
        if (error := gpu_missing(host)) is not None:
            needs.append(f"an NVIDIA GPU to run the {self.label} engine (here: {error})")
        elif (why := self._gpu_unfit(host, manifest)) is not None:
            needs.append(f"a GPU the {self.label} engine runs on: {why}")
        for missing in (module_missing(self.runtime.module, self.label, self.extra), cudart_missing(self.extra)):
            if missing is not None:
                needs.append(missing)
        return "needs " + " and ".join(needs) if needs else None

    def unfit(self, manifest: Manifest, feed: Mapping[str, Any]) -> str | None:
        from optbuild.backends.tensorrt.profiles import ShapeMismatch, choose_profile, from_manifest

        inputs, profiles = from_manifest(manifest)
        if missing := [name for name in inputs if name not in feed]:
            return f"the feed lacks inputs {missing}"
        try:
            choose_profile(inputs, profiles, {name: feed[name].shape for name in inputs})
        except ShapeMismatch as exc:
            return str(exc)
        return None

    def _gpu_unfit(self, host: Fingerprint, manifest: Manifest) -> str | None:
        return None  # built on this host's GPU kind; TensorRT itself refuses a mismatch on load

    def open(self, model: Path, manifest: Manifest, host: Fingerprint, *, threads: int | None = None,
             literal: bool = False) -> Runner:
        from optbuild.backends.tensorrt.loader import open_engine
        from optbuild.backends.tensorrt.runner import TrtRunner

        return TrtRunner(lambda: open_engine(model, host, runtime=self.runtime,
                                             targets=manifest_targets(manifest)))


class TensorRTRTX(TensorRT):
    """TensorRT for RTX: engines built ahead of time for named compute capabilities and
    specialized for the GPU that loads them, so results depend on the GPU model too."""

    name = "tensorrt-rtx"
    label = "TensorRT-RTX"
    short = "TRT-RTX"
    extra = "rtx"
    runtime = RUNTIMES["tensorrt-rtx"]
    gpu_fields = ("gpu.0.compute_capability", "gpu.0.name")

    def _gpu_unfit(self, host: Fingerprint, manifest: Manifest) -> str | None:
        return rtx_target_missing(host, manifest_targets(manifest))


TENSORRT = TensorRT()
TENSORRT_RTX = TensorRTRTX()
