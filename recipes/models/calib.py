"""Seeded sample inputs for the example models: calibration data and held-out verify data.

Each function yields feed dicts (input name -> numpy array, batch of one), as the calibrate
and verify steps take from ``data = "models/calib.py:<function>"``; recipes pass ``count``
and ``seed`` with ``data_args`` (a different seed gives held-out samples). numpy only: the
shapes repeat those of cnn.py and transformer.py, so importing this file stays fast, and a
mismatch is caught by the steps' input checks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

IMAGE = (3, 64, 64)  # cnn.py: SmallCNN input
VOCAB = 1000  # transformer.py: vocabulary of both sizes
SEQ = 32  # transformer.py: TINY's sequence length (BASE's, 128, comes as data_args)


def images(count: int = 64, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Standard-normal images (the distribution cnn.py's example input comes from)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"image": rng.standard_normal((1, *IMAGE)).astype(np.float32)}


def tokens(count: int = 64, seed: int = 0, seq: int = SEQ) -> Iterator[dict[str, np.ndarray]]:
    """Uniform token ids over the vocabulary."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"tokens": rng.integers(0, VOCAB, size=(1, seq), dtype=np.int64)}
