"""Calibration samples for the corpus models: seeded, of the shapes and value ranges the
models take (PaddleOCR images normalised to [-1, 1], 16 kHz audio windows)."""

import numpy as np


def images(count: int = 8, seed: int = 0, height: int = 48, width: int = 192, name: str = "x"):
    """Uniform noise images in [-1, 1] (PaddleOCR's (x - 0.5) / 0.5 normalisation)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {name: rng.uniform(-1.0, 1.0, (1, 3, height, width)).astype(np.float32)}


def audio(count: int = 8, seed: int = 0):
    """Windows of 512 samples at 16 kHz, a fresh recurrent state each."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"input": (0.1 * rng.standard_normal((1, 512))).astype(np.float32),
               "state": np.zeros((2, 1, 128), np.float32),
               "sr": np.array(16000, dtype=np.int64)}
