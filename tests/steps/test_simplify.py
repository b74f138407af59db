"""kind = "simplify": onnxsim / onnxslim on real exports, every rewrite checked numerically."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from plugins.models import cancelling_model, graph_model, input_dims, value
from plugins.steps import INPUT_NAME, RECIPES, artifact, context, exported_example, recipe_step
from pydantic import ValidationError

from optbuild.backends.onnxruntime.loader import session
from optbuild.common.errors import StepError
from optbuild.steps.simplify import Simplify, SimplifyParams


def simplify(tmp_path: Path, model: Path, out: str = "out", **params):
    step = Simplify(SimplifyParams.model_validate({"input": "export", **params}), RECIPES, RECIPES)
    ctx = context(tmp_path / out, RECIPES, inputs={"input": artifact(model)}, step_id="r:simplify")
    step.run(ctx)
    return ctx


def ort_run(model: Path, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def example_feeds(name: str, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    if name == "cnn":
        return {"image": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    return {"tokens": rng.integers(0, 1000, (batch, 32)).astype(np.int64)}


@pytest.mark.parametrize(("name", "backend"), [("cnn", "onnxsim"), ("transformer", "onnxsim"),
                                               ("transformer", "onnxslim")])
def test_simplified_examples_agree_with_their_exports_and_stay_dynamic(name, backend, tmp_path, tmp_path_factory):
    import onnx

    source = exported_example(name, tmp_path_factory).out_dir / "model.onnx"
    ctx = simplify(tmp_path, source, backend=backend)
    out = ctx.out_dir / "model.onnx"
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    assert [p.name for p in ctx.out_dir.iterdir()] == ["model.onnx"]
    m = ctx.metrics
    assert m["backend"] == backend and m["checks"] == 3 and m["max_rel_error"] <= 1e-4
    assert m["nodes_before"] == len(onnx.load(str(source)).graph.node)
    assert m["nodes_after"] == len(model.graph.node)
    if name == "transformer":  # the traced shape arithmetic folds away
        assert m["nodes_after"] < m["nodes_before"] * 0.6
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 3):
        feeds = example_feeds(name, batch)
        (expected,), (got,) = ort_run(source, feeds), ort_run(out, feeds)
        assert got.shape == expected.shape and got.shape[0] == batch
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    json.dumps(m)


def test_only_the_chosen_backend_enters_the_key():
    a = Simplify(SimplifyParams(input="export"), RECIPES, RECIPES)
    b = Simplify(SimplifyParams(input="export", backend="onnxslim"), RECIPES, RECIPES)
    assert a.tool_names() == ("onnx", "onnxruntime", "onnxsim")
    assert b.tool_names() == ("onnx", "onnxruntime", "onnxslim")
    assert a.step_refs() == {"input": "export"}
    assert a.key_files() == []


def test_the_recipes_validate():
    assert SimplifyParams.model_validate(recipe_step("cnn", "simplify")).backend == "onnxsim"
    assert SimplifyParams.model_validate(recipe_step("transformer", "simplify")).backend == "onnxslim"


def test_check_zero_disables_the_numeric_check(tmp_path, tmp_path_factory):
    source = exported_example("cnn", tmp_path_factory).out_dir / "model.onnx"
    ctx = simplify(tmp_path, source, backend="onnxslim", check=0)
    assert ctx.metrics["checks"] == 0 and "max_rel_error" not in ctx.metrics


def conv_bn_model(path: Path) -> Path:
    """Conv + BatchNormalization with random statistics: both backends fold BN into the
    conv, which changes the float rounding a little (about 1e-7 relative)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((8, 3, 3, 3)), "s": rng.standard_normal(8), "b": rng.standard_normal(8),
              "m": rng.standard_normal(8), "v": rng.random(8) + 0.5}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])], "convbn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16, 16])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("backend", ["onnxsim", "onnxslim"])
def test_a_rewrite_beyond_the_tolerance_fails_with_the_figures(tmp_path, backend):
    source = conv_bn_model(tmp_path / "convbn.onnx")
    ctx = simplify(tmp_path, source, backend=backend)
    assert (ctx.metrics["nodes_before"], ctx.metrics["nodes_after"]) == (2, 1)
    assert 0 < ctx.metrics["max_rel_error"] < 1e-4
    with pytest.raises(StepError, match=rf"{backend} changed the outputs of r:export \(check 0, seeded "
                                        r"inputs x \[1, 3, 16, 16\]\): output 'y': max relative error [0-9.e-]+ > "
                                        r"tolerance 1e-12 and max abs error [0-9.e-]+ > atol 9.54e-07"):
        simplify(tmp_path, source, out="strict", backend=backend, tolerance=1e-12)


