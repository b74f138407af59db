"""What the host is, as flat dotted fields ("cpu.arch", "os.name", "python.version", ...).

Sections are probed lazily, on the first read of one of their fields, so a build whose
steps declare no GPU field never touches NVML. A fingerprint can also be loaded from a
JSON file recorded on another host (to plan or fetch for that host).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# CPU features that change what optimizing compilers (ORT, TensorRT) emit.
RELEVANT_CPU_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    "avx512dq", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
    "amx_int8", "amx_bf16", "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16",
)


def _probe_os() -> dict[str, Any]:
    return {"os.name": platform.system(), "os.release": platform.release()}


def _probe_python() -> dict[str, Any]:
    return {
        "python.version": platform.python_version(),
        "python.implementation": sys.implementation.name,
    }


def _probe_cpu() -> dict[str, Any]:
    model, flags = platform.processor() or "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Model", "CPU part") and not model:
                    model = value.strip()
                elif name in ("flags", "Features"):
                    flags.update(value.split())
                    break
    except OSError:
        pass
    return {
        "cpu.arch": platform.machine(),
        "cpu.model": model,
        "cpu.flags": ",".join(f for f in RELEVANT_CPU_FLAGS if f in flags),
        "cpu.count": os.cpu_count(),
    }


# section name -> probe returning that section's fields
PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    "os": _probe_os,
    "python": _probe_python,
    "cpu": _probe_cpu,
}


class Fingerprint:
    """Lazily probed host facts; ``get("cpu.arch")`` probes the "cpu" section once."""

    def __init__(self, recorded: dict[str, Any] | None = None):
        self._fields: dict[str, Any] = dict(recorded or {})
        # A recorded fingerprint is complete: it never probes the local host.
        self._probed: set[str] = set(PROBES) if recorded is not None else set()

    @classmethod
    def load(cls, path: Path) -> Fingerprint:
        data = json.loads(Path(path).read_text())
        return cls(data.get("fields", data))

    def get(self, field: str) -> Any:
        section = field.split(".", 1)[0]
        if section not in self._probed and section in PROBES:
            self._probed.add(section)
            self._fields.update(PROBES[section]())
        return self._fields.get(field)

    def as_dict(self) -> dict[str, Any]:
        """Every field, probing all sections."""
        for section in PROBES:
            self.get(section + ".")
        return dict(sorted(self._fields.items()))


def describe_change(field: str, old: Any, new: Any) -> str:
    """Human wording of a changed fingerprint field."""
    return f"host {field}: {old} -> {new}"
