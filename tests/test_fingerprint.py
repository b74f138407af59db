"""The host fingerprint: GPU sections through NVML, the runtimes' sections from their backends
(versions from metadata, of the distribution import loads), wording."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import optbuild.backends  # noqa: F401  (registers the runtimes' sections)
from optbuild.builder.keys import describe_changes
from optbuild.common.fingerprint import (
    PROBES,
    Fingerprint,
    UnknownSection,
    cuda_visible_order,
    describe_change,
    register_section,
)

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
        "import optbuild.backends\n"
        "from optbuild.common.fingerprint import Fingerprint\n"
        "f = Fingerprint()\n"
        "values = [f.get(n) for n in ('gpu.count', 'cuda.driver_version', 'tensorrt.version',"
        " 'tensorrt_rtx.version', 'onnxruntime.version')]\n"
        "print([m for m in ('tensorrt', 'tensorrt_rtx', 'onnxruntime') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_runtime_section_no_one_registered_is_refused_not_answered_none():
    code = (
        "from optbuild.common.fingerprint import Fingerprint, UnknownSection\n"
        "host = Fingerprint()\n"
        "try:\n"
        "    host.get('onnxruntime.version')\n"
        "except UnknownSection as exc:\n"
        "    print('refused:', exc)\n"
        "import optbuild.backends\n"
        "print('registered:', 'onnxruntime.version' in Fingerprint().as_dict())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused: host field 'onnxruntime.version': no fingerprint section 'onnxruntime'" in out
    assert "optbuild/backends/<runtime>/probe.py" in out
    assert "registered: True" in out
    with pytest.raises(UnknownSection, match="'no_such_runtime'"):
        Fingerprint().get("no_such_runtime.version")


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


# --- which onnxruntime: the one `import onnxruntime` loads ---------------------------------
_STUB = "raise ImportError('the fingerprint imported onnxruntime')\n"


def _record_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _dist_info(site: Path, name: str, version: str, init_text: str) -> None:
    """A distribution as pip leaves it: METADATA, and a RECORD that lists onnxruntime's
    __init__.py with the hash of the ``init_text`` it installed."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(
        f"onnxruntime/__init__.py,{_record_hash(init_text)},{len(init_text)}\n"
        f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def _stub_module(site: Path, text: str = _STUB) -> None:
    (site / "onnxruntime").mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text(text)


def _probe_in(*sites: Path) -> tuple[dict, str]:
    """(what the fingerprint, the toolchain and the onnxruntime backend say, stderr), in a
    process whose sys.path starts with ``sites``."""
    code = (
        "import json\n"
        "from optbuild.common.fingerprint import Fingerprint\n"
        "from optbuild.common.toolchain import Toolchain\n"
        "from optbuild.backends.onnxruntime import BACKEND\n"
        "host = Fingerprint()\n"
        "print(json.dumps({'version': host.get('onnxruntime.version'),\n"
        "                  'distribution': host.get('onnxruntime.distribution'),\n"
        "                  'tool': Toolchain().version('onnxruntime'),\n"
        "                  'keyed': BACKEND.distributions()[0]}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, sites))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout), out.stderr


def test_two_onnxruntimes_in_one_folder_name_the_one_whose_files_are_there(tmp_path):
    # onnxruntime 1.30 then onnxruntime-gpu 1.31.1 installed into one folder: both RECORDs list
    # onnxruntime/__init__.py; the file there is the GPU build's (installed last).
    gpu_init = "__version__ = '1.31.1'\n" + _STUB
    _stub_module(tmp_path, gpu_init)
    _dist_info(tmp_path, "onnxruntime", "1.30.0", "__version__ = '1.30.0'\n" + _STUB)
    _dist_info(tmp_path, "onnxruntime-gpu", "1.31.1", gpu_init)
    said, stderr = _probe_in(tmp_path)
    assert said == {"version": "1.31.1", "distribution": "onnxruntime-gpu", "tool": "1.31.1",
                    "keyed": "onnxruntime-gpu"}
    assert "side by side" in stderr
    assert "onnxruntime 1.30.0" in stderr and "`import onnxruntime` loads onnxruntime-gpu 1.31.1" in stderr


def test_two_onnxruntimes_in_two_folders_name_the_one_first_on_the_path(tmp_path):
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    for site, name, release in ((cpu, "onnxruntime", "1.30.0"), (gpu, "onnxruntime-gpu", "1.31.1")):
        _stub_module(site)
        _dist_info(site, name, release, _STUB)
    said, stderr = _probe_in(cpu, gpu)
    assert (said["distribution"], said["version"], said["tool"]) == ("onnxruntime", "1.30.0", "1.30.0")
    said, stderr = _probe_in(gpu, cpu)
    assert (said["distribution"], said["version"], said["tool"]) == ("onnxruntime-gpu", "1.31.1", "1.31.1")
    assert "side by side" in stderr and str(cpu) in stderr and str(gpu) in stderr


def test_an_onnxruntime_no_distribution_installed_has_no_version(tmp_path):
    # a module on the path that no installed distribution wrote: keys must not borrow a version
    _stub_module(tmp_path, "__version__ = '9.9.9'\n" + _STUB)
    said, stderr = _probe_in(tmp_path)
    assert said["version"] is None and said["distribution"] is None
    if version_or_none("onnxruntime") is not None:  # installed, but not what loads
        assert "none of them wrote" in stderr


def version_or_none(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def test_one_onnxruntime_gives_no_warning():
    said, stderr = _probe_in()
    assert said["version"] == version_or_none("onnxruntime")
    assert "side by side" not in stderr


# --- the runtimes' sections: registered by optbuild.backends ------------------------------
def _sections_in_fresh_process(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json\nfrom optbuild.common.fingerprint import "
                          "Fingerprint\nprint(json.dumps(sorted({f.split('.')[0] for f in Fingerprint().as_dict()})))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_runtime_sections_come_with_the_backends():
    host_only = set(PROBES)
    runtimes = {"onnxruntime", "ort_providers", "tensorrt", "tensorrt_rtx"}
    assert _sections_in_fresh_process("") == host_only  # common alone knows no runtime
    assert _sections_in_fresh_process("import optbuild.backends.registry") == host_only | runtimes


def test_every_command_that_offers_the_whole_fingerprint_has_the_runtime_sections():
    # `optbuild worker` offers Fingerprint().as_dict() to the scheduler; the CLI's parser, which
    # every command builds, brings the backends in
    sections = _sections_in_fresh_process("from optbuild.cli import _parser\n_parser()")
    assert {"onnxruntime", "ort_providers", "tensorrt", "tensorrt_rtx"} <= sections


def test_a_runtime_cannot_take_a_host_section():
    with pytest.raises(ValueError, match="host's own"):
        register_section("cpu", lambda host: {})
