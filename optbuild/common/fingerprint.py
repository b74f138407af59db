"""What the host is, as flat dotted fields ("cpu.arch", "os.name", "python.version", ...).

Sections are probed lazily, on the first read of one of their fields, so a build whose
steps declare no GPU field never touches NVML. A fingerprint can also be loaded from a
JSON file recorded on another host (to plan or fetch for that host).

The GPU sections ("gpu", "cuda") read NVML through nvidia-ml-py (``pynvml``): no CUDA
context is created, nothing is allocated on a GPU. A host without the library or a driver
probes fast and completely: ``gpu.count`` is 0 and ``gpu.error`` says why.

The runtimes' sections ("onnxruntime", "ort_providers", "tensorrt", "tensorrt_rtx") are
probed by the runtimes themselves (``optbuild/backends/<runtime>/probe.py``), which register
them here (``register_section``) when ``optbuild.backends`` is imported: every step that
reads such a field imports its runtime's backend, and so do the commands that print or offer
the whole fingerprint. A process that never imported ``optbuild.backends`` has a fingerprint
of the host sections only.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping
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


# --- GPU and accelerator toolchain -------------------------------------------------------
def cuda_visible_order(spec: str | None, uuids: list[str],
                       resolve_mig: Callable[[str], int | None] | None = None) -> list[int]:
    """NVML indices of the devices CUDA exposes, in CUDA's order, under CUDA_VISIBLE_DEVICES.

    ``uuids`` are the NVML devices' UUIDs in NVML (PCI bus) order. Like CUDA, the list stops
    at the first entry that names no device. Integer entries are read as NVML indices: that
    is CUDA's numbering when CUDA_DEVICE_ORDER=PCI_BUS_ID, or when all GPUs are one model
    (CUDA's default "fastest first" order can differ on mixed hosts; set PCI_BUS_ID there).
    "GPU-..." entries match a UUID by unique prefix; "MIG-..." entries count as their parent
    GPU when ``resolve_mig`` can find it (their memory is then the parent's).
    """
    if spec is None:
        return list(range(len(uuids)))
    order: list[int] = []
    for entry in (e.strip() for e in spec.split(",")):
        index: int | None = None
        if entry.lstrip("-").isdigit():
            value = int(entry)
            index = value if 0 <= value < len(uuids) else None
        elif entry.startswith("GPU-"):
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            index = matches[0] if len(matches) == 1 else None
        elif entry.startswith("MIG-") and resolve_mig is not None:
            index = resolve_mig(entry)
        if index is None or index in order:
            break
        order.append(index)
    return order


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvml_reason(exc: BaseException) -> str:
    kind = type(exc).__name__
    if kind == "NVMLError_LibraryNotFound":
        return "NVML library not found: no NVIDIA driver installed"
    if kind == "NVMLError_DriverNotLoaded":
        return "NVIDIA driver not loaded"
    if kind == "NVMLError_NoPermission":
        return "no permission to query NVML"
    return f"NVML: {exc}"


def _probe_gpu() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"gpu.count": 0, "gpu.error": "no NVIDIA GPU (nvidia-ml-py is not installed: "
                                             "pip install 'optbuild[gpu]')"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"gpu.count": 0, "gpu.error": f"no NVIDIA GPU ({_nvml_reason(exc)})"}
    try:
        fields: dict[str, Any] = {"gpu.driver": _text(pynvml.nvmlSystemGetDriverVersion())}
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]

        def parent_of_mig(uuid: str) -> int | None:
            try:
                mig = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
                return int(pynvml.nvmlDeviceGetIndex(parent))
            except (pynvml.NVMLError, AttributeError):
                return None

        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = cuda_visible_order(spec, uuids, parent_of_mig)
        fields["gpu.count"] = len(visible)
        if not handles:
            fields["gpu.error"] = "no NVIDIA GPU (NVML lists no devices)"
        elif not visible:
            fields["gpu.error"] = (f"no NVIDIA GPU (CUDA_VISIBLE_DEVICES={spec!r} hides "
                                   f"all {len(handles)} of this host's GPUs)")
        for i, index in enumerate(visible):
            handle = handles[index]
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            fields[f"gpu.{i}.name"] = _text(pynvml.nvmlDeviceGetName(handle))
            fields[f"gpu.{i}.compute_capability"] = f"{major}.{minor}"
            fields[f"gpu.{i}.memory_mib"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20
            fields[f"gpu.{i}.uuid"] = uuids[index]
        return fields
    except pynvml.NVMLError as exc:
        return {"gpu.count": 0, "gpu.error": f"no usable NVIDIA GPU ({_nvml_reason(exc)})"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _probe_cuda() -> dict[str, Any]:
    """The CUDA version the driver supports, from NVML: no CUDA context is created."""
    try:
        import pynvml
    except ImportError:
        return {"cuda.driver_version": None}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no library, no driver
        return {"cuda.driver_version": None}
    try:
        version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return {"cuda.driver_version": f"{version // 1000}.{version % 1000 // 10}"}
    except pynvml.NVMLError:
        return {"cuda.driver_version": None}
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


# section name -> probe returning that section's fields
PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    "os": _probe_os,
    "python": _probe_python,
    "cpu": _probe_cpu,
    "gpu": _probe_gpu,
    "cuda": _probe_cuda,
}

# What a probe of a runtime's section is given: the fingerprint it fills, to read the GPU
# sections through (its probe runs once for all).
RuntimeProbe = Callable[["Fingerprint"], dict[str, Any]]

# The runtimes' sections ("onnxruntime", "ort_providers", "tensorrt", ...): each runtime's
# package in optbuild.backends registers its own when optbuild.backends is first imported
# (common cannot import it). Section name -> probe.
RUNTIME_PROBES: dict[str, RuntimeProbe] = {}


def register_section(section: str, probe: RuntimeProbe, words: Mapping[str, str] | None = None) -> None:
    """Add a runtime's section to every live fingerprint; ``words`` name its fields in
    messages ("onnxruntime.version" -> "onnxruntime")."""
    if section in PROBES:
        raise ValueError(f"fingerprint section {section!r} is the host's own")
    RUNTIME_PROBES[section] = probe
    _FIELD_WORDS.update(words or {})


class UnknownSection(LookupError):
    """A field of a section that neither the host nor a registered runtime probes."""

    def __init__(self, field: str):
        section = field.split(".", 1)[0]
        known = ", ".join([*PROBES, *sorted(RUNTIME_PROBES)])
        super().__init__(
            f"host field {field!r}: no fingerprint section {section!r} (known: {known}). A "
            "runtime's section is registered by its probe (optbuild/backends/<runtime>/probe.py "
            "SECTIONS) when optbuild.backends is imported: import the runtime's backend before "
            "reading it, or fix the field's name")


MAX_FILE = 1 << 20  # a recorded fingerprint is a few KiB


class Fingerprint:
    """Lazily probed host facts; ``get("cpu.arch")`` probes the "cpu" section once."""

    def __init__(self, recorded: dict[str, Any] | None = None):
        self._fields: dict[str, Any] = dict(recorded or {})
        # A recorded fingerprint is complete: it never probes the local host.
        self._live = recorded is None
        self._probed: set[str] = set()

    @classmethod
    def load(cls, path: Path) -> Fingerprint:
        """The fingerprint ``optbuild fingerprint -o`` wrote to ``path``: ValueError (what is
        wrong) for anything else, however large or deep; OSError when it cannot be opened."""
        from optbuild.common.jsonfile import read_json

        data = read_json(Path(path), MAX_FILE)
        fields = data.get("fields", data) if isinstance(data, dict) else data
        if isinstance(fields, dict):
            return cls(fields)
        raise ValueError(f"{path} holds a JSON {type(fields).__name__}, not a fingerprint's fields (an object)")

    def get(self, field: str) -> Any:
        """The field's value, None where its section has no such field. On the live host a
        section no one registered is refused (UnknownSection), never answered None: else a
        key's host value would depend on whether its runtime's backend was imported first.
        A recorded fingerprint answers from its file alone."""
        section = field.split(".", 1)[0]
        if self._live and section not in self._probed:
            if section in PROBES:
                self._fields.update(PROBES[section]())
            elif section in RUNTIME_PROBES:
                self._fields.update(RUNTIME_PROBES[section](self))
            else:
                raise UnknownSection(field)
            self._probed.add(section)
        return self._fields.get(field)

    def as_dict(self) -> dict[str, Any]:
        """Every field, probing all sections (the runtimes' ones: those registered)."""
        for section in [*PROBES, *RUNTIME_PROBES]:
            self.get(section + ".")
        return dict(sorted(self._fields.items()))


_FIELD_WORDS = {
    "gpu.count": "GPU count",
    "gpu.driver": "NVIDIA driver",
    "gpu.error": "GPU status",
    "cuda.driver_version": "CUDA driver version",
}  # and the runtimes' fields, as they register their sections
_DEVICE_WORDS = {"name": "model", "compute_capability": "compute capability",
                 "memory_mib": "memory", "uuid": "UUID"}


def _shown(value: Any, unit: str = "") -> str:
    return "none" if value is None else f"{value}{unit}"


def describe_change(field: str, old: Any, new: Any) -> str:
    """Human wording of a changed fingerprint field ("GPU compute capability 8.0 -> 9.0")."""
    unit = ""
    words = _FIELD_WORDS.get(field)
    parts = field.split(".")
    what = _DEVICE_WORDS.get(parts[-1]) if len(parts) == 3 and parts[0] == "gpu" else None
    if words is None and what is not None and parts[1].isdigit():
        words = f"GPU {what}" if parts[1] == "0" else f"GPU {parts[1]} {what}"
        unit = " MiB" if parts[2] == "memory_mib" else ""
    if words is None:
        return f"host {field}: {old} -> {new}"
    return f"{words} {_shown(old, unit)} -> {_shown(new, unit)}"
