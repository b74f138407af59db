"""onnxruntime on the execution provider an artifact names: a model an onnxruntime engine step
optimized for CUDA is verified and benchmarked on CUDA (gpu.0, inputs and outputs bound there),
keyed by the GPU's model and compute capability and never its UUID, and unavailable, saying
what it needs, where the provider or the GPU is missing; never run on the CPU instead.

Keys and reasons are checked here with recorded fingerprints (tests/fixtures/fingerprints/h100.json
is a real H100's); running on CUDA is marked gpu."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from plugins.models import make_convnet, save
from plugins.steps import run_step

from optbuild.backends.onnxruntime import BACKEND
from optbuild.backends.onnxruntime.loader import providers_for, session
from optbuild.model.timing import latency_figures, time_calls
from optbuild.steps.benchmark import Benchmark, BenchmarkParams
from optbuild.steps.engine_ort import OrtEngine, OrtEngineParams
from optbuild.steps.source import OnnxSource, OnnxSourceParams
from optbuild.steps.verify import Verify, VerifyParams

H100 = json.loads((Path(__file__).parents[1] / "fixtures/fingerprints/h100.json").read_text())["fields"]
CUDA = "CUDAExecutionProvider"


def recorded(**changes: object) -> Fingerprint:
    """The H100 host as recorded, with ``changes`` (field -> value)."""
    return Fingerprint({**H100, **changes})


def cuda_engine() -> OrtEngine:
    return OrtEngine(OrtEngineParams(backend="onnxruntime", input="m", provider=CUDA), Path("."), Path("."))


def verify_and_bench_of(engine: OrtEngine) -> tuple[Verify, Benchmark]:
    """A verify step (reference: a plain ONNX model) and a benchmark step of ``engine``,
    bound as planning binds them."""
    plain = OnnxSource(OnnxSourceParams(path="m.onnx"), Path("."), Path("."))
    verify = Verify(VerifyParams(reference="ref", candidate="cand", max_abs=1e-3), Path("."), Path("."))
    verify.bind({"reference": plain, "candidate": engine})
    bench = Benchmark(BenchmarkParams(input="cand"), Path("."), Path("."))
    bench.bind({"input": engine})
    return verify, bench


# --- keys and reasons, from recorded fingerprints -------------------------------------------------
def test_a_cuda_candidate_is_keyed_by_the_gpu_model_and_compute_capability():
    verify, bench = verify_and_bench_of(cuda_engine())
    host = recorded()
    assert bench.host_key(host) == {"gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.compute_capability": "9.0"}
    # the reference runs on the CPU: its fields join the candidate's
    assert verify.host_key(host) == {"cpu.arch": "x86_64", "cpu.flags": H100["cpu.flags"],
                                     "gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.compute_capability": "9.0"}
    assert BACKEND.distributions()[0] in verify.tool_names() and BACKEND.distributions()[0] in bench.tool_names()


def test_two_gpus_of_one_model_give_one_key_and_another_model_another():
    verify, bench = verify_and_bench_of(cuda_engine())
    other_serial = recorded(**{"gpu.0.uuid": "GPU-5f1e2d3c-0000-4000-8000-123456789abc"})
    a100 = recorded(**{"gpu.0.name": "NVIDIA A100-SXM4-80GB", "gpu.0.compute_capability": "8.0"})
    for step in (verify, bench):
        assert step.host_key(recorded()) == step.host_key(other_serial)
        assert step.host_key(recorded()) != step.host_key(a100)
        assert "gpu.0.uuid" not in step.host_key(recorded())


def test_a_cpu_engine_keeps_the_cpu_key():
    engine = OrtEngine(OrtEngineParams(backend="onnxruntime", input="m"), Path("."), Path("."))
    _, bench = verify_and_bench_of(engine)
    assert bench.host_key(recorded()) == {"cpu.arch": "x86_64", "cpu.flags": H100["cpu.flags"],
                                          "cpu.model": "x86_64", "cpu.count": 16}


@pytest.mark.parametrize(("changes", "needs"), [
    ({}, None),  # the H100 with onnxruntime-gpu: runs
    ({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVML library not found)",
      "ort_providers.available": "CPUExecutionProvider", "onnxruntime.distribution": "onnxruntime"},
     ("needs a CUDA GPU (here: no NVIDIA GPU (NVML library not found)) and onnxruntime-gpu in place of "
     "onnxruntime, with the CUDA and cuDNN libraries it loads (pip install onnxruntime-gpu) for the "
     "CUDAExecutionProvider")),
    ({"ort_providers.available": "CPUExecutionProvider"},  # a GPU, but onnxruntime without CUDA
     ("needs onnxruntime-gpu in place of onnxruntime, with the CUDA and cuDNN libraries it loads (pip install "
     "onnxruntime-gpu) for the CUDAExecutionProvider")),
    ({"gpu.count": 0, "gpu.error": "none found", "ort_providers.available": "CPUExecutionProvider",
      "onnxruntime.distribution": "onnxruntime-gpu"},  # onnxruntime-gpu lists CUDA only with a GPU
     "needs a CUDA GPU (here: none found) for the CUDAExecutionProvider"),
])
def test_verify_and_benchmark_of_a_cuda_candidate_say_what_the_host_lacks(changes, needs):
    verify, bench = verify_and_bench_of(cuda_engine())
    host = recorded(**changes)
    assert verify.unavailable(host) == bench.unavailable(host) == cuda_engine().unavailable(host) == needs


def test_the_session_factory_puts_the_cpu_after_the_named_provider():
    assert providers_for("CPUExecutionProvider") == ["CPUExecutionProvider"]
    assert providers_for(CUDA) == [(CUDA, {"device_id": 0}), "CPUExecutionProvider"]
    assert providers_for("TensorrtExecutionProvider") == [
        ("TensorrtExecutionProvider", {"device_id": 0}), (CUDA, {"device_id": 0}), "CPUExecutionProvider"]


# --- on this host: never the CPU for a CUDA model ----------------------------------------------
def _without_cuda() -> Fingerprint:
    host = Fingerprint()
    if BACKEND.unavailable(host, {"backend": "onnxruntime", "provider": CUDA}) is None:
        pytest.skip("this host runs onnxruntime on CUDA")
    return host


def test_a_session_that_falls_back_to_the_cpu_is_refused(tmp_path):
    _without_cuda()
    with pytest.raises(RuntimeError, match="fell back to CPUExecutionProvider: CUDAExecutionProvider"):
        session(make_convnet(tmp_path / "m.onnx"), provider=CUDA)


def test_a_model_built_for_cuda_is_not_verified_or_benchmarked_on_the_cpu(tmp_path):
    """The artifact a GPU host's engine step writes (its engine.json names CUDA), on this host:
    verify and benchmark refuse it, saying what is missing."""
    host = _without_cuda()
    model = make_convnet(tmp_path / "m.onnx")
    _, ctx = run_step(OrtEngine, {"backend": "onnxruntime", "input": "m"}, {"input": model}, tmp_path, "engine")
    built = shutil.copytree(ctx.out_dir, tmp_path / "built-on-gpu")
    manifest = json.loads((built / "engine.json").read_text())
    (built / "engine.json").write_text(json.dumps({**manifest, "provider": CUDA}))
    why = BACKEND.unavailable(host, {"backend": "onnxruntime", "provider": CUDA})
    assert "onnxruntime-gpu" in why and "CUDA GPU" in why
    with pytest.raises(StepError, match=r"the candidate .* cannot run on this host: needs .*CUDAExecutionProvider"):
        run_step(Verify, {"reference": "ref", "candidate": "cand", "max_abs": 1e-3, "samples": 2},
                 {"reference": model, "candidate": built / "model.onnx"}, tmp_path, "verify")
    with pytest.raises(StepError, match=r"the input .* cannot run on this host: needs .*CUDAExecutionProvider"):
        run_step(Benchmark, {"input": "cand", "runs": 2, "warmup": 0, "dynamic_size": 2},
                 {"input": built / "model.onnx"}, tmp_path, "bench")


# --- on a GPU host ------------------------------------------------------------------------------
def _cuda_host() -> Fingerprint:
    host = Fingerprint()
    if (why := BACKEND.unavailable(host, {"backend": "onnxruntime", "provider": CUDA})) is not None:
        pytest.skip(why)
    return host


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [False, True])
def test_a_cuda_engine_is_verified_and_benchmarked_on_cuda(tmp_path, fp16):
    host = _cuda_host()
    model = make_convnet(tmp_path / "m.onnx")
    source = model
    if fp16:
        from optbuild.steps.quantize import Quantize

        _, q = run_step(Quantize, {"input": "m", "mode": "fp16", "keep_io_types": True}, {"input": model},
                        tmp_path, "fp16")
        source = q.out_dir / "model.onnx"
    _, built = run_step(OrtEngine, {"backend": "onnxruntime", "input": "m", "provider": CUDA}, {"input": source},
                        tmp_path, "engine")
    candidate = built.out_dir / "model.onnx"
    _, checked = run_step(Verify, {"reference": "ref", "candidate": "cand", "max_rel": 1e-2 if fp16 else 1e-3,
                                   "samples": 4, "dynamic_size": 2},
                          {"reference": model, "candidate": candidate}, tmp_path, "verify")
    report = json.loads((checked.out_dir / "report.json").read_text())
    gpu = f"on gpu.0 ({host.get('gpu.0.name')})"
    assert report["passed"], report
    assert report["runtime"]["reference"].endswith("(CPU)")
    assert "(CUDA, CPU)" in report["runtime"]["candidate"] and report["runtime"]["candidate"].endswith(gpu)
    _, measured = run_step(Benchmark, {"input": "cand", "runs": 20, "warmup": 3, "dynamic_size": 8},
                           {"input": candidate}, tmp_path, "bench")
    bench = json.loads((measured.out_dir / "benchmark.json").read_text())
    assert bench["runtime"].startswith(f"onnxruntime {ort.__version__} (CUDA") and bench["runtime"].endswith(gpu)
    assert bench["inputs"] == {"x": {"shape": [8, 8, 16, 16], "dtype": "float32"}}
    assert 0 < bench["min_ms"] <= bench["p50_ms"] <= bench["max_ms"]


@pytest.mark.gpu
def test_bound_timing_on_cuda_excludes_the_host_copies(tmp_path):
    """A Relu over 64 images of 3x224x224 (38 MB in, 38 MB out): with the input bound on gpu.0,
    each timed call is the kernel's time, well under infer's, which copies both ways; the
    outputs are the CPU's."""
    host = _cuda_host()
    helper = onnx.helper
    dims = [64, 3, 224, 224]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, dims)])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "relu.onnx")
    feed = {"x": np.random.default_rng(0).standard_normal(dims).astype(np.float32)}
    with BACKEND.open(model, {"backend": "onnxruntime", "provider": CUDA}, host) as runner:
        assert runner.session.get_providers()[0] == CUDA
        np.testing.assert_array_equal(runner.infer(feed)["y"], np.maximum(feed["x"], 0))
        bound = latency_figures(time_calls(runner.timed_call(feed), 30, 5))
        copied = latency_figures(time_calls(lambda: runner.infer(feed), 30, 5))
    assert bound["p50"] * 3 < copied["p50"], (bound, copied)
