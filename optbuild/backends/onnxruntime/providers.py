"""onnxruntime's execution providers as optbuild knows them, one entry each: where a provider
runs (the CPU, gpu.0, the NVIDIA GPU that NVML reports, or another device), what it needs
beside that device, whether its library loads on this host, whether onnxruntime can save the
graph it optimized for it (what an onnxruntime engine step writes), and which providers a
session lists after it.

The loader (sessions), the backend (why a host cannot run a model), the probe (which
providers load here), the runner (inputs bound on the GPU), the onnxruntime engine step (which
providers it optimizes for) and the deploy step (Triton's instance kind) all read this table,
so adding a provider is one entry here (docs/architecture.md, "Adding a provider"). Nothing
here imports onnxruntime.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Provider:
    name: str  # onnxruntime's ("CUDAExecutionProvider")
    # runs on gpu.0, the NVIDIA GPU NVML reports: sessions bind inputs and outputs there, and a
    # model's results depend on the GPU's model and compute capability (they key it)
    nvidia: bool = False
    gpu: bool = False  # runs on a GPU: Triton places its instances there (KIND_GPU)
    saves_graph: bool = False  # onnxruntime saves the graph it optimized for it (else it compiles nodes it cannot save)
    needs: str = ""  # what it needs beside its device, in words ("": the onnxruntime build with it)
    loads: Callable[[Path], bool] | None = None  # whether its library loads, given onnxruntime's capi folder
    then: tuple[str, ...] = ()  # the providers a session lists after it, before the CPU

    @property
    def short(self) -> str:
        """"CUDA" for "CUDAExecutionProvider"."""
        return self.name.removesuffix("ExecutionProvider")


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


def _table(*providers: Provider) -> dict[str, Provider]:
    return {provider.name: provider for provider in providers}


PROVIDERS: dict[str, Provider] = _table(
    Provider(CPU, saves_graph=True),
    Provider("CUDAExecutionProvider", nvidia=True, gpu=True, saves_graph=True, loads=cuda_provider_loads,
             needs="onnxruntime-gpu in place of onnxruntime, with the CUDA and cuDNN libraries it loads "
                   "(pip install onnxruntime-gpu)"),
    Provider("ROCMExecutionProvider", gpu=True, saves_graph=True),
    Provider("DmlExecutionProvider", saves_graph=True),
    Provider("TensorrtExecutionProvider", nvidia=True, gpu=True, loads=tensorrt_provider_loads,
             then=("CUDAExecutionProvider",),  # TensorRT hands the nodes it cannot run to CUDA
             needs="onnxruntime-gpu in place of onnxruntime, with TensorRT's libraries "
                   "(pip install onnxruntime-gpu tensorrt)"),
    # providers that compile the graph into nodes onnxruntime cannot save
    Provider("OpenVINOExecutionProvider"),
    Provider("CoreMLExecutionProvider"),
    Provider("QNNExecutionProvider"),
    Provider("NnapiExecutionProvider"),
    Provider("MIGraphXExecutionProvider", gpu=True),
    Provider("VitisAIExecutionProvider"),
    Provider("WebGpuExecutionProvider"),
    Provider("XnnpackExecutionProvider"),
    Provider("NvTensorRTRTXExecutionProvider", gpu=True),
)


def get(name: str) -> Provider:
    """The entry of ``name``; a provider this table does not know runs where onnxruntime puts
    it, saves no graph that optbuild knows of, and needs the onnxruntime build with it."""
    return PROVIDERS.get(name) or Provider(name)


def nvidia(name: str) -> bool:
    return get(name).nvidia


def session_list(name: str, device_id: int) -> list[object]:
    """The providers list a session on ``name`` is made with: it first, then those it hands
    nodes to, then the CPU; NVIDIA ones on gpu.0 (``device_id``)."""
    if name == CPU:
        return [CPU]
    listed: list[object] = []
    for each in (name, *get(name).then):
        listed.append((each, {"device_id": device_id}) if nvidia(each) else each)
    return [*listed, CPU]
