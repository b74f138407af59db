"""kind = "quantize": dynamic and static (QDQ, from a calibration table) INT8, and float16."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from optbuild.errors import StepError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper
from test_step_calibrate import calibrate, make_mlp, make_two_inputs, run_step

from optbuild.steps.quantize import Quantize, QuantizeParams


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return make_mlp(tmp_path / "mlp.onnx")


def table(tmp_path: Path, tensors: dict, method: str = "minmax", name: str = "table.json") -> Path:
    """A hand-written table with only the fields a table needs: it is a portable format."""
    path = tmp_path / name
    path.write_text(json.dumps({"format": "optbuild.calibration", "version": 1, "method": method,
                                "tensors": tensors}))
    return path


def quantize(tmp_path: Path, model: Path, name: str = "quantize", calibration: Path | None = None, **params):
    inputs = {"input": model} | ({"calibration": calibration} if calibration else {})
    refs = {"calibration": "calibrate"} if calibration else {}
    _, ctx = run_step(Quantize, {"input": "model", **refs, **params}, inputs, tmp_path, name)
    return onnx.load(str(ctx.out_dir / "model.onnx")), ctx


def initializer(model, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def quant_params(model, tensor: str) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of the QuantizeLinear that quantizes ``tensor``."""
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return initializer(model, node.input[1]), initializer(model, node.input[2])


def run(path_or_model, feeds: dict) -> list[np.ndarray]:
    data = path_or_model.SerializeToString() if hasattr(path_or_model, "SerializeToString") else str(path_or_model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


X = {"x": np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32)}


# --- static -------------------------------------------------------------------------------------
def test_static_qdq_takes_its_ranges_from_the_table(tmp_path, mlp):
    """The ranges in the QDQ model are the table's (not re-measured): x gets [-2, 2] from a
    hand-written table whatever data would have shown."""
    ranges = {"x": [-2.0, 2.0], "h": [-6.0, 6.0], "hb": [-6.0, 6.0], "r": [0.0, 6.0], "y": [-10.0, 10.0]}
    model, ctx = quantize(tmp_path, mlp, mode="static", calibration=table(tmp_path, ranges))
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    scale, zero = quant_params(model, "x")
    assert float(scale) == pytest.approx(4.0 / 255, rel=1e-6)
    assert zero.dtype == np.uint8 and int(zero) == 128
    assert ctx.metrics["calibrated_tensors"] == 5 and ctx.metrics["mode"] == "static"
    reference = run(mlp, X)[0]
    got = run(model, X)[0]
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()


def test_static_from_a_calibrate_step(tmp_path, mlp):
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32))
    calibrate(tmp_path, mlp, data="calib.npz")
    calib = tmp_path / "out" / "calibrate" / "calibration.json"
    model, _ = quantize(tmp_path, mlp, mode="static", calibration=calib)
    low, high = json.loads(calib.read_text())["tensors"]["x"]
    scale, _zero = quant_params(model, "x")
    assert float(scale) == pytest.approx((high - low) / 255, rel=1e-5)
    reference, got = run(mlp, X)[0], run(model, X)[0]
    cosine = float(np.dot(reference.ravel(), got.ravel()) / np.linalg.norm(reference) / np.linalg.norm(got))
    assert cosine > 0.99


