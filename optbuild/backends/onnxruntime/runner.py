"""A Runner over an onnxruntime CPU session."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import Runner, TensorSpec
from optbuild.backends.onnxruntime.loader import Level, input_specs, output_specs, session

if TYPE_CHECKING:
    import numpy as np


class OrtRunner(Runner):
    """Runs an .onnx or .ort model on onnxruntime's CPU provider."""

    def __init__(self, model: Path, *, threads: int | None = None, level: Level | None = None):
        self.model, self.threads, self.level = Path(model), threads, level
        self.session: Any = None
        self._outputs: list[str] = []

    def _open(self) -> None:
        import onnxruntime

        self.session = session(self.model, self.level, self.threads or 0)
        self._outputs = [o.name for o in self.session.get_outputs()]
        self.label = f"onnxruntime {onnxruntime.__version__} (CPU)"

    def _close(self) -> None:
        self.session = None

    def input_specs(self) -> list[TensorSpec]:
        return input_specs(self.session)

    def output_specs(self) -> list[TensorSpec]:
        return output_specs(self.session)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self.session.run(self._outputs, dict(feed))))
