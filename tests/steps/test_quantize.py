"""kind = "quantize": dynamic and static (QDQ, from a calibration table) INT8, and float16."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from optbuild.common.errors import StepError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import make_mlp, make_two_inputs, save
from plugins.steps import calibrate, run_step

from optbuild.common.fingerprint import Fingerprint
from optbuild.model.onnxgraph import all_nodes
from optbuild.steps.base import Artifact, StepContext
from optbuild.steps.quantize import HOST_FIELD, Quantize, QuantizeParams, x86_without_vnni


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
    model, _ = quantize(tmp_path, mlp, "q4", calib, mode="static", op_types_to_quantize=["Relu"],
                        allow_unchanged=True)  # a lone Relu is not quantized: accepted here
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


def make_additive_mask(path: Path) -> Path:
    """x -> MatMul -> Add(mask) -> Softmax -> y, nodes unnamed, the mask a weight holding -inf
    in its last two places (the additive form of an attention mask)."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32), "w")
    mask = numpy_helper.from_array(np.array([0, 0, -np.inf, -np.inf], np.float32), "mask")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]), helper.make_node("Add", ["scores", "mask"], ["masked"]),
         helper.make_node("Softmax", ["masked"], ["y"], axis=-1)],
        "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, mask])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_static_keeps_the_nodes_around_an_infinite_fill_float(tmp_path, capsys):
    """Before: the -inf mask was quantized as the Add's weight (a NaN scale) and every output
    came out 0.25, masked places included; the check ran it without a word."""
    path = make_additive_mask(tmp_path / "mask.onnx")
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    calibrate(tmp_path, path, data="calib.npz")
    x = x[:1]
    model, ctx = quantize(tmp_path, path, calibration=tmp_path / "out" / "calibrate" / "calibration.json",
                          mode="static")
    assert ctx.metrics["infinite_fill_nodes"] == ["Add_1", "Softmax_2"]  # unnamed: named to be excluded
    assert "kept float: Add_1, Softmax_2, which read or make a tensor filled with infinity" in capsys.readouterr().err
    got, want = run(model, {"x": x})[0], run(path, {"x": x})[0]
    assert np.all(got[:, 2:] == 0)  # the masked places stay masked
    np.testing.assert_allclose(got, want, atol=0.02)


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
    (None, "FLOAT", "FLOAT"),  # the default keeps the model's interface
    (False, "FLOAT16", "FLOAT16"),
    (True, "FLOAT", "FLOAT"),
    (["y"], "FLOAT16", "FLOAT"),
    (["x"], "FLOAT", "FLOAT16"),
])
def test_fp16(tmp_path, mlp, keep, x_type, y_type):
    pytest.importorskip("onnxconverter_common")
    model, _ctx = quantize(tmp_path, mlp, mode="fp16", **({} if keep is None else {"keep_io_types": keep}))
    types = elem_types(model)
    assert types == {"x": getattr(onnx.TensorProto, x_type), "y": getattr(onnx.TensorProto, y_type)}
    assert initializer(model, "w1").dtype == np.float16
    feeds = {"x": X["x"].astype(np.float16 if x_type == "FLOAT16" else np.float32)}
    got = run(model, feeds)[0]
    assert got.dtype == (np.float16 if y_type == "FLOAT16" else np.float32)
    reference = run(mlp, X)[0]
    assert np.abs(got.astype(np.float32) - reference).max() < 0.01 * np.abs(reference).max() + 1e-2


def output_types(model) -> dict[str, int]:
    """Node name -> elem_type of its first output, as onnx shape inference derives it."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    return {n.name: types.get(n.output[0]) for n in inferred.graph.node}


def make_resize_softmax(path: Path) -> Path:
    """x -> Add -> Resize (in the converter's default block list) -> Softmax -> Mul -> y."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["a"], name="double"),
         helper.make_node("Resize", ["a", "", "scales"], ["r"], name="up", mode="nearest"),
         helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=-1),
         helper.make_node("Mul", ["s", "s"], ["y"], name="square")],
        "blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_fp16_op_block_list_adds_to_the_converters_defaults(tmp_path):
    """Before, op_block_list = ["Softmax"] replaced the converter's list: Resize went float16."""
    pytest.importorskip("onnxconverter_common")
    path = make_resize_softmax(tmp_path / "blocks.onnx")
    default, _ = quantize(tmp_path, path, "default", mode="fp16")
    added, _ = quantize(tmp_path, path, "added", mode="fp16", op_block_list=["Softmax"])
    f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
    assert {k: output_types(default)[k] for k in ("double", "up", "softmax", "square")} == {
        "double": f16, "up": f32, "softmax": f16, "square": f16}
    assert {k: output_types(added)[k] for k in ("double", "up", "softmax", "square")} == {
        "double": f16, "up": f32, "softmax": f32, "square": f16}
    x = {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)}
    np.testing.assert_allclose(run(added, x)[0], run(path, x)[0], rtol=1e-2)