def wrong_annotation_model(path: Path) -> Path:
    """y = Relu(x) + ones(shape(Relu(x))), whose intermediate value_info wrongly claims a
    static [2, 3]: the kind of bad annotation that made onnxslim change a model's shape."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Shape", ["t"], ["s"]),
         helper.make_node("ConstantOfShape", ["s"], ["z"],
                          value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("Add", ["t", "z"], ["y"])], "wrong",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_onnxsim_folding_a_wrong_annotation_is_caught_by_the_check(tmp_path):
    source = wrong_annotation_model(tmp_path / "wrong.onnx")
    # run as written, the input model is right at batch 1 (ORT's own optimizer would trust
    # the annotation too, which is why the check runs both models unoptimized)
    (y,) = session(source, level="disable").run(None, {"x": np.ones((1, 3), np.float32)})
    assert y.shape == (1, 3)
    assert ort_run(source, {"x": np.ones((1, 3), np.float32)})[0].shape == (2, 3)
    with pytest.raises(StepError, match=r"onnxsim changed the outputs of r:export \(check 0, seeded inputs x \[1, 3\]\): "
                                        r"output 'y' has shape \(2, 3\), expected \(1, 3\)"):
        simplify(tmp_path, source, backend="onnxsim")


def test_onnxslim_changing_the_input_shape_is_caught(tmp_path):
    source = wrong_annotation_model(tmp_path / "wrong.onnx")
    with pytest.raises(StepError, match=r"onnxslim changed the declared input shapes of r:export: "
                                        r"\{'x': \['batch', 3\]\} -> \{'x': \[2, 3\]\} \(x dim 0: 'batch' became 2\)"):
        simplify(tmp_path, source, backend="onnxslim")


def test_a_missing_or_unreadable_input_model_is_an_error(tmp_path):
    step = Simplify(SimplifyParams(input="export"), RECIPES, RECIPES)
    with pytest.raises(StepError, match="input 'export' provides no ONNX model"):
        step.run(context(tmp_path / "out", RECIPES, inputs={}))
    (tmp_path / "bad.onnx").write_bytes(b"garbage")
    with pytest.raises(StepError, match=r"cannot read the model of r:export"):
        simplify(tmp_path, tmp_path / "bad.onnx", out="o2")


@pytest.mark.parametrize(("params", "message"), [
    ({"input": "export", "backend": "onnxoptimizer"}, "'onnxsim' or 'onnxslim'"),
    ({"input": "export", "check": -1}, "greater than or equal to 0"),
    ({"input": "export", "tolerance": 0}, "greater than 0"),
    ({"input": "a:b:c"}, "expected 'step' or 'recipe:step'"),
    ({}, "Field required"),
    ({"input": "export", "checks": 3}, "Extra inputs are not permitted"),
])
def test_invalid_params_are_validation_errors(params, message):
    with pytest.raises(ValidationError, match=message):
        SimplifyParams.model_validate(params)


def test_a_recipes_backend_reaches_the_simplify_step():
    from optbuild.project.recipe import load_project

    project = load_project(RECIPES)
    steps = {spec.id: spec for spec in project.steps.values()}
    assert steps["transformer:simplify"].step.params.backend == "onnxslim"


def test_example_feeds_cover_the_examples():
    assert set(INPUT_NAME.values()) == {next(iter(example_feeds(n, 1))) for n in INPUT_NAME}


# --- renamed and fixed input dims (#9 item 5) ------------------------------------------------
def test_a_symbolic_dim_given_a_name_is_still_symbolic(tmp_path, capsys):
    """onnxslim names unnamed dims (x_d0): silero-vad was refused for it."""
    from onnx import helper

    source = graph_model(tmp_path / "unnamed.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                         [value("x", [None, 4])], [value("y", [None, 4])])
    ctx = simplify(tmp_path, source, backend="onnxslim")
    assert input_dims(ctx.out_dir / "model.onnx") == ["x_d0", 4]
    assert ctx.metrics["checks"] == 3
    assert "onnxslim renamed symbolic input dims (still symbolic): x dim 0 '?' -> 'x_d0'" in capsys.readouterr().err


def flatten_model(path: Path) -> Path:
    """y = Reshape(x, [batch, -1]) + 1, the target computed from Shape(x) as exporters trace it."""
    from onnx import TensorProto, helper

    return graph_model(path, [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Add", ["r", "bias"], ["y"])],
        [value("x", ["batch", 3, "h", "w"])], [value("y", ["batch", "features"])],
        [helper.make_tensor("zero", TensorProto.INT64, [1], [0]), helper.make_tensor("one", TensorProto.INT64, [1], [1]),
         helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
         helper.make_tensor("bias", TensorProto.FLOAT, [1], [1.0])])


@pytest.mark.parametrize("backend", ["onnxsim", "onnxslim"])
def test_input_shapes_fix_symbolic_dims_and_the_shape_arithmetic_folds(tmp_path, backend):
    source = flatten_model(tmp_path / "flatten.onnx")
    ctx = simplify(tmp_path, source, backend=backend, input_shapes={"x": [2, 3, 4, 5]},
                   inputs={"x": {"range": [0.0, 1.0]}})
    out = ctx.out_dir / "model.onnx"
    assert input_dims(out) == [2, 3, 4, 5]
    assert ctx.metrics["nodes_after"] < ctx.metrics["nodes_before"] == 5
    assert ctx.metrics["checks"] == 3  # fed [2, 3, 4, 5], the only shape the result takes
    (y,) = session(out, level="disable").run(None, {"x": np.ones((2, 3, 4, 5), np.float32)})
    assert y.shape == (2, 60) and (y == 2).all()


@pytest.mark.parametrize(("params", "message"), [
    ({"input_shapes": {"image": [2, 3, 4, 5]}}, "input_shapes: r:export has no input 'image' (its inputs: x)"),
    ({"input_shapes": {"x": [2, 3, 4]}},
     "input_shapes.x: [2, 3, 4] has rank 3, r:export declares ['batch', 3, 'h', 'w'] (rank 4)"),
    ({"input_shapes": {"x": [2, 4, 4, 5]}},
     "input_shapes.x: dim 1 is fixed at 3 in r:export, input_shapes gives 4; only symbolic dims can be given a size"),
    ({"dim_names": {"x": {1: "channels"}}},
     "dim_names.x: dim 1 is fixed at 3 in r:export, dim_names gives 'channels'; only symbolic dims can be named"),
    ({"dim_names": {"x": {4: "extra"}}}, "dim_names.x: r:export declares ['batch', 3, 'h', 'w'], so it has no axis 4"),
])
def test_input_shapes_and_dim_names_that_contradict_the_model_are_errors(tmp_path, params, message):
    with pytest.raises(StepError) as info:
        simplify(tmp_path, flatten_model(tmp_path / "flatten.onnx"), **params)
    assert str(info.value) == message


@pytest.mark.parametrize(("params", "message"), [
    ({"input_shapes": {"x": [1, 3]}, "dim_names": {"x": {0: "batch"}}},
     "input 'x' is in both input_shapes (which fixes all its dims) and dim_names"),
    ({"input_shapes": {"x": [0, 3]}}, "greater than or equal to 1"),
    ({"dim_names": {"x": {0: ""}}}, "at least 1 character"),
    ({"dim_names": {"x": {-1: "batch"}}}, "greater than or equal to 0"),
])
def test_invalid_shape_params_are_validation_errors(params, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        SimplifyParams.model_validate({"input": "export", **params})


@pytest.mark.parametrize("backend", ["onnxsim", "onnxslim"])
def test_dim_names_tell_apart_dims_that_share_one(tmp_path, backend, capsys):
    """PaddleOCR's classifier: batch -1, height and width both '?' (one name: one size)."""
    from onnx import helper

    source = graph_model(tmp_path / "paddle.onnx", [
        helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])],
        [value("x", [-1, 3, "?", "?"])], [value("y", [-1, 3])])
    ctx = simplify(tmp_path, source, backend=backend, dim_names={"x": {"0": "batch", "2": "height", "3": "width"}},
                   inputs={"x": {"shape": [[1, 2], 3, 4, [5, 7]]}})
    assert input_dims(ctx.out_dir / "model.onnx") == ["batch", 3, "height", "width"]
    assert "dim_names: x ['batch', 3, 'height', 'width']" in capsys.readouterr().err
    assert ctx.metrics["checks"] == 3