def test_static_options(tmp_path, mlp):
    ranges = {"x": [-2.0, 2.0], "h": [-6.0, 6.0], "hb": [-6.0, 6.0], "r": [0.0, 6.0], "y": [-10.0, 10.0]}
    calib = table(tmp_path, ranges, method="entropy")
    model, _ = quantize(tmp_path, mlp, "q1", calib, mode="static", activation_type="int8",
                        symmetric_activations=True, per_channel=True, reduce_range=True)
    _scale, zero = quant_params(model, "x")
    assert zero.dtype == np.int8 and int(zero) == 0  # symmetric int8 activations
    dq_w1 = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w1"))
    weights, w_scale = initializer(model, dq_w1.input[0]), initializer(model, dq_w1.input[1])
    assert w_scale.size == 8  # one scale per output channel of the 4x8 MatMul weight
    assert np.abs(weights.astype(np.int32)).max() <= 64  # reduce_range: 7-bit weights

    model, _ = quantize(tmp_path, mlp, "q2", calib, mode="static", nodes_to_exclude=["fc2"])
    fc2 = next(n for n in model.graph.node if n.name == "fc2")
    assert "w2" in fc2.input  # fc2 kept float: its weight is the float initializer
    model, _ = quantize(tmp_path, mlp, "q3", calib, mode="static", format="qoperator")
    assert "QLinearMatMul" in [n.op_type for n in model.graph.node]
    model, _ = quantize(tmp_path, mlp, "q4", calib, mode="static", op_types_to_quantize=["Relu"])
    assert "QLinearMatMul" not in [n.op_type for n in model.graph.node]
    assert not any(n.op_type == "DequantizeLinear" and n.input[0].startswith("w") for n in model.graph.node)


def test_static_refuses_a_table_of_another_model_or_no_table(tmp_path, mlp):
    with pytest.raises(StepError, match="names no tensor of .*made for another model"):
        quantize(tmp_path, mlp, "q1", table(tmp_path, {"/conv/Conv_output_0": [0.0, 1.0]}), mode="static")
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"version": 1, "passed": True}))
    with pytest.raises(StepError, match="is not a calibrate step"):
        quantize(tmp_path, mlp, "q2", report, mode="static")


def test_unknown_node_names_are_errors_not_silently_ignored(tmp_path, mlp):
    with pytest.raises(StepError, match=r"nodes_to_exclude: the model has no node named 'fc3'; did you mean 'fc\d'"):
        quantize(tmp_path, mlp, mode="dynamic", nodes_to_exclude=["fc3"])


# --- dynamic ------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight_type, per_channel", [("int8", False), ("uint8", True)])
def test_dynamic(tmp_path, mlp, weight_type, per_channel):
    model, ctx = quantize(tmp_path, mlp, mode="dynamic", weight_type=weight_type, per_channel=per_channel)
    ops = [n.op_type for n in model.graph.node]
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    assert ctx.metrics["integer_ops"] == 2
    reference, got = run(mlp, X)[0], run(model, X)[0]
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()


def test_dynamic_leaves_integer_inputs_alone(tmp_path):
    model_path = make_two_inputs(tmp_path / "two.onnx")
    model, _ = quantize(tmp_path, model_path, mode="dynamic", weight_type="uint8")
    feeds = {"a": np.ones((2, 4), np.float32), "ids": np.array([[1, 2], [3, 4]], np.int64)}
    assert run(model, feeds)[0].shape == (2, 3)


# --- float16 ------------------------------------------------------------------------------------
def elem_types(model) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}


@pytest.mark.parametrize("keep, x_type, y_type", [
    (False, "FLOAT16", "FLOAT16"),
    (True, "FLOAT", "FLOAT"),
    (["y"], "FLOAT16", "FLOAT"),
    (["x"], "FLOAT", "FLOAT16"),
])
def test_fp16(tmp_path, mlp, keep, x_type, y_type):
    pytest.importorskip("onnxconverter_common")
    model, _ctx = quantize(tmp_path, mlp, mode="fp16", keep_io_types=keep)
    types = elem_types(model)
    assert types == {"x": getattr(onnx.TensorProto, x_type), "y": getattr(onnx.TensorProto, y_type)}
    assert initializer(model, "w1").dtype == np.float16
    feeds = {"x": X["x"].astype(np.float16 if x_type == "FLOAT16" else np.float32)}
    got = run(model, feeds)[0]
    assert got.dtype == (np.float16 if y_type == "FLOAT16" else np.float32)
    reference = run(mlp, X)[0]
    assert np.abs(got.astype(np.float32) - reference).max() < 0.01 * np.abs(reference).max() + 1e-2