def make_yolo_grid(path: Path) -> Path:
    """A YOLOv8 head's pattern: the feature map's width, Cast to float32, scales the features
    (y = x * W + x * (W - 1)). The converter types the Casts' outputs float16 but keeps their
    ``to = FLOAT``: onnxruntime refused the result ('Type (tensor(float16)) of output arg (w)
    of node (/model.22/Cast) does not match expected type (tensor(float))'), one node a load."""
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"], name="/model.22/Shape"),
         helper.make_node("Gather", ["shape", "two"], ["width"], name="/model.22/Gather", axis=0),
         helper.make_node("Cast", ["width"], ["w"], name="/model.22/Cast", to=TensorProto.FLOAT),
         helper.make_node("Sub", ["width", "one"], ["left"], name="/model.22/Sub"),
         helper.make_node("Cast", ["left"], ["w1"], name="/model.22/Cast_1", to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "w"], ["a"], name="/model.22/Mul"),
         helper.make_node("Mul", ["x", "w1"], ["b"], name="/model.22/Mul_1"),
         helper.make_node("Add", ["a", "b"], ["y"], name="/model.22/Add")],
        "grid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
        [numpy_helper.from_array(np.array(2, np.int64), "two"), numpy_helper.from_array(np.array(1, np.int64), "one")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_fp16_keeps_the_casts_the_converter_types_wrong_in_float32(tmp_path, capsys):
    pytest.importorskip("onnxconverter_common")
    from onnxconverter_common import float16

    path = make_yolo_grid(tmp_path / "grid.onnx")
    plain = float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    with pytest.raises(Exception, match=r"of node \(/model.22/Cast(_1)?\) does not match expected type"):
        run(plain, {})  # the converter alone: unloadable
    model, ctx = quantize(tmp_path, path, mode="fp16")
    assert ctx.metrics["fp16_blocked_nodes"] == ["/model.22/Cast", "/model.22/Cast_1"]
    assert "kept in float32, as node_block_list would: /model.22/Cast, /model.22/Cast_1" in capsys.readouterr().err
    x = {"x": np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run(model, x)[0], run(path, x)[0], rtol=2e-3, atol=2e-3)
    assert output_types(model)["/model.22/Mul"] == TensorProto.FLOAT16  # the rest is float16


def make_output_read_inside(path: Path) -> Path:
    """x -> Conv -> feat (a graph output) -> Conv -> y: a feature map both returned and read on,
    as a detector's neck returns its levels. Before, keep_io_types = true Cast feat back to float32
    at the border and the second Conv, float16, read that: onnxruntime refused the model ('Type
    parameter (T) of Optype (Conv) bound to different types')."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["feat"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["feat", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])],
        "neck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.standard_normal((2, 4, 3, 3)).astype(np.float32), "w2")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_fp16_output_read_inside_the_graph_loads_and_matches(tmp_path, capsys):
    pytest.importorskip("onnxconverter_common")
    path = make_output_read_inside(tmp_path / "neck.onnx")
    model, ctx = quantize(tmp_path, path, mode="fp16", keep_io_types=True)
    assert ctx.metrics["fp16_outputs_read_inside"] == ["feat"]
    assert "output(s) feat also read inside the graph" in capsys.readouterr().err
    assert elem_types(model) == {"x": TensorProto.FLOAT, "feat": TensorProto.FLOAT, "y": TensorProto.FLOAT}
    assert output_types(model)["conv2"] == TensorProto.FLOAT16  # the reader stays float16
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    for got, want in zip(run(model, x), run(path, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


def test_fp16_names_to_keep_must_exist(tmp_path, mlp):
    pytest.importorskip("onnxconverter_common")
    with pytest.raises(StepError, match=r"keep_io_types: the model has no input or output \['logits'\]"):
        quantize(tmp_path, mlp, mode="fp16", keep_io_types=["logits"])


# --- parameters -----------------------------------------------------------------------------------
@pytest.mark.parametrize("params, words", [
    ({"mode": "static"}, "mode 'static' needs calibration"),
    ({"mode": "dynamic", "calibration": "calibrate"}, "'calibration' does not apply to mode 'dynamic'"),
    ({"mode": "dynamic", "activation_type": "int8"}, "'activation_type' does not apply to mode 'dynamic'"),
    ({"mode": "fp16", "per_channel": True}, "'per_channel' does not apply to mode 'fp16'"),
    ({"mode": "static", "calibration": "c", "keep_io_types": False}, "'keep_io_types' does not apply"),
    ({"mode": "dynamic", "op_block_list": ["Softmax"]}, "'op_block_list' does not apply"),
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


# --- models as third-party exporters write them (issue #9) ----------------------------------------
def constant(name: str, array: np.ndarray):
    """A Constant node holding ``array``: how paddle2onnx (and some onnxsim outputs) store weights."""
    return helper.make_node("Constant", [], [name], name=f"{name}/Constant",
                            value=numpy_helper.from_array(array, name))


def make_constant_weights(path: Path, opset: int = 17) -> Path:
    """x [1, 2, 4, 4] -> Conv (weight, bias) -> Relu -> Reshape -> MatMul -> y [1, 5], every
    weight a Constant node (none an initializer)."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [constant("w", rng.standard_normal((3, 2, 1, 1)).astype(np.float32)),
         constant("b", rng.standard_normal(3).astype(np.float32)),
         constant("shape", np.array([1, 48], np.int64)),
         constant("wm", rng.standard_normal((48, 5)).astype(np.float32)),
         helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
         helper.make_node("MatMul", ["f", "wm"], ["y"], name="fc")],
        "paddle_style",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


