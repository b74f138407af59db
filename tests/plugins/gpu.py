"""What the GPU-host tests share (tests/test_gpu_host.py, tests/distributed/test_dask_gpu.py):
the recorded H100, this host's GPU when onnxruntime can run CUDA on it, steps keyed by the
GPU as engines are, and a model's onnxruntime CUDA engine verified and measured."""

from __future__ import annotations

import pytest
from plugins.projects import FIXTURES

from optbuild.common.fingerprint import Fingerprint

H100 = FIXTURES / "fingerprints" / "h100.json"
CUDA = "CUDAExecutionProvider"

# steps built for one GPU model and for one compute capability (as a TensorRT engine is), from
# a text source: the test kinds ``text`` and ``bound`` (tests/distributed/hostkinds.py)
GPU_KEYED = """\
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.for_model]
kind = "bound"
input = "src"
field = "gpu.0.name"
value = "{name}"

[steps.for_capability]
kind = "bound"
input = "src"
field = "gpu.0.compute_capability"
value = "{capability}"
"""


def cuda_here() -> Fingerprint:
    """This host, when onnxruntime can run CUDA on its GPU; else the test is skipped, saying
    what is missing (the onnxruntime backend's own words)."""
    pytest.importorskip("onnxruntime")
    from optbuild.backends.onnxruntime import BACKEND  # registers the onnxruntime fields

    host = Fingerprint()
    if (why := BACKEND.unavailable(host, {"backend": "onnxruntime", "provider": CUDA})) is not None:
        pytest.skip(f"needs onnxruntime on an NVIDIA GPU: {why}")
    return host


def cuda_steps(runs: int, warmup: int) -> str:
    """The step ``model`` on onnxruntime CUDA (engine_cuda), verified against it on the CPU
    (verify_cuda) and measured (bench_cuda)."""
    return f"""
[steps.engine_cuda]
kind = "engine"
backend = "onnxruntime"
provider = "{CUDA}"
input = "model"

[steps.verify_cuda]
kind = "verify"
reference = "model"
candidate = "engine_cuda"
min_cosine = 0.9999
samples = 4

[steps.bench_cuda]
kind = "benchmark"
input = "engine_cuda"
check = "verify_cuda"
runs = {runs}
warmup = {warmup}
"""
