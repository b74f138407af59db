"""The openvino backend: opening IRs, describing and feeding them, OpenVINO's messages, and
keeping its usage telemetry off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from optbuild.backends.openvino import loader
from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint

loader.block_telemetry()  # before openvino is first imported: a plain import writes ~/intel/
ov = pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import make_two_inputs, save

from optbuild.backends import registry
from optbuild.backends.openvino.runner import InferenceError, OpenVINORunner


def make_mlp(path: Path) -> Path:
    """x: float32 [batch, 4] -> MatMul 4x8 -> Relu -> y: float32 [batch, 8]."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def to_ir(onnx_path: Path, out: Path, **rt_info: str) -> Path:
    """An IR written by OpenVINO itself (no engine step, no engine.json)."""
    model = loader.import_openvino().convert_model(str(onnx_path))
    for key, value in rt_info.items():
        model.set_rt_info(value, ["optbuild", key])
    ov.save_model(model, str(out), compress_to_fp16=False)
    return out


def test_a_bare_ir_opens_by_suffix_and_agrees_with_onnxruntime(tmp_path):
    """No engine.json: the precision the engine step stores in the IR pins f32, on any CPU."""
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    ir = to_ir(onnx_path, tmp_path / "ir" / "model.xml", precision="fp32")
    backend, manifest = registry.for_artifact(ir, "the model")
    assert backend is registry.get("openvino") and manifest == {"backend": "openvino"}
    assert backend.distributions() == ("openvino", "numpy")
    assert backend.unavailable(Fingerprint(), manifest) is None
    runner = backend.open(ir, manifest, Fingerprint(), threads=1)
    with runner:
        assert runner.load_ms > 0
        assert [str(s) for s in runner.input_specs()] == ["x: float32 [?, 4]"]
        assert runner.output_names() == ["y"]
        assert runner.label == f"OpenVINO {ov.get_version().split('-')[0]} (CPU, latency, f32)"
        assert runner.inference_precision == "f32" == precision(runner)
        assert int(runner.compiled.get_property("INFERENCE_NUM_THREADS")) == 1
        x = np.random.default_rng(1).standard_normal((3, 4))  # float64: cast() makes it float32
        feed = runner.cast({"x": x})
        assert feed["x"].dtype == np.float32
        got = runner.infer(feed)
    assert runner.compiled is None  # freed on leaving the block
    expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert list(got) == ["y"] and got["y"].shape == (3, 8)
    np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-5)


def test_two_inputs_of_different_types(tmp_path):
    onnx_path = make_two_inputs(tmp_path / "two.onnx")
    ir = to_ir(onnx_path, tmp_path / "ir" / "model.xml")
    feed = {"a": np.ones((2, 4), np.float32), "ids": np.array([[1, 2], [3, 4]], np.int64)}
    with OpenVINORunner(ir, inference_precision="f32") as runner:  # compared as f32: any CPU
        assert [str(s) for s in runner.input_specs()] == ["a: float32 [?, 4]", "ids: int64 [?, 2]"]
        got = runner.infer(feed)["y"]
    expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_manifest_settings_are_applied(tmp_path):
    ir = to_ir(make_mlp(tmp_path / "mlp.onnx"), tmp_path / "ir" / "model.xml", hint="latency")
    manifest = {"backend": "openvino", "hint": "throughput", "inference_precision": "f32"}
    with registry.get("openvino").open(ir, manifest, Fingerprint()) as runner:
        assert runner.hint == "throughput"  # the manifest's hint wins over the IR's rt_info
        assert precision(runner) == "f32"
    with OpenVINORunner(ir) as runner:
        assert runner.hint == "latency"  # from the rt_info


def precision(runner: OpenVINORunner) -> str:
    """What the compiled model says it computes at (OpenVINO's notation: f32, bf16, f16)."""
    return runner.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()


def test_only_an_fp32_ir_pins_its_precision(tmp_path):
    """fp16 and int8 IRs, and IRs optbuild did not make, run at the CPU plugin's default
    (bf16 on CPUs with AVX512_BF16 or AMX): the label says which."""
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    for rt_info in ({}, {"precision": "fp16"}, {"precision": "int8"}):
        ir = to_ir(onnx_path, tmp_path / str(rt_info.get("precision")) / "model.xml", **rt_info)
        with OpenVINORunner(ir) as runner:
            assert runner.inference_precision == precision(runner) == default
            assert runner.label.endswith(f", {default})")


def test_a_precision_the_plugin_does_not_honour_is_an_error(tmp_path):
    """f16 asked of an x86 CPU without native f16 compiles at bf16 or f32, silently: a figure
    said to be f16 would not be."""
    if "FP16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU computes f16 natively")
    ir = to_ir(make_mlp(tmp_path / "mlp.onnx"), tmp_path / "ir" / "model.xml")
    with pytest.raises(StepError, match=r"inference precision f16 was asked, the CPU plugin compiled the model "
                                        r"at (bf16|f32)"), OpenVINORunner(ir, inference_precision="f16"):
        pass


