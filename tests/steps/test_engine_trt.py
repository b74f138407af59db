"""Engine steps: real TensorRT-RTX engines built here without a GPU; TensorRT on GPU hosts.

TensorRT-RTX compiles ahead of time with no GPU, so every build below is real. Full TensorRT
needs a GPU: its builds run in the ``gpu`` tests. The tensorrt backend's build code (profiles,
parser errors, timing-cache bookkeeping) also runs here through ``TensorRTCodeOnRTX``, which
points that backend at the API-identical ``tensorrt_rtx`` module.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import warnings

import pytest
from plugins.trt import (
    CONV_PROFILE,
    HAS_RTX,
    MATMUL_PROFILE,
    make_ctx,
    matmul_relu,
    needs_module,
    qdq_matmul,
    requires_rtx,
    small_convnet,
    unknown_op,
)
from pydantic import ValidationError

from optbuild.backends.tensorrt import RUNTIMES
from optbuild.common.atomic import write_atomic
from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint
from optbuild.steps.engine_trt import (
    TensorRTEngine,
    TensorRTRTXEngine,
    check_profiles,
    timing_cache_file,
)


def rtx(tmp_path, **params) -> TensorRTRTXEngine:
    params = {"backend": "tensorrt-rtx", "input": "model", "profiles": MATMUL_PROFILE, **params}
    return TensorRTRTXEngine(TensorRTRTXEngine.Params.model_validate(params), tmp_path, tmp_path)


def trt_step(tmp_path, cls=TensorRTEngine, **params) -> TensorRTEngine:
    params = {"backend": "tensorrt", "input": "model", "profiles": MATMUL_PROFILE, **params}
    return cls(cls.Params.model_validate(params), tmp_path, tmp_path)


class TensorRTCodeOnRTX(TensorRTEngine):
    """The tensorrt backend's implementation, driven through TensorRT-RTX's module."""

    runtime = dataclasses.replace(RUNTIMES["tensorrt"], module="tensorrt_rtx")


def engine_of(ctx):
    path = ctx.out_dir / "model.engine"
    assert path.is_file() and path.stat().st_size > 0
    return path


# --- real TensorRT-RTX builds ----------------------------------------------------------------
@requires_rtx
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_rtx_matmul_relu_with_dynamic_batch(tmp_path, fp16):
    model = matmul_relu(tmp_path / "m.onnx", fp16=fp16)
    step = rtx(tmp_path, targets=["sm86", "sm89"], workspace="256 MiB", optimization_level=2)
    ctx = make_ctx(tmp_path, model)
    step.run(ctx)
    assert engine_of(ctx).stat().st_size == ctx.metrics["engine_bytes"]
    assert ctx.metrics["build_s"] >= 0
    assert ctx.metrics["timing_cache"] == "unsupported"
    assert ctx.metrics["inference"].startswith("skipped")  # no GPU here; an H100 is no target
    manifest = json.loads((ctx.out_dir / "engine.json").read_text())
    assert manifest["targets"] == ["sm86", "sm89"]
    assert manifest["inputs"] == [{"name": "x", "shape": [-1, 16]}]
    assert manifest["outputs"] == [{"name": "y", "shape": [-1, 8]}]


@requires_rtx
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_rtx_small_convnet(tmp_path, fp16):
    model = small_convnet(tmp_path / "conv.onnx", fp16=fp16)
    step = rtx(tmp_path, targets=["8.6"], profiles=CONV_PROFILE)
    ctx = make_ctx(tmp_path, model)
    step.run(ctx)
    engine_of(ctx)


@requires_rtx
def test_rtx_default_targets(tmp_path):
    ctx = make_ctx(tmp_path, matmul_relu(tmp_path / "m.onnx"))
    rtx(tmp_path).run(ctx)
    engine_of(ctx)
    assert json.loads((ctx.out_dir / "engine.json").read_text())["targets"] == "default"


@requires_rtx
def test_rtx_int8_qdq_model(tmp_path):
    ctx = make_ctx(tmp_path, qdq_matmul(tmp_path / "qdq.onnx"))
    try:
        rtx(tmp_path, targets=["sm89"]).run(ctx)
    except StepError as exc:  # a TensorRT-RTX that rejects Q/DQ must say so clearly
        assert "TensorRT-RTX" in str(exc) and "qdq.onnx" in str(exc)
    else:
        engine_of(ctx)


@requires_rtx
def test_rtx_build_failure_quotes_the_logged_error(tmp_path):
    # TensorRT-RTX 1.7 cannot compile an FP32 GEMM for Turing: the builder logs an error
    # naming the layer and returns no engine.
    ctx = make_ctx(tmp_path, matmul_relu(tmp_path / "m.onnx"))
    try:
        rtx(tmp_path, targets=["sm75"]).run(ctx)
    except StepError as exc:
        message = str(exc)
        assert "could not build an engine from m.onnx" in message
        assert "matmul" in message
    else:
        pytest.skip("this TensorRT-RTX compiles FP32 GEMM for Turing")


@requires_rtx
def test_rtx_target_the_api_does_not_offer(tmp_path):
    ctx = make_ctx(tmp_path, matmul_relu(tmp_path / "m.onnx"))
    with pytest.raises(StepError, match=r"cannot build for sm90; it offers .*sm86.*sm89"):
        rtx(tmp_path, targets=["sm90"]).run(ctx)


@requires_rtx
def test_rtx_writes_no_timing_cache(tmp_path):
    model = matmul_relu(tmp_path / "m.onnx")
    for _ in range(2):
        ctx = make_ctx(tmp_path, model)
        rtx(tmp_path, targets=["sm86"]).run(ctx)
        assert ctx.metrics["timing_cache"] == "unsupported"
    assert not (tmp_path / "state" / "tensorrt-timing").exists()


# --- errors a user can act on ------------------------------------------------------------------
@requires_rtx
def test_profile_with_a_wrong_input_name_lists_the_real_ones(tmp_path):
    ctx = make_ctx(tmp_path, matmul_relu(tmp_path / "m.onnx"))
    step = rtx(tmp_path, profiles=[{"input_ids": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}])
    with pytest.raises(StepError) as info:
        step.run(ctx)
    assert "'input_ids'" in str(info.value)
    assert "its inputs are: x [-1, 16] (dynamic)" in str(info.value)


@requires_rtx
def test_dynamic_model_without_profile_names_the_inputs(tmp_path):
    ctx = make_ctx(tmp_path, small_convnet(tmp_path / "conv.onnx"))
    with pytest.raises(StepError, match=r"dynamic inputs \(image \[-1, 3, -1, -1\] \(dynamic\)\).*profiles = "):
        rtx(tmp_path, profiles=[]).run(ctx)


@requires_rtx
def test_broken_onnx_reports_the_parser_message_and_node(tmp_path):
    ctx = make_ctx(tmp_path, unknown_op(tmp_path / "broken.onnx"))
    with pytest.raises(StepError) as info:
        rtx(tmp_path, profiles=[]).run(ctx)
    message = str(info.value)
    assert message.startswith("TensorRT-RTX")
    assert "cannot parse broken.onnx" in message
    assert "node 'mystery' (FrobnicateOp)" in message


@requires_rtx
def test_unreadable_onnx_reports_the_parser_message(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not an onnx model")
    with pytest.raises(StepError, match=r"cannot parse garbage.onnx:\n.*Failed to parse the ONNX model"):
        rtx(tmp_path).run(make_ctx(tmp_path, garbage))
    # Protobuf reads these bytes as an empty model, and the parser accepts it.
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"this is not a protobuf")
    with pytest.raises(StepError, match="empty.onnx as a model with no graph outputs"):
        rtx(tmp_path).run(make_ctx(tmp_path, empty))


def test_an_engine_needs_an_onnx_input(tmp_path):
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(StepError, match="ONNX model.*weights.bin"):
        rtx(tmp_path).run(make_ctx(tmp_path, other))


def test_profiles_checked_against_the_network_inputs():
    inputs = [("x", (-1, 16)), ("mask", (-1, -1))]
    rng = {"min": [1, 16], "opt": [2, 16], "max": [4, 16]}
    params = rtx_params(profiles=[{"x": rng, "mask": {"min": [1, 1], "opt": [2, 8], "max": [4, 8]}}])
    check_profiles(params.profiles, inputs, "m.onnx")  # fits
    with pytest.raises(StepError, match=r"profile 0 gives no shapes for dynamic input\(s\) 'mask'"):
        check_profiles(rtx_params(profiles=[{"x": rng}]).profiles, inputs, "m.onnx")
    with pytest.raises(StepError, match="dimension 1 is fixed at 16 in the model, but the profile gives min 8"):
        bad = {"min": [1, 8], "opt": [2, 8], "max": [4, 8]}
        check_profiles(rtx_params(profiles=[{"x": bad}]).profiles, [("x", (-1, 16))], "m.onnx")
    with pytest.raises(StepError, match="rank 2 .* rank 3"):
        deep = {"min": [1, 16, 1], "opt": [2, 16, 1], "max": [4, 16, 1]}
        check_profiles(rtx_params(profiles=[{"x": deep}]).profiles, [("x", (-1, 16))], "m.onnx")
    check_profiles([], [("x", (4, 16))], "static.onnx")  # static model: no profile needed


# --- parameters, validated when the project loads -------------------------------------------------
def rtx_params(**params):
    return TensorRTRTXEngine.Params.model_validate({"backend": "tensorrt-rtx", "input": "m", **params})


def trt_params(**params):
    return TensorRTEngine.Params.model_validate({"backend": "tensorrt", "input": "m", **params})


@pytest.mark.parametrize("shapes, message", [
    ({"min": [8, 16], "opt": [4, 16], "max": [8, 16]}, "min <= opt <= max"),
    ({"min": [1, 16], "opt": [4, 16], "max": [2, 16]}, "min <= opt <= max"),
    ({"min": [1, 16], "opt": [4, 16, 1], "max": [8, 16]}, "same rank"),
    ({"min": [0, 16], "opt": [4, 16], "max": [8, 16]}, "positive"),
    ({"min": [], "opt": [], "max": []}, "at least one dimension"),
])
def test_invalid_profiles_fail_validation(shapes, message):
    for make in (rtx_params, trt_params):
        with pytest.raises(ValidationError, match=message):
            make(profiles=[{"x": shapes}])


def test_parameter_validation():
    assert rtx_params(workspace="1 GiB").workspace == 1 << 30
    assert rtx_params(workspace="512MB").workspace == 512_000_000
    assert rtx_params(workspace=4096).workspace == 4096
    assert rtx_params().workspace is None
    for bad in ("lots", 0, "-1 GiB"):
        with pytest.raises(ValidationError):
            rtx_params(workspace=bad)
    with pytest.raises(ValidationError):
        rtx_params(optimization_level=6)
    with pytest.raises(ValidationError, match="names no input"):
        rtx_params(profiles=[{}])
    assert rtx_params(targets=["SM89", "8.6", "sm_86", "sm120"]).targets == ["sm86", "sm89", "sm120"]
    with pytest.raises(ValidationError, match="not a compute capability.*'current' would tie"):
        rtx_params(targets=["current"])
    with pytest.raises(ValidationError, match="'hardware_compatibility' only apply to backend 'tensorrt'"):
        rtx_params(hardware_compatibility="ampere+")
    with pytest.raises(ValidationError, match="'targets' only apply to backend 'tensorrt-rtx'"):
        trt_params(targets=["sm86"])
    with pytest.raises(ValidationError):
        trt_params(backend="tensorrt-rtx")
    with pytest.raises(ValidationError, match="needs hardware_compatibility"):
        trt_params(fingerprint="hardware-compatibility")
    with pytest.raises(ValidationError):
        trt_params(precision_flags=["fp64"])
    assert trt_params(precision_flags=["int8", "fp16", "int8"]).precision_flags == ["fp16", "int8"]
    assert trt_params().fingerprint == "compute-capability"


# --- what the key covers ------------------------------------------------------------------------
A100 = Fingerprint({"gpu.count": 1, "gpu.0.name": "NVIDIA A100-SXM4-80GB", "gpu.0.compute_capability": "8.0"})
A30 = Fingerprint({"gpu.count": 1, "gpu.0.name": "NVIDIA A30", "gpu.0.compute_capability": "8.0"})
H100 = Fingerprint({"gpu.count": 1, "gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.compute_capability": "9.0"})


@pytest.mark.parametrize("params, same_model_changes, same_cc_changes", [
    ({"fingerprint": "exact"}, True, True),
    ({"fingerprint": "compute-capability"}, True, False),
    ({"fingerprint": "hardware-compatibility", "hardware_compatibility": "ampere+"}, False, False),
    ({"fingerprint": "hardware-compatibility", "hardware_compatibility": "same-compute-capability"},
     True, False),
    ({"fingerprint": "exact", "hardware_compatibility": "ampere+"}, True, True),
])
def test_tensorrt_host_key_follows_the_policy(tmp_path, params, same_model_changes, same_cc_changes):
    step = trt_step(tmp_path, **params)
    # A100 -> H100: another compute capability; A100 -> A30: same compute capability, other model.
    assert (step.host_key(A100) != step.host_key(H100)) is same_model_changes
    assert (step.host_key(A100) != step.host_key(A30)) is same_cc_changes
    if params["fingerprint"] == "exact":
        assert step.host_key(H100) == {"gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.compute_capability": "9.0"}


def test_rtx_host_key_holds_no_gpu(tmp_path):
    a, b = rtx(tmp_path, targets=["sm86"]), rtx(tmp_path, targets=["sm86", "sm89"])
    assert a.host_key(A100) == a.host_key(H100) == a.host_key(Fingerprint({})) == {}
    assert a.params.model_dump(mode="json") != b.params.model_dump(mode="json")  # targets key it


def test_tool_names(tmp_path):
    from importlib.metadata import version

    (name,) = rtx(tmp_path).tool_names()
    if HAS_RTX:
        import tensorrt_rtx

        assert name.startswith("tensorrt-rtx")
        assert version(name) == tensorrt_rtx.__version__
    else:
        assert name == "tensorrt-rtx"
    (name,) = trt_step(tmp_path).tool_names()
    assert name in ("tensorrt", "tensorrt-cu11", "tensorrt-cu12", "tensorrt-cu13")


def test_unavailable_names_what_is_missing(tmp_path):
    step = trt_step(tmp_path)
    here = Fingerprint()
    if not here.get("gpu.count"):
        message = step.unavailable(here)
        assert "needs an NVIDIA GPU" in message and "tensorrt-rtx" in message
    no_gpu = Fingerprint({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVIDIA driver not loaded)"})
    assert "NVIDIA driver not loaded" in step.unavailable(no_gpu)
    if importlib.util.find_spec("tensorrt") is None:
        assert "pip install 'optbuild[gpu]'" in step.unavailable(H100)
        assert "NVIDIA GPU" not in step.unavailable(H100)
    else:
        assert step.unavailable(H100) is None
    turing = Fingerprint({"gpu.count": 1, "gpu.0.name": "Tesla T4", "gpu.0.compute_capability": "7.5"})
    assert "Ampere or newer" in trt_step(tmp_path, hardware_compatibility="ampere+").unavailable(turing)
    assert (rtx(tmp_path).unavailable(no_gpu) is None) is HAS_RTX
    if not HAS_RTX:
        assert "pip install 'optbuild[rtx]'" in rtx(tmp_path).unavailable(no_gpu)


# --- the tensorrt backend's code, through TensorRT-RTX's API ----------------------------------------
@requires_rtx
def test_tensorrt_code_path_timing_cache_hit_on_second_build(tmp_path):
    # TensorRT-RTX keeps ITimingCache as a deprecated no-op with TensorRT's API; this drives
    # the load / merge / atomic write / hit bookkeeping the tensorrt backend does on GPU hosts.
    model = matmul_relu(tmp_path / "m.onnx")
    step = trt_step(tmp_path, cls=TensorRTCodeOnRTX)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        first, second = make_ctx(tmp_path, model), make_ctx(tmp_path, model)
        step.run(first)
        step.run(second)
    engine_of(first)
    assert first.metrics["timing_cache"] == "miss" and first.metrics["timing_cache_hit"] is False
    assert second.metrics["timing_cache"] == "hit" and second.metrics["timing_cache_hit"] is True
    host = first.host
    device = (f"{host.get('gpu.0.name')}-sm{host.get('gpu.0.compute_capability').replace('.', '')}"
              if host.get("gpu.count") else "unknown-gpu-sm")
    caches = list((tmp_path / "state" / "tensorrt-timing").iterdir())
    assert [p.name for p in caches] == [timing_cache_file(tmp_path / "state", "tensorrt",
                                                          _rtx_version(), device).name]
    assert caches[0].stat().st_size == second.metrics["timing_cache_bytes"] > 0


@requires_rtx
def test_precision_flags_on_a_strongly_typed_only_tensorrt(tmp_path):
    ctx = make_ctx(tmp_path, matmul_relu(tmp_path / "m.onnx"))
    with pytest.raises(StepError, match=r"strongly typed networks only.*fp16 tensors"):
        trt_step(tmp_path, cls=TensorRTCodeOnRTX, precision_flags=["fp16"]).run(ctx)


def _rtx_version() -> str:
    import tensorrt_rtx

    return tensorrt_rtx.__version__


def test_timing_cache_files_and_atomic_writes(tmp_path):
    names = {
        timing_cache_file(tmp_path, "tensorrt", "10.13.0", "NVIDIA A100-SXM4-80GB-sm80"),
        timing_cache_file(tmp_path, "tensorrt", "10.13.0", "NVIDIA H100 80GB HBM3-sm90"),
        timing_cache_file(tmp_path, "tensorrt", "11.4.0", "NVIDIA H100 80GB HBM3-sm90"),
        timing_cache_file(tmp_path, "tensorrt-rtx", "11.4.0", "NVIDIA H100 80GB HBM3-sm90"),
    }
    assert len(names) == 4
    assert all(p.parent == tmp_path / "tensorrt-timing" and " " not in p.name for p in names)
    path = min(names)
    write_atomic(path, b"one")
    write_atomic(path, memoryview(b"two"))
    assert path.read_bytes() == b"two"
    assert os.listdir(path.parent) == [path.name]


# --- on a GPU host ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_tensorrt_build_and_run_on_gpu(tmp_path):
    host = Fingerprint()
    if not host.get("gpu.count"):
        pytest.skip(f"needs an NVIDIA GPU: {host.get('gpu.error')}")
    needs_module("tensorrt", "gpu")
    model = matmul_relu(tmp_path / "m.onnx")
    step = trt_step(tmp_path, fingerprint="exact")
    first, second = make_ctx(tmp_path, model, host=host), make_ctx(tmp_path, model, host=host)
    step.run(first)
    step.run(second)
    engine_of(first)
    assert first.metrics["inference"] == "ok" and first.metrics["latency_ms"] > 0
    assert first.metrics["timing_cache"] == "miss"
    assert second.metrics["timing_cache"] == "hit"


@pytest.mark.gpu
def test_rtx_engine_runs_on_a_target_gpu(tmp_path):
    needs_module("tensorrt_rtx", "rtx")
    host = Fingerprint()
    if not host.get("gpu.count"):
        pytest.skip(f"needs an NVIDIA GPU: {host.get('gpu.error')}")
    import tensorrt_rtx

    target = "sm" + host.get("gpu.0.compute_capability").replace(".", "")
    if target.upper() not in tensorrt_rtx.ComputeCapability.__members__:
        ctx = make_ctx(tmp_path, matmul_relu(tmp_path / "m.onnx"), host=host)
        rtx(tmp_path, targets=["sm86"]).run(ctx)  # built, and not run on a GPU it does not target
        assert "not among the targets" in ctx.metrics["inference"]
        pytest.skip(f"TensorRT-RTX does not target gpu.0 ({host.get('gpu.0.name')}, {target})")
    ctx = make_ctx(tmp_path, small_convnet(tmp_path / "conv.onnx"), host=host)
    rtx(tmp_path, targets=[target], profiles=CONV_PROFILE).run(ctx)
    assert ctx.metrics["inference"] == "ok" and ctx.metrics["latency_ms"] > 0