def make_branches(path: Path) -> Path:
    """y = If(flag): x @ w1 else x @ w2, each weight a Constant inside its branch: every op
    that could be quantized sits in a subgraph, as in silero-vad."""
    rng = np.random.default_rng(4)

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph(
            [constant(f"{name}_w", rng.standard_normal((4, 3)).astype(np.float32)),
             helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"], name=f"{name}/fc")],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 3])])

    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=branch("then"),
                          else_branch=branch("else"))],
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def all_ops(model) -> list[str]:
    return [n.op_type for n in all_nodes(model.graph)]


def test_constant_weights_become_initializers_in_a_private_copy(tmp_path):
    """Before: onnxruntime's 'ValueError: Expected w to be an initializer'. The upstream file
    is left as it was, and the result is the same bytes every time."""
    model_path = make_constant_weights(tmp_path / "upstream" / "model.onnx")
    upstream = model_path.read_bytes()
    model, ctx = quantize(tmp_path, model_path, "q1", mode="dynamic")
    assert ctx.metrics["constants_to_initializers"] == 4
    assert {"ConvInteger", "MatMulInteger"} <= set(all_ops(model))
    assert "Constant" not in all_ops(model)
    assert model_path.read_bytes() == upstream
    _, again = quantize(tmp_path, model_path, "q2", mode="dynamic")
    assert (again.out_dir / "model.onnx").read_bytes() == (ctx.out_dir / "model.onnx").read_bytes()
    x = {"x": np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)}
    reference, got = run(model_path, x)[0], run(model, x)[0]
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()

    ranges = {"x": [-3.0, 3.0], "c": [-6.0, 6.0], "r": [0.0, 6.0], "f": [0.0, 6.0], "y": [-20.0, 20.0]}
    model, ctx = quantize(tmp_path, model_path, "q3", table(tmp_path, ranges), mode="static")
    assert ctx.metrics["constants_to_initializers"] == 4 and ctx.metrics["dequantize_linear"] >= 3