def test_unfit_feeds_are_explained_from_the_manifest():
    """What engine.json records of the inputs: fixed, bounded, half-bounded and dynamic dims."""
    backend = registry.get("openvino")
    assert backend.short == "OV"
    manifest = {"backend": "openvino", "inputs": [
        {"name": "x", "dtype": "float32", "shape": [None, 4]},
        {"name": "ids", "dtype": "int64", "shape": [[1, 8], [2, None], 3]},
        {"name": "any", "dtype": "float32", "shape": None}]}
    fits = {"x": np.zeros((5, 4), np.float32), "ids": np.zeros((8, 2, 3), np.int64),
            "any": np.zeros((1, 2, 3, 4, 5), np.float32)}
    assert backend.unfit(manifest, fits) is None
    assert backend.unfit(manifest, {**fits, "ids": np.zeros((1, 900, 3), np.int64)}) is None
    assert backend.unfit(manifest, {k: v for k, v in fits.items() if k != "x"}) == (
        "no value for input 'x' (float32 [?,4])")
    assert backend.unfit(manifest, {**fits, "x": np.zeros((4,), np.float32)}) == (
        "input 'x' takes rank 2 ([?,4]), the feed has shape [4]")
    assert backend.unfit(manifest, {**fits, "x": np.zeros((2, 5), np.float32)}) == (
        "input 'x' takes [?,4], the feed has shape [2, 5] (dimension 1)")
    assert backend.unfit(manifest, {**fits, "ids": np.zeros((9, 2, 3), np.int64)}) == (
        "input 'ids' takes [1..8,2..,3], the feed has shape [9, 2, 3] (dimension 0)")
    assert "(dimension 1)" in backend.unfit(manifest, {**fits, "ids": np.zeros((1, 1, 3), np.int64)})
    # a bare IR (or an engine step not built yet) records no inputs: nothing to say before loading
    assert backend.unfit({"backend": "openvino"}, {}) is None
    assert backend.unfit({"backend": "openvino", "precision": "fp32", "hint": "latency"}, fits) is None


def test_failures_are_explained(tmp_path):
    ir = to_ir(make_mlp(tmp_path / "mlp.onnx"), tmp_path / "ir" / "model.xml")
    with OpenVINORunner(ir) as runner:
        assert not hasattr(runner, "unfit")  # the backend says it, from the manifest
        with pytest.raises(StepError, match=r"has no inputs \['z'\]"):
            runner.infer({"z": np.zeros((1, 4), np.float32)})
        with pytest.raises(InferenceError) as info:
            runner.infer({"x": np.zeros((2, 5), np.float32)})
    assert "Exception from" not in str(info.value) and "failed at" not in str(info.value)


def test_a_file_openvino_cannot_read(tmp_path):
    (tmp_path / "model.xml").write_text("<net>not really</net>")
    with pytest.raises(StepError, match=r"OpenVINO cannot read .*model\.xml"), OpenVINORunner(tmp_path / "model.xml"):
        pass


def test_messages_lose_source_locations():
    exc = RuntimeError("Exception from src/inference/src/cpp/core.cpp:84:\n"
                       "Check 'false' failed at src/frontends/common/src/frontend.cpp:117:\n"
                       "FrontEnd API failed with GeneralFailure:\nonnx: Could not open the file: \"m.onnx\"\n")
    assert loader.message(exc) == 'onnx: Could not open the file: "m.onnx"'
    failed = RuntimeError(
        "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
        "FrontEnd API failed with OpConversionFailure:\n"
        "Model wasn't fully converted. Failed operations detailed log:\n-- Conv-17 with a message:\n"
        "[ONNX Frontend] Conversion failed for Conv-17\n"
        "While validating ONNX node '<Node(Conv): c1>': Check 'data_rank.compatible(filters_rank)' failed at "
        "src/core/shape_inference/include/convolution_shape_inference_util.hpp:299:\n"
        "While validating node 'opset1::Convolution Convolution_5' with friendly_name 'Convolution_5':\n"
        "Data batch and filters rank do not match\n\nSummary:\n-- Conversion is failed for: Conv-17\n")
    assert loader.conversion_failure(failed) == ("converting Conv node (output 'c1') failed: Data batch and "
                                                 "filters rank do not match")


def test_conversion_with_a_real_shape_error_names_the_node(tmp_path):
    """A Conv whose weights do not match its input's rank: OpenVINO's own message, parsed
    (OpenVINO names the node by its output)."""
    w = numpy_helper.from_array(np.zeros((2, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="badconv")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "b.onnx"))
    with pytest.raises(Exception) as info:
        loader.import_openvino().convert_model(str(tmp_path / "b.onnx"))
    assert loader.conversion_failure(info.value) == (
        "converting Conv node (output 'y') failed: Data batch and filters rank do not match (data batch "
        "shape: [1,3,8,8], filters shape: [2,3,3]).")


def test_openvino_and_nncf_send_no_telemetry(tmp_path):
    """convert_model and NNCF report usage and write ~/intel/ unless the telemetry package is
    kept out, as the loader does."""
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    code = ("from optbuild.backends.openvino import loader; ov = loader.import_openvino(); "
            f"ov.convert_model({str(onnx_path)!r}); "
            "import importlib.util; importlib.util.find_spec('nncf') and loader.import_nncf()")
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={**os.environ, "HOME": str(home), "CI": "", "NNCF_CI": ""})
    assert list(home.iterdir()) == []
