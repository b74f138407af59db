"""optbuild.backends.tensorrt: profiles, the host check before any runtime, and TrtRunner.

Without a GPU the runner's plumbing (profile choice, shapes, casts, buffers, copies in and
out) runs against a fake engine and a fake cuda-python whose "device" memory is host memory:
every byte still travels through the runner's own calls. The ``gpu`` tests build real
TensorRT-RTX / TensorRT engines, run them with TrtRunner and compare with onnxruntime.
"""

from __future__ import annotations

import ctypes
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest
from plugins.trt import CONV_PROFILE, make_ctx, needs_module, small_convnet

from optbuild.backends.base import TensorSpec
from optbuild.backends.tensorrt import RUNTIMES
from optbuild.backends.tensorrt.host import RTX_TARGETS, run_obstacle
from optbuild.backends.tensorrt.loader import load_engine, open_engine
from optbuild.backends.tensorrt.profiles import Bounds, ShapeMismatch, choose_profile
from optbuild.backends.tensorrt.runner import RunnerError, TrtRunner, UnsupportedEngine, random_feed
from optbuild.common.errors import StepError, StepUnavailable
from optbuild.common.fingerprint import Fingerprint

NO_GPU = Fingerprint({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVIDIA driver not loaded)"})
RTX_4090 = Fingerprint({"gpu.count": 1, "gpu.0.name": "NVIDIA GeForce RTX 4090", "gpu.0.compute_capability": "8.9"})
H100 = Fingerprint({"gpu.count": 1, "gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.compute_capability": "9.0"})


# --- profiles ----------------------------------------------------------------------------------------
SMALL = {"x": Bounds((1, 16), (4, 16), (8, 16))}
LARGE = {"x": Bounds((9, 16), (16, 16), (32, 16))}


def test_the_first_profile_that_takes_the_shapes_is_chosen():
    inputs = {"x": (-1, 16)}
    assert choose_profile(inputs, [SMALL, LARGE], {"x": (1, 16)}) == 0
    assert choose_profile(inputs, [SMALL, LARGE], {"x": (8, 16)}) == 0
    assert choose_profile(inputs, [SMALL, LARGE], {"x": (9, 16)}) == 1
    assert choose_profile({"x": (4, 16)}, [], {"x": (4, 16)}) == 0  # static engine


def test_a_shape_outside_the_profile_names_input_shape_and_bounds():
    with pytest.raises(ShapeMismatch) as info:
        choose_profile({"x": (-1, 16)}, [SMALL], {"x": (12, 16)})
    assert str(info.value) == ("input 'x' has shape [12, 16], outside the engine's optimization profile "
                               "(min [1, 16], max [8, 16])")
    with pytest.raises(ShapeMismatch, match=r"fit none of the engine's 2 optimization profiles: profile 0: "
                                            r"input 'x' has shape \[64, 16\], outside min \[1, 16\], max \[8, 16\]; "
                                            r"profile 1: .*min \[9, 16\], max \[32, 16\]"):
        choose_profile({"x": (-1, 16)}, [SMALL, LARGE], {"x": (64, 16)})
    with pytest.raises(ShapeMismatch, match=r"input 'x' has shape \[4, 8\]; the engine takes \[\?, 16\]"):
        choose_profile({"x": (-1, 16)}, [SMALL], {"x": (4, 8)})
    with pytest.raises(ShapeMismatch, match=r"shape \[4\]; the engine takes \[\?, 16\]"):
        choose_profile({"x": (-1, 16)}, [SMALL], {"x": (4,)})


# --- the host before the runtime ---------------------------------------------------------------------
class ExplodingTrt:
    """A TensorRT module whose runtime must not be created (it would crash without a GPU)."""

    __name__ = "tensorrt_rtx"
    __version__ = "0.0"

    def Runtime(self, logger):
        raise AssertionError("a TensorRT runtime was created on a host that cannot run the engine")


def test_no_runtime_is_created_where_the_engine_cannot_run(tmp_path):
    rtx = RUNTIMES["tensorrt-rtx"]
    with pytest.raises(StepUnavailable, match=r"NVIDIA driver not loaded"):
        load_engine(ExplodingTrt(), b"plan", NO_GPU, runtime=rtx, logger=object())
    with pytest.raises(StepUnavailable, match=r"gpu.0 \(NVIDIA H100 80GB HBM3, compute capability 9.0\) is not "
                                              r"among the targets sm86, sm89"):
        load_engine(ExplodingTrt(), b"plan", H100, runtime=rtx, targets=["sm86", "sm89"], logger=object())
    with pytest.raises(StepUnavailable, match="default targets runs on"):
        load_engine(ExplodingTrt(), b"plan", H100, runtime=rtx, logger=object())
    # open_engine does not even import the module, nor read the file, on such a host
    with pytest.raises(StepUnavailable, match="NVIDIA driver not loaded"):
        open_engine(tmp_path / "missing.engine", NO_GPU, runtime=RUNTIMES["tensorrt"])
    assert run_obstacle("tensorrt", H100) is None
    assert run_obstacle("tensorrt-rtx", RTX_4090, ["sm86", "sm89"]) is None
    assert set(RTX_TARGETS) >= {"sm86", "sm89", "sm120"}


class _Severity:
    INTERNAL_ERROR, ERROR, WARNING = 0, 1, 2


def _fake_trt(validity: str, engine: object | None) -> SimpleNamespace:
    runtime = SimpleNamespace(get_engine_validity=lambda plan: (validity, 4),
                              deserialize_cuda_engine=lambda plan: engine)
    return SimpleNamespace(__name__="tensorrt_rtx", __version__="1.7.1", Runtime=lambda logger: runtime,
                           EngineValidity=SimpleNamespace(INVALID="invalid"),
                           EngineInvalidityDiagnostics=SimpleNamespace(__members__={"OLD_VERSION": 4}),
                           ILogger=SimpleNamespace(Severity=_Severity))


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-python is not installed")
def test_invalid_and_unloadable_engines_are_named(tmp_path):
    rtx = RUNTIMES["tensorrt-rtx"]
    logger = SimpleNamespace(messages=[(_Severity.ERROR, "engine plan is from a newer version")])
    with pytest.raises(StepUnavailable, match=r"not valid on gpu.0 \(old version\)"):
        load_engine(_fake_trt("invalid", None), b"plan", RTX_4090, runtime=rtx, logger=logger)
    with pytest.raises(StepError, match=r"TensorRT-RTX 1.7.1 cannot load the engine on gpu.0 \(NVIDIA GeForce "
                                        r"RTX 4090\):\n  engine plan is from a newer version"):
        load_engine(_fake_trt("valid", None), b"plan", RTX_4090, runtime=rtx, logger=logger)
    loaded = load_engine(_fake_trt("valid", "ENGINE"), b"plan", RTX_4090, runtime=rtx, logger=logger)
    assert loaded.engine == "ENGINE" and loaded.label == "TensorRT-RTX 1.7.1"


# --- TrtRunner against a fake engine and fake CUDA ---------------------------------------------------
class FakeCudart:
    """cuda-python's calls as the runner makes them, on host memory; counts what is live."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice="h2d", cudaMemcpyDeviceToHost="d2h")

    def __init__(self):
        self.memory: dict[int, ctypes.Array] = {}
        self.streams = 0

    def cudaStreamCreate(self):
        self.streams += 1
        return 0, 7

    def cudaStreamDestroy(self, stream):
        self.streams -= 1
        return (0,)

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaMalloc(self, nbytes):
        block = ctypes.create_string_buffer(nbytes)
        self.memory[ctypes.addressof(block)] = block
        return 0, ctypes.addressof(block)

    def cudaFree(self, pointer):
        del self.memory[pointer]
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        ctypes.memmove(dst, src, nbytes)
        return (0,)


class FakeContext:
    """y = 2 * x + profile index, read from and written to the addresses the runner set."""

    def __init__(self):
        self.profile, self.shapes, self.addresses = 0, {}, {}

    def set_optimization_profile_async(self, index, stream):
        self.profile = index
        return True

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name):
        return self.shapes["x"] if name == "y" else self.shapes[name]

    def set_tensor_address(self, name, pointer):
        self.addresses[name] = pointer

    def execute_async_v3(self, stream):
        count = int(np.prod(self.shapes["x"]))
        x = np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses["x"]))
        y = np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses["y"]))
        y[:] = 2 * x + self.profile
        return True


class FakeEngine:
    """Input x: float32 [-1, 4], two profiles (batch 1..4, 5..16); output y like x."""

    num_io_tensors, num_optimization_profiles = 2, 2
    PROFILES = [((1, 4), (2, 4), (4, 4)), ((5, 4), (8, 4), (16, 4))]

    def __init__(self, dtype: str = "float32"):
        self.dtype = dtype

    def get_tensor_name(self, index):
        return ("x", "y")[index]

    def get_tensor_mode(self, name):
        return "in" if name == "x" else "out"

    def get_tensor_shape(self, name):
        return (-1, 4)

    def get_tensor_profile_shape(self, name, index):
        return self.PROFILES[index]

    def get_tensor_dtype(self, name):
        return self.dtype

    def is_shape_inference_io(self, name):
        return False

    def create_execution_context(self):
        return FakeContext()


def _nptype(dtype):
    if dtype == "bf16":
        raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
    return np.dtype(dtype).type


def fake_loaded(engine: FakeEngine, cudart: FakeCudart) -> SimpleNamespace:
    trt = SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="in", OUTPUT="out"), nptype=_nptype)
    return SimpleNamespace(trt=trt, engine=engine, cudart=cudart, runtime=None, label="FakeRT 1.0",
                           device="gpu.0 (fake)")


def test_runner_feeds_copies_and_switches_profiles():
    cudart = FakeCudart()
    runner = TrtRunner(lambda: fake_loaded(FakeEngine(), cudart))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with runner:
        assert runner.input_names == ["x"] and runner.output_names() == ["y"]
        assert runner.input_specs() == [TensorSpec("x", "float32", (None, 4))]
        assert runner.label == "FakeRT 1.0 on gpu.0 (fake)"
        assert runner.profiles == [{"x": Bounds((1, 4), (2, 4), (4, 4))}, {"x": Bounds((5, 4), (8, 4), (16, 4))}]
        out = runner.infer({"x": x})
        np.testing.assert_array_equal(out["y"], 2 * x)  # profile 0
        assert runner.last_inference_ms is not None and runner.last_inference_ms >= 0
        big = np.ones((8, 4), np.float64)  # float64 is cast to the engine's float32
        np.testing.assert_array_equal(runner.infer({"x": big})["y"], np.full((8, 4), 3.0, np.float32))
        np.testing.assert_array_equal(runner.infer({"x": x})["y"], 2 * x)  # back to profile 0
        assert len(cudart.memory) == 2  # one buffer per tensor, grown when needed
        feed = random_feed(runner, profile=1)
        assert feed["x"].shape == (8, 4) and feed["x"].dtype == np.float32
        with pytest.raises(RunnerError, match=r"input 'x' has shape \[32, 4\], .* profile 1: .*max \[16, 4\]"):
            runner.infer({"x": np.zeros((32, 4), np.float32)})
        with pytest.raises(RunnerError, match=r"lacks inputs \['x'\] / has unknown inputs \['tokens'\]"):
            runner.infer({"tokens": x})
        with pytest.raises(RunnerError, match="input 'x' is int64; the engine takes float32"):
            runner.infer({"x": np.zeros((2, 4), np.int64)})
    assert cudart.memory == {} and cudart.streams == 0  # everything released


def test_runner_names_what_it_cannot_feed():
    with pytest.raises(RunnerError, match="outside its 'with' block"):
        TrtRunner(lambda: fake_loaded(FakeEngine(), FakeCudart())).infer({"x": np.zeros((1, 4), np.float32)})
    with TrtRunner(lambda: fake_loaded(FakeEngine("bf16"), FakeCudart())) as runner, \
            pytest.raises(UnsupportedEngine, match="tensor 'x' is bf16, which has no numpy type"):
        runner.infer({"x": np.zeros((1, 4), np.float32)})
    engine = FakeEngine("int32")
    with TrtRunner(lambda: fake_loaded(engine, FakeCudart())) as runner, \
            pytest.raises(RunnerError, match="values outside int32's range"):
        runner.infer({"x": np.full((1, 4), 2**40, np.int64)})


# --- on a GPU host -------------------------------------------------------------------------------------
def _gpu_host_for(backend: str) -> tuple[Fingerprint, list[str]]:
    """This host and the targets to build for; skips, saying why, where it cannot run ``backend``."""
    host = Fingerprint()
    if not host.get("gpu.count"):
        pytest.skip(f"needs an NVIDIA GPU: {host.get('gpu.error')}")
    runtime = RUNTIMES[backend]
    needs_module(runtime.module, runtime.extra)
    if importlib.util.find_spec("cuda") is None:
        pytest.skip(f"cuda-python is not installed (pip install 'optbuild[{runtime.extra}]')")
    targets = []
    if backend == "tensorrt-rtx":
        targets = ["sm" + host.get("gpu.0.compute_capability").replace(".", "")]
        if targets[0] not in RTX_TARGETS:
            pytest.skip(f"TensorRT-RTX does not run on gpu.0 ({host.get('gpu.0.name')}, {targets[0]})")
    return host, targets


def build_engine(tmp_path, backend: str, model, host: Fingerprint, targets: list[str], profiles):
    from optbuild.steps.engine_trt import TensorRTEngine, TensorRTRTXEngine

    cls = TensorRTRTXEngine if backend == "tensorrt-rtx" else TensorRTEngine
    params = {"backend": backend, "input": "model", "profiles": profiles}
    if targets:
        params["targets"] = targets
    ctx = make_ctx(tmp_path, model, host=host)
    cls(cls.Params.model_validate(params), tmp_path, tmp_path).run(ctx)
    assert ctx.metrics["inference"] == "ok", ctx.metrics["inference"]  # the post-build check ran
    return ctx


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tensorrt-rtx", "tensorrt"])
def test_trt_runner_matches_onnxruntime(tmp_path, backend):
    host, targets = _gpu_host_for(backend)
    from optbuild.backends import registry
    from optbuild.backends.onnxruntime.loader import session as ort_session

    model = small_convnet(tmp_path / "conv.onnx")
    ctx = build_engine(tmp_path, backend, model, host, targets, CONV_PROFILE)
    session = ort_session(model)
    rng = np.random.default_rng(5)
    engine = ctx.out_dir / "model.engine"
    runs_on, manifest = registry.for_artifact(engine, "the engine")
    assert runs_on.name == backend and runs_on.unavailable(host, manifest) is None
    with runs_on.open(engine, manifest, host) as runner:
        for shape in ((2, 3, 32, 32), (4, 3, 64, 64), (1, 3, 48, 40)):  # dynamic batch and size
            image = rng.standard_normal(shape).astype(np.float32)
            got = runner.infer({"image": image})["out"].astype(np.float64)
            want = session.run(["out"], {"image": image})[0].astype(np.float64)
            assert got.shape == want.shape
            # fp32, TF32 matrix products at most
            assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max(), shape
            cosine = float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want))
            assert cosine > 0.9999, shape
            assert runner.last_inference_ms > 0
