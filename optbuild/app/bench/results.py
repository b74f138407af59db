"""What a bench gives: its options, one row per measured model, one result per recipe."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.common.errors import OptbuildError

BENCH_VERSION = 2  # 2: rows of any backend; host.runtimes says what ran them
BENCH_FILE = "bench.json"


class BenchError(OptbuildError):
    """The bench cannot run or measure what was asked (printed without a traceback)."""


@dataclass(frozen=True)
class BenchOptions:
    runs: int = 100  # timed runs per model
    warmup: int = 10  # untimed runs per model before timing
    batch: int = 1  # size of a symbolic first dimension
    threads: int | None = None  # intra-op threads (onnxruntime) / torch.set_num_threads; None: theirs
    build: bool = True  # False: restore from the caches only (--no-build)
    seed: int = 0  # random inputs
    dim: int = 16  # size of other symbolic dimensions
    rounds: int = 10  # interleaving blocks (1: every model's runs in one go)

    def __post_init__(self) -> None:
        for name, low in (("runs", 1), ("warmup", 0), ("batch", 1), ("dim", 1), ("rounds", 1)):
            if getattr(self, name) < low:
                raise BenchError(f"{name} must be at least {low}, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise BenchError(f"threads must be at least 1, got {self.threads}")


@dataclass
class Row:
    """One measured model (or the PyTorch module behind an export step)."""

    step: str  # recipe:step
    runtime: str  # the backend that ran it ("onnxruntime", "openvino", ...), "torch" or "torch-cuda"
    label: str  # "ORT static INT8", "PyTorch eager", ...
    precision: str  # "fp32", "static INT8", ...
    artifact: Path | None  # the model file (for torch: the export's callable)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> shape, dtype
    batch: int = 1
    load_ms: float = 0.0
    size_bytes: int | None = None
    times_ns: list[int] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    throughput: float = 0.0  # samples per second
    speedup: float | None = None  # baseline p50 / this p50
    verify: list[dict[str, Any]] = field(default_factory=list)
    runner: str = ""  # what ran it, with its version: "onnxruntime 1.23.2 (CPU)"
    on_gpu: bool = False  # it ran on an NVIDIA GPU

    @property
    def name(self) -> str:
        return f"{self.step} ({self.runtime})"

    def as_json(self, root: Path) -> dict[str, Any]:
        artifact = None
        if self.artifact is not None:
            artifact = str(self.artifact.relative_to(root)) if self.artifact.is_relative_to(root) \
                else str(self.artifact)
        return {
            "step": self.step, "runtime": self.runtime, "runner": self.runner, "label": self.label,
            "precision": self.precision, "artifact": artifact, "size_bytes": self.size_bytes, "inputs": self.inputs,
            "batch": self.batch, "load_ms": round(self.load_ms, 3),
            "latency_ms": {k: round(v, 4) for k, v in self.latency_ms.items()},
            "throughput": round(self.throughput, 2), "speedup": None if self.speedup is None
            else round(self.speedup, 3), "verify": self.verify,
        }


@dataclass
class RecipeBench:
    """The bench of one recipe: its rows, what was skipped, and where it was written."""

    recipe: str
    rows: list[Row]
    settings: dict[str, Any]
    host: dict[str, Any]
    baseline: Row | None = None
    notes: list[str] = field(default_factory=list)
    file: Path | None = None  # bench.json
    plot_file: Path | None = None  # where `optbuild bench --plot` drew it (optbuild.cli.bench.present)

    def as_json(self, root: Path) -> dict[str, Any]:
        return {
            "version": BENCH_VERSION, "recipe": self.recipe,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": self.host, "settings": self.settings,
            "baseline": None if self.baseline is None else {"step": self.baseline.step,
                                                             "runtime": self.baseline.runtime},
            "rows": [row.as_json(root) for row in self.rows], "notes": self.notes,
        }


def ms(value: float) -> str:
    """A latency in milliseconds, to three significant digits or so."""
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"