def test_fp16_names_to_keep_must_exist(tmp_path, mlp):
    pytest.importorskip("onnxconverter_common")
    with pytest.raises(StepError, match=r"keep_io_types: the model has no input or output \['logits'\]"):
        quantize(tmp_path, mlp, mode="fp16", keep_io_types=["logits"])


# --- parameters -----------------------------------------------------------------------------------
@pytest.mark.parametrize("params, words", [
    ({"mode": "static"}, "mode 'static' needs calibration"),
    ({"mode": "dynamic", "calibration": "calibrate"}, "'calibration' do not apply to mode 'dynamic'"),
    ({"mode": "dynamic", "activation_type": "int8"}, "'activation_type' do not apply to mode 'dynamic'"),
    ({"mode": "fp16", "per_channel": True}, "'per_channel' do not apply to mode 'fp16'"),
    ({"mode": "static", "calibration": "c", "keep_io_types": True}, "'keep_io_types' do not apply"),
    ({"mode": "int4"}, "'dynamic', 'static' or 'fp16'"),
    ({"mode": "dynamic", "weight_type": "int4"}, "'int8' or 'uint8'"),
    ({"mode": "dynamic", "extra_options": {"Bogus": True}}, "unknown extra option 'Bogus'"),
    ({"mode": "dynamic", "extra_options": {"WeightSymmetric": True}}, "use the parameter 'symmetric_weights'"),
    ({"mode": "static", "calibration": "c", "extra_options": {"CalibMovingAverage": True}},
     "calibration setting: set it on the calibrate step"),
    ({"mode": "dynamic", "extra_options": {"MatMulConstBOnly": "yes"}}, "must be a bool"),
    ({"mode": "fp16", "keep_io_types": []}, "empty list keeps nothing"),
    ({"mode": "dynamic", "nodes_to_quantize": ["a"], "nodes_to_exclude": ["a"]}, "both quantized and excluded"),
])
def test_params_are_validated(params, words):
    with pytest.raises(ValidationError, match=words):
        QuantizeParams.model_validate({"input": "simplify", **params})


@pytest.mark.parametrize("raw", [
    {"mode": "dynamic", "per_channel": True},
    {"mode": "static", "calibration": "calibrate", "extra_options": {"MatMulConstBOnly": True}},
    {"mode": "fp16", "keep_io_types": ["b", "a"]},
])
def test_params_survive_the_workers_round_trip(raw):
    params = QuantizeParams.model_validate({"input": "s", **raw})
    assert QuantizeParams.model_validate(params.model_dump(mode="json")) == params


def test_tools_follow_the_mode():
    def tools(**raw) -> tuple[str, ...]:
        return Quantize(QuantizeParams.model_validate({"input": "s", **raw}), Path("."), Path(".")).tool_names()

    assert "onnxconverter-common" in tools(mode="fp16")
    assert "onnxconverter-common" not in tools(mode="dynamic")
    assert "onnxruntime" in tools(mode="static", calibration="c")


@pytest.mark.parametrize("mode", ["calibrate", "dynamic", "static"])
def test_onnxruntime_never_writes_into_the_upstream_artifact(tmp_path, mode):
    """onnxruntime.quantization writes ``<model>-inferred.onnx`` beside the model it is given
    and deletes it: in an upstream artifact that races the other steps reading it (seen as a
    FileNotFoundError when calibrate and quantize ran at once). A folder squatting on that
    name makes any such write fail here."""
    upstream = tmp_path / "upstream"
    model = make_mlp(upstream / "model.onnx")
    (upstream / "model-inferred.onnx").mkdir()
    before = sorted(p.name for p in upstream.iterdir())
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    if mode == "calibrate":
        calibrate(tmp_path, model, data="calib.npz")
    elif mode == "dynamic":
        quantize(tmp_path, model, mode="dynamic")
    else:
        ranges = {name: [-4.0, 4.0] for name in ("x", "h", "hb", "r", "y")}
        quantize(tmp_path, model, mode="static", calibration=table(tmp_path, ranges))
    assert sorted(p.name for p in upstream.iterdir()) == before
