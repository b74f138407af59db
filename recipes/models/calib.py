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
SCENES = 4  # kinds of image, each with its own colour cast, gradient and square (cnn.py: classes 0-3)
VOCAB = 1000  # transformer.py: vocabulary of both sizes
SEQ = 32  # transformer.py: TINY's sequence length (BASE's, 128, comes as data_args)


def images(count: int = 64, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Images of SCENES kinds of scene: a colour cast, a gradient and a bright square, each
    scene's own, under pixel noise. Pure noise would not do: a CNN's global pooling averages it
    away, so its output would hardly change from image to image and verify could not tell a
    good variant from a constant one."""
    for _, image in scenes(count, seed):
        yield {"image": image[None]}


def scenes(count: int = 64, seed: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(kind, image) pairs, the samples of images() with their scene: cnn.py fits its head on
    them."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        kind = int(rng.integers(SCENES))
        yield kind, _scene(kind, rng)


def _scene(kind: int, rng: np.random.Generator) -> np.ndarray:
    """One image of scene ``kind`` (channels, height, width), about unit scale."""
    look = np.random.default_rng(1000 + kind)  # the scene's fixed look, not the sample's
    cast = look.normal(0.0, 1.0, size=(3, 1, 1))
    angle = look.uniform(0.0, 2 * np.pi)
    y, x = np.mgrid[-1:1:IMAGE[1] * 1j, -1:1:IMAGE[2] * 1j]
    gradient = np.cos(angle) * x + np.sin(angle) * y
    top, left = look.integers(0, IMAGE[1] - 24, size=2)
    square = np.zeros(IMAGE[1:])
    square[top:top + 24, left:left + 24] = 1.5
    image = cast + look.normal(0.0, 1.0, size=(3, 1, 1)) * (gradient + square)
    return (image + rng.normal(0.0, 0.3, size=IMAGE)).astype(np.float32)


def tokens(count: int = 64, seed: int = 0, seq: int = SEQ) -> Iterator[dict[str, np.ndarray]]:
    """Uniform token ids over the vocabulary."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"tokens": rng.integers(0, VOCAB, size=(1, seq), dtype=np.int64)}