def test_a_weight_computed_in_the_graph_gets_a_hint(tmp_path):
    """onnxruntime still wants a stored weight where a Conv with a bias reads a computed one."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["w_shared"], name="share"),
         helper.make_node("Conv", ["x", "w_shared", "b"], ["y"], name="conv")],
        "computed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
        [numpy_helper.from_array(rng.standard_normal((3, 2, 1, 1)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with pytest.raises(StepError, match=r"Expected w_shared to be an initializer\nhint: the weight 'w_shared' "
                                        r"is computed by Identity node 'share'.*simplify step.*"
                                        r"nodes_to_exclude = \['conv'\]"):
        quantize(tmp_path, path, mode="dynamic")


def test_dynamic_quantizes_inside_subgraphs(tmp_path):
    """Before: the If's branches were left alone, the float model passed as quantized."""
    path = make_branches(tmp_path / "branches.onnx")
    model, ctx = quantize(tmp_path, path, mode="dynamic")
    branches = [a.g for a in model.graph.node[0].attribute]
    assert all("MatMulInteger" in [n.op_type for n in g.node] for g in branches)
    assert ctx.metrics["integer_ops"] == 2 and ctx.metrics["constants_to_initializers"] == 2
    assert ctx.metrics["nodes_before"] == 5  # the If and the Constant + MatMul of each branch
    feeds = {"x": X["x"], "flag": np.array(False)}
    reference, got = run(path, feeds)[0], run(model, feeds)[0]
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()


@pytest.mark.parametrize("params, why", [
    ({"mode": "static"}, (r"its 2 quantizable nodes \(first: MatMul 'else/fc'\) all sit inside If/Loop/Scan "
                          r"subgraphs, which onnxruntime's static quantization does not enter \(only "
                          r'mode = "dynamic" quantizes subgraphs\)')),
    ({"mode": "dynamic", "extra_options": {"EnableSubgraph": False}},
     r"its 2 quantizable nodes .* all sit inside If/Loop/Scan subgraphs, and extra_options EnableSubgraph = false"),
    ({"mode": "dynamic", "nodes_to_exclude": ["then/fc", "else/fc"]},
     r"nodes_to_quantize / nodes_to_exclude leave none of its 2 quantizable nodes"),
    ({"mode": "dynamic", "op_types_to_quantize": ["Softmax"]},
     r"onnxruntime's dynamic quantization handles none of op_types_to_quantize \['Softmax'\]"),
])
def test_quantizing_nothing_is_an_error_that_says_why(tmp_path, params, why):
    path = make_branches(tmp_path / "branches.onnx")
    calibration = table(tmp_path, {"x": [-3.0, 3.0]}) if params["mode"] == "static" else None
    with pytest.raises(StepError, match=r"the (static|dynamic) INT8 result quantizes nothing .* it is the "
                                        r"float model\. Likely why: " + why + r".*set allow_unchanged = true"):
        quantize(tmp_path, path, "q1", calibration, **params)
    model, _ = quantize(tmp_path, path, "q2", calibration, allow_unchanged=True, **params)
    assert not any(op.endswith("Integer") or "Quantize" in op for op in all_ops(model))


@pytest.mark.parametrize("format", ["qdq", "qoperator"])
def test_static_per_channel_below_opset_13_fails_first_with_the_fix(tmp_path, format):
    """Before: onnxruntime wrote a model that did not load ('Unrecognized attribute: axis for
    operator DequantizeLinear'; QOperator too, for the MatMul weight)."""
    path = make_constant_weights(tmp_path / "m.onnx", opset=12)
    calibration = table(tmp_path, {"x": [-3.0, 3.0], "c": [-6.0, 6.0]})
    with pytest.raises(StepError) as error:
        quantize(tmp_path, path, "q1", calibration, mode="static", per_channel=True, format=format, check=False)
    assert str(error.value).startswith("per_channel = true in static mode needs opset 13 or later")
    assert "t:input-of-q1 is opset 12" in str(error.value)
    assert '[steps.opset13]\nkind = "opset"\ninput = "model"\nversion = 13\n' in str(error.value)
    model, _ = quantize(tmp_path, path, "q2", mode="dynamic", per_channel=True)  # no axis needed there
    assert "ConvInteger" in all_ops(model)


def make_stale_resize(path: Path) -> Path:
    """x -> Add -> Resize -> Add -> y with the Resize output's value_info written twice, as
    onnxslim writes it: onnxconverter-common retypes only the first entry to float16."""
    info = helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 1, 4, 4])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["a"], name="double"),
         helper.make_node("Resize", ["a", "", "scales"], ["r"], name="up"),
         helper.make_node("Add", ["r", "r"], ["y"], name="twice")],
        "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")], value_info=[info, info])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_fp16_ignores_duplicated_value_info(tmp_path):
    """Before: 'Type (tensor(float)) of output arg (r) of node (up_output_cast0) does not match
    expected type (tensor(float16))' when onnxruntime loaded the result."""
    pytest.importorskip("onnxconverter_common")
    path = make_stale_resize(tmp_path / "resize.onnx")
    model, ctx = quantize(tmp_path, path, mode="fp16", keep_io_types=True)
    assert ctx.metrics["value_info_dropped"] == 2
    x = {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)}
    np.testing.assert_allclose(run(model, x)[0], run(path, x)[0], rtol=1e-3)


