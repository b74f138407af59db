"""Four kinds of model that issue 33 found verify and select judging wrong, built in plain torch
from sizes set here (seeded random weights, nothing downloaded), small enough to export and
quantize in seconds: a detector whose head concatenates boxes and class scores, a causal
language model with [batch, seq, vocab] logits, a segmentation net with [batch, classes, H, W]
maps and an LSTM sequence classifier. benchmarks/real_models.py copies this file into the
project it writes (models/torchnets.py); each function returns the module and example inputs,
as the export step's callable does.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 2  # every dynamic axis at 2 or more in the example (docs/steps.md, Export callables)
IMAGE = 256  # detector and segmentation input, pixels a side
CLASSES = 16  # detector classes
SEG_CLASSES = 6
VOCAB, SEQ = 4000, 64  # the language model's
FRAMES, FEATURES, SEQ_CLASSES = 64, 40, 10  # the LSTM's input [batch, FRAMES, FEATURES]


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    """Conv, BatchNorm, SiLU: the YOLO family's block."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.SiLU())


class Detector(nn.Module):
    """A YOLOv8-shaped head on a small backbone: per anchor of the stride-8 grid, 4 box
    coordinates in pixels (cx, cy, w, h) and CLASSES sigmoid scores, concatenated into one
    [batch, 4 + CLASSES, anchors] output, so boxes (up to ~IMAGE) and scores (0..1) share a Concat."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(_conv(3, 32, 2), _conv(32, 64, 2), _conv(64, 64), _conv(64, 128, 2), _conv(128, 128))
        self.box = nn.Conv2d(128, 4, 1)
        self.cls = nn.Conv2d(128, CLASSES, 1)
        cells = IMAGE // 8
        ys, xs = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
        self.register_buffer("grid", torch.stack([xs, ys]).reshape(1, 2, -1).float() + 0.5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.backbone(image)
        box = self.box(features).flatten(2)
        xy = (self.grid + torch.tanh(box[:, :2])) * 8.0
        wh = torch.exp(box[:, 2:].clamp(max=2.0)) * 16.0
        scores = torch.sigmoid(self.cls(features).flatten(2))
        return torch.cat([xy, wh, scores], dim=1)


class Block(nn.Module):
    """GPT-2's block: pre-norm causal self-attention (masked_fill with -inf above the
    diagonal, as transformers' GPT-2 did) and a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ)).reshape(1, 1, SEQ, SEQ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    """A GPT-2-shaped language model: token and position embeddings, 4 blocks of 256, a final
    LayerNorm and a head to the vocabulary: logits [batch, seq, VOCAB]."""

    def __init__(self, dim: int = 256, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, dim), nn.Embedding(SEQ, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.1)  # GPT-2's 0.02 on 4 layers leaves logits that hardly move

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.head(self.ln(self.blocks(self.tokens(input_ids) + self.positions(positions))))


class Segmenter(nn.Module):
    """An FCN-shaped segmentation net: a stride-8 encoder, a 1x1 classifier and bilinear
    upsampling back to the input: [batch, SEG_CLASSES, IMAGE, IMAGE] class scores."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(_conv(3, 32, 2), _conv(32, 64, 2), _conv(64, 128, 2), _conv(128, 128))
        self.classifier = nn.Conv2d(128, SEG_CLASSES, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        scores = self.classifier(self.encoder(image))
        return nn.functional.interpolate(scores, size=image.shape[-2:], mode="bilinear", align_corners=False)


class Recurrent(nn.Module):
    """A 2-layer LSTM of 128 over [batch, FRAMES, FEATURES] frames, classified from its last step."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.lstm = nn.LSTM(FEATURES, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, SEQ_CLASSES)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(frames)
        return self.head(out[:, -1])


def _spread(model: nn.Module) -> nn.Module:
    """He-normal weights and zero biases on convolutions and linear layers: torch's default
    init shrinks activations layer by layer, and a random net's outputs then hardly depend on
    its input (one class for every image, boxes that move by 0.1 px), which verify cannot judge."""
    for layer in model.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return model.eval()


def detector():
    torch.manual_seed(0)
    return _spread(Detector()), (torch.randn(BATCH, 3, IMAGE, IMAGE),)


def causal_lm():
    torch.manual_seed(0)
    return CausalLM().eval(), (torch.randint(0, VOCAB, (BATCH, SEQ)),)


def segmenter():
    torch.manual_seed(0)
    return _spread(Segmenter()), (torch.randn(BATCH, 3, IMAGE, IMAGE),)


def lstm():
    torch.manual_seed(0)
    return _spread(Recurrent()), (torch.randn(BATCH, FRAMES, FEATURES),)
