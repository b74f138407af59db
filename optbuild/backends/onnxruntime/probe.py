"""What onnxruntime reports about this host: the version and distribution that ``import
onnxruntime`` loads ("onnxruntime" section, from metadata), and the execution providers
that can load here ("ort_providers" section).

onnxruntime-gpu lists CUDA and TensorRT wherever it is installed, so the providers section
keeps those only where they load: a GPU is present and their libraries load. It must import
onnxruntime (~230 ms): ``optbuild fingerprint`` and steps that need a provider read it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import Sections, distribution_section

if TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


def loads(*names: str | Path) -> bool:
    """Whether one of these shared libraries loads (with the libraries it links)."""
    import ctypes

    for name in names:
        try:
            ctypes.CDLL(str(name))
            return True
        except OSError:
            continue
    return False


def cuda_provider_loads(capi: Path) -> bool:
    """onnxruntime's CUDA provider library (in ``capi``) loads: it links libcudart, libcublas
    and cuDNN, so it loads only where they do."""
    return loads(capi / "libonnxruntime_providers_cuda.so", capi / "onnxruntime_providers_cuda.dll")


def tensorrt_provider_loads(capi: Path) -> bool:
    """onnxruntime has the TensorRT provider library (in ``capi``), and TensorRT's library,
    which that links, loads, or the tensorrt package that brings it is importable."""
    if not any((capi / name).is_file() for name in ("libonnxruntime_providers_tensorrt.so",
                                                     "onnxruntime_providers_tensorrt.dll")):
        return False
    return (importlib.util.find_spec("tensorrt") is not None
            or loads("libnvinfer.so.10", "libnvinfer.so.11", "libnvinfer.so.8", "libnvinfer.so", "nvinfer_10.dll"))


# providers onnxruntime-gpu lists that need a GPU, and whether the rest they need loads
NEEDS_GPU: dict[str, Callable[[Path], bool]] = {
    "CUDAExecutionProvider": cuda_provider_loads,
    "TensorrtExecutionProvider": tensorrt_provider_loads,
}


def probe_providers(host: Fingerprint) -> dict[str, Any]:
    """"ort_providers.available": the providers onnxruntime lists that can load here."""
    try:
        import onnxruntime
    except ImportError:
        return {"ort_providers.available": None}
    capi = Path(onnxruntime.__file__).parent / "capi"
    gpu = bool(host.get("gpu.count"))
    usable = [name for name in onnxruntime.get_available_providers()
              if name not in NEEDS_GPU or (gpu and NEEDS_GPU[name](capi))]
    return {"ort_providers.available": ",".join(usable)}


SECTIONS: Sections = {
    "onnxruntime": (distribution_section("onnxruntime"), {
        "onnxruntime.version": "onnxruntime", "onnxruntime.distribution": "onnxruntime distribution"}),
    "ort_providers": (probe_providers, {"ort_providers.available": "onnxruntime execution providers"}),
}