def test_check_false_still_refuses_what_onnxruntime_or_the_checker_rejects(tmp_path):
    """check = false skips the run, not the load: before, both results were kept."""
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    custom = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
         helper.make_node("Mystery", ["h"], ["y"], name="mystery", domain="example.custom")],
        "custom", [x_info], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w])
    path = save(helper.make_model(custom, opset_imports=[helper.make_opsetid("", 17),
                                                         helper.make_opsetid("example.custom", 1)]),
                tmp_path / "custom.onnx")
    with pytest.raises(StepError, match=r"the dynamic model does not load in onnxruntime \(CPU\): .*Mystery"):
        quantize(tmp_path, path, "q1", mode="dynamic", check=False)

    wrong = helper.make_graph(  # y declared [batch, 5]: onnxruntime warns and runs, the checker refuses
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        "wrong", [x_info], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], [w])
    path = save(helper.make_model(wrong, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "wrong.onnx")
    with pytest.raises(StepError, match=r"the dynamic model fails onnx.checker \(full_check\): .*"
                                        r"Inferred shape and existing shape differ"):
        quantize(tmp_path, path, "q2", mode="dynamic", check=False)


# --- reduce_range follows the host where it is not set -----------------------------------------
NO_VNNI = Fingerprint({"cpu.arch": "x86_64", "cpu.flags": "sse4_1,sse4_2,avx,avx2,fma,f16c"})
VNNI = Fingerprint({"cpu.arch": "x86_64", "cpu.flags": "avx2,avx512f,avx512_vnni"})
ARM = Fingerprint({"cpu.arch": "aarch64", "cpu.flags": "asimd,asimddp"})


def quantize_on(tmp_path: Path, model: Path, host: Fingerprint, name: str, **params):
    """Run the step as the worker would on ``host`` (a recorded fingerprint)."""
    step = Quantize(QuantizeParams.model_validate({"input": "model", **params}), tmp_path, tmp_path)
    out = tmp_path / "out" / name
    out.mkdir(parents=True)
    ctx = StepContext(step_id=f"t:{name}", base_dir=tmp_path, project_root=tmp_path, out_dir=out,
                      inputs={"input": Artifact("t:model", model.parent, {model.name: model}, model)}, host=host)
    step.run(ctx)
    return onnx.load(str(out / "model.onnx")), ctx


def test_reduce_range_defaults_to_true_on_x86_without_vnni(tmp_path, mlp):
    """int8 weights on an AVX2-only CPU: 7-bit weights by default; full 8 bits with VNNI."""
    assert x86_without_vnni(NO_VNNI) and not x86_without_vnni(VNNI) and not x86_without_vnni(ARM)
    for host, name, reduced in ((NO_VNNI, "avx2", True), (VNNI, "vnni", False)):
        model, ctx = quantize_on(tmp_path, mlp, host, name, mode="dynamic")
        assert ctx.metrics["reduce_range"] is reduced
        w1 = next(t for t in model.graph.initializer if t.name == "w1_quantized")
        assert bool(np.abs(numpy_helper.to_array(w1).astype(np.int32)).max() <= 64) is reduced
    _, ctx = quantize_on(tmp_path, mlp, NO_VNNI, "set", mode="dynamic", reduce_range=False)
    assert ctx.metrics["reduce_range"] is False


@pytest.mark.parametrize("params, follows", [
    ({"mode": "dynamic"}, True),
    ({"mode": "static", "calibration": "c"}, True),
    ({"mode": "dynamic", "reduce_range": True}, False),
    ({"mode": "dynamic", "reduce_range": False}, False),
    ({"mode": "dynamic", "weight_type": "uint8"}, False),  # u8u8 does not saturate
    ({"mode": "fp16"}, False),
])
def test_the_key_holds_the_hosts_vnni_only_where_it_picks_reduce_range(params, follows):
    step = Quantize(QuantizeParams.model_validate({"input": "s", **params}), Path("."), Path("."))
    keys = [step.host_key(host) for host in (NO_VNNI, VNNI, ARM)]
    if follows:
        assert keys == [{HOST_FIELD: True}, {HOST_FIELD: False}, {HOST_FIELD: False}]
    else:
        assert keys == [{}, {}, {}]
