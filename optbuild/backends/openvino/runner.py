"""A Runner over an OpenVINO IR compiled for the CPU plugin.

On entering its ``with`` block it reads ``model.xml`` (and ``model.bin`` beside it) and
compiles it with the performance hint ("latency" or "throughput": the manifest's, else the
one the engine step stored in the IR's rt_info, else the plugin's default, latency), the
inference precision the manifest pins ("f32" for fp32 IRs; else the one the precision in the
IR's rt_info pins, else the plugin's default: bf16 on CPUs with AVX512_BF16 or AMX) and the
thread count asked for. The precision it computes at, read back from the compiled model, is
in its label ("OpenVINO 2026.4.1 (CPU, latency, f32)"), which verify and benchmark print.
``infer`` runs one synchronous request: with the throughput hint the plugin makes several
streams, of which one request uses one, so a single request is slower than under the
latency hint; throughput pays off with parallel asynchronous requests (``compiled``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import Runner, TensorSpec
from optbuild.backends.openvino import loader
from optbuild.common.errors import StepError

if TYPE_CHECKING:
    import numpy as np


class InferenceError(StepError):
    """The compiled model failed on a feed (OpenVINO's message, without source locations)."""


class OpenVINORunner(Runner):
    """Runs an IR on OpenVINO's CPU plugin; see the module docstring."""

    def __init__(self, model: Path, *, hint: str | None = None, inference_precision: str | None = None,
                 threads: int | None = None):
        self.model = Path(model)
        self.hint, self.inference_precision, self.threads = hint, inference_precision, threads
        self.compiled: Any = None
        self._request: Any = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []

    def _open(self) -> None:
        ov = loader.import_openvino()
        core = ov.Core()
        try:
            model = core.read_model(str(self.model))
        except Exception as exc:
            raise StepError(f"OpenVINO cannot read {self.model}: {loader.message(exc)}") from None
        try:
            self.compiled = loader.compile_model(model, hint=self.hint, core=core, threads=self.threads,
                                                 inference_precision=self.inference_precision)
        except Exception as exc:
            raise StepError(f"OpenVINO cannot compile {self.model.name} for the CPU: "
                            f"{loader.message(exc)}") from None
        self._request = self.compiled.create_infer_request()
        self._inputs = loader.input_specs(model)
        self._outputs = loader.output_specs(model)
        self.hint = str(self.compiled.get_property("PERFORMANCE_HINT")).lower()
        self.inference_precision = loader.compiled_precision(self.compiled)
        self.label = f"OpenVINO {loader.short_version(ov)} (CPU, {self.hint}, {self.inference_precision})"

    def _close(self) -> None:
        self._request = None
        self.compiled = None

    def input_specs(self) -> list[TensorSpec]:
        return list(self._inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self._outputs)

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        index = {spec.name: i for i, spec in enumerate(self._inputs)}
        unknown = [name for name in feed if name not in index]
        if unknown:
            raise StepError(f"{self.model.name} has no inputs {unknown} (its inputs: "
                            f"{', '.join(str(s) for s in self._inputs)})")
        try:
            results = self._request.infer({index[name]: value for name, value in feed.items()})
        except RuntimeError as exc:
            raise InferenceError(f"OpenVINO failed to run {self.model.name}: {loader.message(exc)}") from None
        return {spec.name: results[i] for i, spec in enumerate(self._outputs)}
