"""OpenVINO on the CPU: IR models (``model.xml`` + ``model.bin``) as the engine step with
backend "openvino" writes them. ``loader`` imports OpenVINO (with its usage telemetry kept
off) and describes models, ``runner`` compiles and feeds them; this module only describes
the backend and imports nothing heavy.

What a result obtained by running an IR depends on: the OpenVINO version, and the CPU. The
CPU plugin picks its kernels by instruction set (SSE4.2, AVX2, AVX-512, AMX; INT8 kernels
differ most), and where the CPU computes bf16 or fp16 natively (AVX512_BF16 / AMX, ARM fp16)
its default inference precision is that type, not f32. An IR built with precision "fp32"
therefore pins f32 in its engine.json (``inference_precision``), which the runner applies
(an IR without engine.json, by the precision in its rt_info), and reads back from the
compiled model, failing when the plugin chose another; "fp16" and "int8" IRs run at the
device's default. Verify and benchmark print the precision a model ran at (the runner's
label). Their keys hold what decides it: the artifact (engine.json, the IR's rt_info) and
the host's cpu.flags (``host_fields``).

Whether a feed fits an IR is said from its engine.json, before anything loads: the engine
step records there each input's name, dtype and shape (a size for a fixed dim, [min, max]
for a bounded one, [min, null] for one bounded below only, null for an unbounded one; null
for a dynamic rank). A bare IR, without engine.json, takes any feed as far as that goes:
OpenVINO itself then says what it refuses.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optbuild.backends.base import Backend, Manifest, Runner, module_missing

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

NAME = "openvino"
LABEL = "OpenVINO"
EXTRA = "openvino"  # pip install 'optbuild[openvino]'
HINTS = ("latency", "throughput")


def openvino_missing() -> str | None:
    """What to install when OpenVINO's Python module is absent, in words; None when present."""
    return module_missing("openvino", LABEL, EXTRA)


def nncf_missing() -> str | None:
    """What to install when NNCF (post-training INT8 quantization) is absent; None when present."""
    return module_missing("nncf", "NNCF", EXTRA)


def describe_dim(dim: Any) -> str:
    """A dim of an engine.json shape in OpenVINO's notation: "4", "?", "1..8", "2.."."""
    if isinstance(dim, list):
        low, high = dim
        return f"{low}..{'' if high is None else high}"
    return "?" if dim is None else str(dim)


def describe_shape(shape: Any) -> str:
    """An engine.json shape in OpenVINO's notation: "[?,4]", "[1..8,128]"; "[...]" for a
    dynamic rank."""
    return "[...]" if shape is None else "[" + ",".join(describe_dim(d) for d in shape) + "]"


def dim_bounds(dim: Any) -> tuple[int, int | None]:
    """(lowest, highest or None) size a dim of an engine.json shape takes."""
    if dim is None:
        return 0, None
    if isinstance(dim, list):
        low, high = dim
        return int(low), None if high is None else int(high)
    return int(dim), int(dim)


class OpenVINO(Backend):
    name = NAME
    label = LABEL
    short = "OV"
    extra = EXTRA
    suffixes = (".xml",)  # an IR without an engine.json runs at OpenVINO's defaults

    def distributions(self) -> tuple[str, ...]:
        return ("openvino", "numpy")

    def host_fields(self, manifest: Manifest) -> tuple[str, ...]:
        # kernels by instruction set; bf16 / fp16 default inference precision where native
        return ("cpu.arch", "cpu.flags")

    def unavailable(self, host: Fingerprint, manifest: Manifest) -> str | None:
        missing = openvino_missing()
        return f"needs {missing}" if missing else None

    def unfit(self, manifest: Manifest, feed: Mapping[str, Any]) -> str | None:
        """An input missing from ``feed``, or a shape outside the (fixed or bounded) dims that
        engine.json records of the IR's inputs; None when it fits, or when the manifest
        records no inputs (a bare IR, or the manifest of an engine step not yet built)."""
        for entry in manifest.get("inputs") or ():
            name, shape = entry["name"], entry.get("shape")
            if name not in feed:
                return f"no value for input {name!r} ({entry.get('dtype', '?')} {describe_shape(shape)})"
            have = tuple(getattr(feed[name], "shape", ()))
            if shape is None:
                continue
            if len(shape) != len(have):
                return (f"input {name!r} takes rank {len(shape)} ({describe_shape(shape)}), the feed has "
                        f"shape {list(have)}")
            for axis, (dim, size) in enumerate(zip(shape, have)):
                low, high = dim_bounds(dim)
                if size < low or (high is not None and size > high):
                    return (f"input {name!r} takes {describe_shape(shape)}, the feed has shape {list(have)} "
                            f"(dimension {axis})")
        return None

    def open(self, model: Path, manifest: Manifest, host: Fingerprint, *, threads: int | None = None,
             literal: bool = False) -> Runner:
        """``literal`` is ignored: the CPU plugin always compiles the graph with its own
        transformations."""
        from optbuild.backends.openvino.runner import OpenVINORunner

        return OpenVINORunner(model, hint=manifest.get("hint"),
                              inference_precision=manifest.get("inference_precision"), threads=threads)


BACKEND = OpenVINO()
