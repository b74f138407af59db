"""A small transformer encoder over token ids: [batch, 32] -> [batch, 4] class logits.
Fixed-seed weights, nothing downloaded."""

from __future__ import annotations

import torch
from blocks import FeedForward
from torch import nn

VOCAB, SEQ, DIM, HEADS, LAYERS = 1000, 32, 64, 4, 2


class SelfAttention(nn.Module):
    """Written out (not nn.MultiheadAttention, whose fused eval path has no ONNX export)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        weights = torch.softmax(q @ k.transpose(-2, -1) / (DIM // HEADS) ** 0.5, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, seq, DIM))


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = SelfAttention()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.ff = FeedForward(DIM, 4 * DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class TinyEncoder(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Parameter(torch.randn(1, SEQ, DIM) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TinyEncoder(), (torch.randint(0, VOCAB, (2, SEQ)),)
