"""kind = "onnx": an existing ONNX file, checked and passed on unchanged."""

from __future__ import annotations

import pytest
from plugins.steps import context, tiny_onnx
from pydantic import ValidationError

from optbuild.common.errors import StepError
from optbuild.steps.source import OnnxSource, OnnxSourceParams


def source(tmp_path, name="m.onnx") -> tuple[OnnxSource, object]:
    step = OnnxSource(OnnxSourceParams.model_validate({"path": name}), tmp_path, tmp_path)
    return step, context(tmp_path / "out", tmp_path)


def test_a_valid_model_is_passed_on_byte_for_byte(tmp_path):
    tiny_onnx(tmp_path / "m.onnx")
    step, ctx = source(tmp_path)
    step.run(ctx)
    assert (ctx.out_dir / "model.onnx").read_bytes() == (tmp_path / "m.onnx").read_bytes()
    assert ctx.metrics["nodes"] == 1
    assert ctx.metrics["opset"] == 17
    assert ctx.metrics["inputs"] == ["x"] and ctx.metrics["outputs"] == ["y"]


def test_the_file_is_relative_to_the_recipe_and_enters_the_key(tmp_path):
    (tmp_path / "models").mkdir()
    tiny_onnx(tmp_path / "models" / "m.onnx")
    step = OnnxSource(OnnxSourceParams(path="models/m.onnx"), tmp_path, tmp_path)
    assert step.key_files() == [tmp_path / "models" / "m.onnx"]
    assert step.tool_names() == ("onnx",)
    ctx = context(tmp_path / "out", tmp_path)
    step.run(ctx)
    assert (ctx.out_dir / "model.onnx").is_file()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "text"])
def test_a_corrupt_file_fails_naming_the_file(tmp_path, damage):
    data = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    corrupt = {"truncated": data[: len(data) // 2], "garbage": data[:40] + b"\xff\xfe garbage" * 4,
               "text": b"this is not an onnx model\n"}[damage]
    (tmp_path / "m.onnx").write_bytes(corrupt)
    step, ctx = source(tmp_path)
    with pytest.raises(StepError, match=r"m\.onnx is not a readable ONNX model") as info:
        step.run(ctx)
    assert str(tmp_path / "m.onnx") in str(info.value)
    assert not (ctx.out_dir / "model.onnx").exists()


def test_an_empty_file_fails_onnx_checker_naming_the_file(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    step, ctx = source(tmp_path, "empty.onnx")
    with pytest.raises(StepError, match=r"empty\.onnx fails onnx\.checker: .*ir_version"):
        step.run(ctx)


def test_a_parseable_but_invalid_graph_fails_onnx_checker(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])], "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "bad.onnx"))
    step, ctx = source(tmp_path, "bad.onnx")
    with pytest.raises(StepError, match=r"bad\.onnx fails onnx\.checker: .*NoSuchOp"):
        step.run(ctx)


def test_a_missing_file_is_named(tmp_path):
    step, ctx = source(tmp_path, "gone.onnx")
    with pytest.raises(StepError, match=r"gone\.onnx: no such ONNX file"):
        step.run(ctx)


def test_external_data_is_rejected_clearly(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
              size_threshold=0)
    assert (tmp_path / "ext.onnx.data").is_file()
    step, ctx = source(tmp_path, "ext.onnx")
    with pytest.raises(StepError, match=r"ext\.onnx keeps tensors in external data files"):
        step.run(ctx)


def test_invalid_params_are_validation_errors():
    with pytest.raises(ValidationError):
        OnnxSourceParams.model_validate({})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        OnnxSourceParams.model_validate({"path": "m.onnx", "paht": "typo.onnx"})
