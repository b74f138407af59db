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


def max_errors(reference: list[np.ndarray], candidate: list[np.ndarray]) -> tuple[float, float]:
    """(max absolute error, max error relative to the reference's largest magnitude)."""
    if len(reference) != len(candidate):
        return float("inf"), float("inf")
    worst_abs = worst_rel = 0.0
    for ref, out in zip(reference, candidate):
        ref, out = np.asarray(ref, dtype=np.float64), np.asarray(out, dtype=np.float64)
        if ref.shape != out.shape:
            return float("inf"), float("inf")
        if ref.size == 0:
            continue
        err = float(np.max(np.abs(ref - out)))
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / max(float(np.max(np.abs(ref))), 1e-12))
    return worst_abs, worst_rel
