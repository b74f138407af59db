"""The host fingerprint: GPU sections through NVML, tool versions from metadata, wording."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version

import pytest

from optbuild.builder.keys import describe_changes
from optbuild.common.fingerprint import Fingerprint, cuda_visible_order, describe_change

GPU_FIELDS = ("gpu.count", "gpu.driver", "gpu.0.name", "gpu.0.compute_capability",
              "gpu.0.memory_mib", "gpu.0.uuid", "cuda.driver_version")


def _has_gpu() -> bool:
    return bool(Fingerprint().get("gpu.count"))


def test_hidden_gpus_give_count_zero_and_a_reason(monkeypatch):
    # Holds on any host: no driver, no library, or every GPU hidden from CUDA.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    host = Fingerprint()
    assert host.get("gpu.count") == 0
    assert host.get("gpu.error").startswith("no NVIDIA GPU (")
    assert host.get("gpu.0.name") is None
    assert host.get("gpu.0.compute_capability") is None


@pytest.mark.skipif(_has_gpu(), reason="this host has an NVIDIA GPU")
def test_host_without_gpu_is_complete_and_fast():
    started = time.perf_counter()
    host = Fingerprint()
    fields = {name: host.get(name) for name in (*GPU_FIELDS, "tensorrt.version", "tensorrt_rtx.version",
                                                "onnxruntime.version")}
    elapsed = time.perf_counter() - started
    assert fields["gpu.count"] == 0
    assert re.fullmatch(r"no NVIDIA GPU \(.+\)", host.get("gpu.error"))
    assert fields["cuda.driver_version"] is None
    assert elapsed < 2.0, f"GPU and tool sections took {elapsed:.2f} s on a host without a GPU"


def test_tool_versions_come_from_metadata_without_importing_the_tools():
    code = (
        "import sys\n"
        "from optbuild.common.fingerprint import Fingerprint\n"
        "f = Fingerprint()\n"
        "values = [f.get(n) for n in ('gpu.count', 'cuda.driver_version', 'tensorrt.version',"
        " 'tensorrt_rtx.version', 'onnxruntime.version')]\n"
        "print([m for m in ('tensorrt', 'tensorrt_rtx', 'onnxruntime') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tool_versions_match_installed_distributions():
    host = Fingerprint()
    try:
        expected = version("onnxruntime")
    except PackageNotFoundError:
        expected = None
    if expected is not None:
        assert host.get("onnxruntime.version") == expected
        assert host.get("onnxruntime.distribution") == "onnxruntime"
    try:
        rtx = version("tensorrt-rtx")
    except PackageNotFoundError:
        rtx = None
    assert host.get("tensorrt_rtx.version") == rtx
    if rtx is not None:
        assert host.get("tensorrt_rtx.distribution").startswith("tensorrt-rtx")


def test_providers_are_a_section_of_their_own():
    pytest.importorskip("onnxruntime")
    host = Fingerprint()
    assert host.get("onnxruntime.version") is not None
    assert "CPUExecutionProvider" in host.as_dict()["ort_providers.available"].split(",")


def test_recorded_fingerprint_never_probes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # would change a live probe; must not matter
    recorded = {"gpu.count": 1, "gpu.0.name": "NVIDIA A100-SXM4-80GB", "gpu.0.compute_capability": "8.0"}
    host = Fingerprint(recorded)
    assert host.get("gpu.count") == 1
    assert host.get("gpu.0.name") == "NVIDIA A100-SXM4-80GB"
    assert host.get("cuda.driver_version") is None  # not recorded, not probed
    assert host.get("tensorrt_rtx.version") is None
    assert host.as_dict() == dict(sorted(recorded.items()))
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"fields": recorded}))
    assert Fingerprint.load(path).as_dict() == dict(sorted(recorded.items()))


def test_cuda_visible_devices_order():
    uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-bbcc-3333"]
    assert cuda_visible_order(None, uuids) == [0, 1, 2]
    assert cuda_visible_order("2,0", uuids) == [2, 0]
    assert cuda_visible_order(" 1 , 2 ", uuids) == [1, 2]
    assert cuda_visible_order("0,7,1", uuids) == [0]  # CUDA stops at the first invalid entry
    assert cuda_visible_order("", uuids) == []
    assert cuda_visible_order("-1", uuids) == []
    assert cuda_visible_order("0,0", uuids) == [0]
    assert cuda_visible_order("GPU-bbcc,GPU-aaaa", uuids) == [2, 0]  # unique UUID prefixes
    assert cuda_visible_order("GPU-bb", uuids) == []  # ambiguous prefix
    assert cuda_visible_order("MIG-x", uuids) == []
    assert cuda_visible_order("MIG-x,0", uuids, lambda uuid: 1) == [1, 0]


def test_describe_change_wording():
    assert describe_change("gpu.0.compute_capability", "8.0", "9.0") == "GPU compute capability 8.0 -> 9.0"
    assert describe_change("tensorrt.version", "10.13.0", "11.4.0") == "TensorRT 10.13.0 -> 11.4.0"
    assert describe_change("tensorrt_rtx.version", "1.6.0", "1.7.1") == "TensorRT-RTX 1.6.0 -> 1.7.1"
    assert (describe_change("gpu.0.name", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
            == "GPU model NVIDIA A100-SXM4-80GB -> NVIDIA H100 80GB HBM3")
    assert describe_change("gpu.1.memory_mib", 40960, 81559) == "GPU 1 memory 40960 MiB -> 81559 MiB"
    assert describe_change("gpu.0.compute_capability", None, "9.0") == "GPU compute capability none -> 9.0"
    assert describe_change("cuda.driver_version", "12.4", "13.0") == "CUDA driver version 12.4 -> 13.0"
    assert describe_change("gpu.driver", "550.54", "580.1") == "NVIDIA driver 550.54 -> 580.1"
    assert describe_change("onnxruntime.version", "1.30.0", "1.31.1") == "onnxruntime 1.30.0 -> 1.31.1"
    assert describe_change("gpu.count", 1, 2) == "GPU count 1 -> 2"
    assert describe_change("cpu.arch", "x86_64", "aarch64") == "host cpu.arch: x86_64 -> aarch64"
    assert describe_change("gpu.0.weird", 1, 2) == "host gpu.0.weird: 1 -> 2"


def test_key_reasons_use_the_gpu_wording():
    old = {"host": {"gpu.0.compute_capability": "8.0"}}
    new = {"host": {"gpu.0.compute_capability": "9.0"}}
    assert "GPU compute capability 8.0 -> 9.0" in describe_changes(old, new)


@pytest.mark.gpu
def test_nvml_fingerprint_on_a_real_gpu():
    host = Fingerprint()
    if not host.get("gpu.count"):
        pytest.skip(f"needs an NVIDIA GPU: {host.get('gpu.error')}")
    assert host.get("gpu.0.name")
    assert re.fullmatch(r"\d+\.\d+", host.get("gpu.0.compute_capability"))
    assert host.get("gpu.0.memory_mib") > 1024
    assert host.get("gpu.0.uuid").startswith(("GPU-", "MIG-"))
    assert host.get("gpu.driver")
    assert re.fullmatch(r"\d+\.\d+", host.get("cuda.driver_version"))
    assert host.get("gpu.error") is None
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        assert host.get("gpu.0.compute_capability") == f"{major}.{minor}"
        assert host.get("gpu.count") == torch.cuda.device_count()
