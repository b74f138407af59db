"""Numeric checks of ONNX models with onnxruntime (CPU): any rewrite must be compared with
the model it came from. Imported only inside step runs (it loads numpy and onnxruntime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(path).run(None, feeds)