# --- check = 0 still refuses what cannot load (#9 item 3) --------------------------------------
@pytest.mark.parametrize("backend", ["onnxsim", "onnxslim"])
def test_check_zero_still_refuses_a_model_onnxruntime_cannot_load(tmp_path, backend):
    from onnx import helper

    source = graph_model(tmp_path / "custom.onnx", [
        helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Frobnicate", ["r"], ["y"], domain="com.example")],
        [value("x", ["batch", 3])], [value("y", ["batch", 3])], opsets=[("", 17), ("com.example", 1)])
    with pytest.raises(StepError, match=rf"^onnxruntime cannot load the model {backend} made of r:export: .*"
                                        r"com.example:Frobnicate\(-1\) is not a registered function/op"):
        simplify(tmp_path, source, backend=backend, check=0)


@pytest.mark.parametrize("backend", ["onnxsim", "onnxslim"])
def test_check_zero_still_refuses_a_model_that_fails_the_full_onnx_check(tmp_path, backend):
    """Float + int64: the plain onnx.checker passes it, its full check (type inference) does not."""
    from onnx import TensorProto, helper

    source = graph_model(tmp_path / "mixed.onnx", [
        helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "i"], ["y"])],
        [value("x", ["batch", 3]), value("i", ["batch", 3], TensorProto.INT64)], [value("y", ["batch", 3])])
    with pytest.raises(StepError, match=rf"^{backend} produced a model that fails onnx.checker's full check "
                                        r"\(r:export\): .*B has inconsistent type tensor\(int64\)"):
        simplify(tmp_path, source, backend=backend, check=0)


