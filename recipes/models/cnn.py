"""A small image classifier: 3x64x64 -> 10 classes. Fixed-seed weights, nothing downloaded."""

from __future__ import annotations

import torch
from blocks import conv_block, randomize_batchnorm
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
    randomize_batchnorm(model)
    return model, (torch.randn(2, 3, 64, 64),)
