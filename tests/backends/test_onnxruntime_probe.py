"""onnxruntime's host probe: which execution providers can load here (onnxruntime-gpu lists
CUDA and TensorRT wherever it is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from optbuild.backends.onnxruntime.providers import cuda_provider_loads, loads, tensorrt_provider_loads
from optbuild.common.fingerprint import Fingerprint


def version_or_none(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _fake_gpu_build(site: Path) -> Path:
    """An importable onnxruntime that lists what onnxruntime-gpu lists, with its capi folder."""
    (site / "onnxruntime").mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text(
        "def get_available_providers():\n"
        "    return ['TensorrtExecutionProvider', 'CUDAExecutionProvider', 'CPUExecutionProvider']\n")
    (site / "onnxruntime" / "capi").mkdir()
    return site / "onnxruntime" / "capi"


def test_gpu_providers_are_not_listed_without_a_gpu(tmp_path):
    capi = _fake_gpu_build(tmp_path)
    (capi / "libonnxruntime_providers_cuda.so").write_bytes(b"not a library")
    code = ("import optbuild.backends\n"
            "from optbuild.common.fingerprint import Fingerprint\n"
            "print(Fingerprint().as_dict()['ort_providers.available'])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "CPUExecutionProvider"


def test_cuda_provider_needs_its_library_to_load(tmp_path):
    capi = _fake_gpu_build(tmp_path)
    assert not cuda_provider_loads(capi)  # no library
    (capi / "libonnxruntime_providers_cuda.so").write_bytes(b"not a library")
    assert not cuda_provider_loads(capi)  # one that does not load


def test_tensorrt_provider_needs_tensorrt(tmp_path):
    capi = _fake_gpu_build(tmp_path)
    assert not tensorrt_provider_loads(capi)  # onnxruntime without the TensorRT provider library
    (capi / "libonnxruntime_providers_tensorrt.so").write_bytes(b"")
    has_tensorrt = loads("libnvinfer.so.10", "libnvinfer.so") or version_or_none("tensorrt") is not None
    assert tensorrt_provider_loads(capi) == has_tensorrt


@pytest.mark.gpu
def test_listed_gpu_providers_run_a_session():
    """On a GPU host, a provider the fingerprint lists is one a session really runs on."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    available = Fingerprint().as_dict()["ort_providers.available"].split(",")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
    helper = onnx.helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        if provider not in ort.get_available_providers():
            continue
        try:
            session = ort.InferenceSession(model.SerializeToString(), providers=[provider, "CPUExecutionProvider"])
            runs = session.get_providers()[0] == provider
        except Exception:  # a provider that cannot load may refuse the session instead of falling back
            runs = False
        assert runs == (provider in available), provider