# --- an absolute floor under the relative tolerance (#9 F1) ----------------------------------
@pytest.mark.parametrize("backend", ["onnxsim", "onnxslim"])
def test_float_rounding_in_tiny_outputs_is_within_the_absolute_floor(tmp_path, backend):
    source = cancelling_model(tmp_path / "cancel.onnx")
    ctx = simplify(tmp_path, source, backend=backend)
    assert ctx.metrics["max_rel_error"] > 1e-3 and ctx.metrics["max_abs_error"] < 1e-7
    with pytest.raises(StepError, match=rf"{backend} changed the outputs of r:export \(check 0, seeded inputs "
                                        r"x \[1, 3, 8, 8\]\): output 'y': max relative error [0-9.e-]+ > "
                                        r"tolerance 0.0001 and max abs error [0-9.e-]+ > atol 0$"):
        simplify(tmp_path, source, out="no-floor", backend=backend, atol=0)


def test_the_absolute_floor_holds_per_output_and_follows_the_element_type():
    from optbuild.model.compare import compare_outputs

    big, tiny = np.full(4, 100.0, np.float32), np.full(4, 1e-6, np.float32)
    result = compare_outputs(["big", "tiny"], [big, tiny], [big + np.float32(1e-3), tiny + np.float32(5e-8)])
    assert result.max_abs > 1e-4 and result.max_rel > 1e-2  # neither overall figure passes alone...
    assert result.failure(1e-4) is None  # ...but each output passes one of them
    assert result.failure(1e-4, atol=0).startswith("output 'tiny': max relative error 0.05 > tolerance 0.0001")
    wrong = compare_outputs(["tiny"], [tiny], [tiny * 3])  # a real error: 2e-6 is past the floor
    assert wrong.failure(1e-4) == ("output 'tiny': max relative error 2 > tolerance 0.0001 and max abs "
                                   "error 2e-06 > atol 9.54e-07")
    half = compare_outputs(["h"], [tiny.astype(np.float16)], [(tiny + 1e-3).astype(np.float16)])
    assert half.failure(1e-4) is None  # 8 float16 epsilons: 0.0078
    ints = compare_outputs(["i"], [np.array([1000, 2])], [np.array([1000, 3])])
    assert ints.failure(1e-4) == "output 'i': max relative error 0.001 > tolerance 0.0001 and max abs error 1 > atol 0"
