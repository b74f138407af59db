"""What onnxruntime reports about this host: the version and distribution that ``import
onnxruntime`` loads ("onnxruntime" section, from metadata), and the execution providers
that can load here ("ort_providers" section).

onnxruntime-gpu lists CUDA and TensorRT wherever it is installed, so the providers section
keeps those only where they load: a GPU is present and their libraries load. It must import
onnxruntime (~230 ms): ``optbuild fingerprint`` and steps that need a provider read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import Sections, distribution_section
from optbuild.backends.onnxruntime import providers

if TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


def probe_providers(host: Fingerprint) -> dict[str, Any]:
    """"ort_providers.available": the providers onnxruntime lists that can load here."""
    try:
        import onnxruntime
    except ImportError:
        return {"ort_providers.available": None}
    capi = Path(onnxruntime.__file__).parent / "capi"
    gpu = bool(host.get("gpu.count"))
    usable = [name for name in onnxruntime.get_available_providers()
              if not _needs_gpu(name) or (gpu and _loads(name, capi))]
    return {"ort_providers.available": ",".join(usable)}


def _needs_gpu(name: str) -> bool:
    """onnxruntime-gpu lists its NVIDIA providers wherever it is installed: they count only with a GPU."""
    return providers.get(name).nvidia


def _loads(name: str, capi: Path) -> bool:
    check = providers.get(name).loads
    return check is None or check(capi)


SECTIONS: Sections = {
    "onnxruntime": (distribution_section("onnxruntime"), {
        "onnxruntime.version": "onnxruntime", "onnxruntime.distribution": "onnxruntime distribution"}),
    "ort_providers": (probe_providers, {"ort_providers.available": "onnxruntime execution providers"}),
}
