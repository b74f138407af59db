"""A small image classifier: 3x64x64 -> 10 classes. Fixed-seed convolutions, BatchNorm and head
fitted to calib.py's scenes (deterministic, nothing downloaded)."""

from __future__ import annotations

import numpy as np
import torch
from blocks import conv_block
from calib import scenes
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            conv_block(3, 16), nn.MaxPool2d(2),
            conv_block(16, 32), nn.MaxPool2d(2),
            conv_block(32, 64), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(image), 1))


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = SmallCNN()
    fit(model)
    return model.eval(), (torch.randn(2, 3, 64, 64),)


@torch.no_grad()
def fit(model: SmallCNN, count: int = 128, margin: float = 4.0) -> None:
    """Stand in for training, deterministically, on example images (a seed apart from those of
    calibration and verify): BatchNorm statistics estimated on them, then the head fitted by
    least squares to give scene k class k, ``margin`` above the others. With random statistics
    and head the output hardly depends on the image, so verify could not tell a good variant
    from a constant one. In float64, so that the float32 weights come out the same whatever
    the CPU and its thread count."""
    kinds, pictures = zip(*scenes(count, seed=2))
    batch = torch.from_numpy(np.stack(pictures)).double()
    model.double()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the batch
    model.train()
    model.features(batch)
    model.eval()
    features = torch.flatten(model.features(batch), 1)
    design = torch.cat([features, torch.ones(count, 1, dtype=torch.float64)], 1)
    targets = nn.functional.one_hot(torch.tensor(kinds), model.head.out_features).double() * margin
    ridge = 1e-3 * torch.eye(design.shape[1], dtype=torch.float64)
    solution = torch.linalg.solve(design.T @ design + ridge, design.T @ targets)
    model.head.weight.copy_(solution[:-1].T)
    model.head.bias.copy_(solution[-1])
    model.float()
