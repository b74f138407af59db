"""Transformer encoders over token ids: [batch, seq] -> [batch, 4] class logits.

Two sizes of one architecture: ``build`` gives the tiny one of the ``transformer`` recipe
(64 wide, 2 layers, 32 tokens: builds in seconds), ``build_base`` a BERT-small-sized one
for the ``encoder`` recipe (512 wide, 4 layers, 128 tokens, 13 M parameters), large enough
that its matrix products dominate the run time, as in real deployments, so INT8 pays off.
Fixed-seed weights, nothing downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from blocks import FeedForward
from torch import nn


@dataclass(frozen=True)
class Size:
    vocab: int
    seq: int
    dim: int
    heads: int
    layers: int


TINY = Size(vocab=1000, seq=32, dim=64, heads=4, layers=2)
BASE = Size(vocab=1000, seq=128, dim=512, heads=8, layers=4)


class SelfAttention(nn.Module):
    """Written out (not nn.MultiheadAttention, whose fused eval path has no ONNX export)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        qkv = self.qkv(x).reshape(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        weights = torch.softmax(q @ k.transpose(-2, -1) / head_dim**0.5, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, seq, dim))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = SelfAttention(dim, heads)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = FeedForward(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self, size: Size, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(size.vocab, size.dim)
        self.position = nn.Parameter(torch.randn(1, size.seq, size.dim) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(size.dim, size.heads) for _ in range(size.layers))
        self.norm = nn.LayerNorm(size.dim)
        self.head = nn.Linear(size.dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


def _build(size: Size) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Encoder(size), (torch.randint(0, size.vocab, (2, size.seq)),)


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _build(TINY)


def build_base() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _build(BASE)
