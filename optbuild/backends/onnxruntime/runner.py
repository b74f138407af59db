"""A Runner over an onnxruntime session on the execution provider its artifact names.

On the CPU a feed dict runs as it is. On an NVIDIA provider (CUDA, TensorRT) inputs and
outputs are bound on gpu.0 with an IOBinding: ``infer`` copies the feed there and the
outputs back; ``timed_call`` copies the feed once, beforehand, so that each call times the
inference on the device, not the host copies. ``run_with_iobinding`` returns when the device
is done: onnxruntime synchronizes the providers' streams at the end of each run unless the
run option "disable_synchronize_execution_providers" is set, which this runner never does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import Runner, TensorSpec
from optbuild.backends.onnxruntime import providers
from optbuild.backends.onnxruntime.loader import (
    DEVICE_ID,
    Level,
    input_specs,
    output_specs,
    session,
    short_names,
)

if TYPE_CHECKING:
    import numpy as np


class OrtRunner(Runner):
    """Runs an .onnx or .ort model on ``provider`` (``device``: what reports call the GPU,
    e.g. "gpu.0 (NVIDIA H100 80GB HBM3)", for an NVIDIA provider) at graph optimization
    ``level`` (None: onnxruntime's default, "all"), which may be set until it is entered: verify,
    benchmark and select open a model at a lower level where it crashed at a higher one."""

    def __init__(self, model: Path, *, provider: str = providers.CPU, device: str = "", threads: int | None = None,
                 level: Level | None = None):
        self.model, self.provider, self.device = Path(model), provider, device
        self.threads, self.level = threads, level
        self.session: Any = None
        self._outputs: list[str] = []

    @property
    def on_gpu(self) -> bool:
        return providers.nvidia(self.provider)

    def _open(self) -> None:
        import onnxruntime

        self.session = session(self.model, self.level, self.threads or 0, self.provider)
        self._outputs = [o.name for o in self.session.get_outputs()]
        ran = f"onnxruntime {onnxruntime.__version__} ({short_names(self.session.get_providers())})"
        self.label = f"{ran} on {self.device}" if self.on_gpu and self.device else ran

    def _close(self) -> None:
        self.session = None

    def input_specs(self) -> list[TensorSpec]:
        return input_specs(self.session)

    def output_specs(self) -> list[TensorSpec]:
        return output_specs(self.session)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.on_gpu:
            return dict(zip(self._outputs, self.session.run(self._outputs, dict(feed))))
        binding = self._bind(feed)
        self.session.run_with_iobinding(binding)
        return dict(zip(self._outputs, binding.copy_outputs_to_cpu()))

    def timed_call(self, feed: Mapping[str, np.ndarray]) -> Callable[[], object]:
        if not self.on_gpu:
            return super().timed_call(feed)
        binding, run = self._bind(feed), self.session.run_with_iobinding
        return lambda: run(binding)

    def _bind(self, feed: Mapping[str, np.ndarray]) -> Any:
        """An IOBinding with ``feed`` copied to gpu.0 and every output left there."""
        import numpy as np
        import onnxruntime

        binding = self.session.io_binding()
        for name, value in feed.items():
            on_device = onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", DEVICE_ID)
            binding.bind_ortvalue_input(name, on_device)
        for name in self._outputs:
            binding.bind_output(name, "cuda", DEVICE_ID)
        return binding
