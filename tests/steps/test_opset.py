"""kind = "opset": onnx's version converter, checked like any other rewrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from plugins.projects import ProjectDir
from plugins.steps import artifact, context

from optbuild.common.errors import StepError
from optbuild.steps.opset import Opset, OpsetParams


def old_model(path: Path, opset: int = 10) -> Path:
    """Clip (bounds as attributes, the pre-11 form), Softmax and a MatMul (for quantization to
    act on) on a dynamic batch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((5, 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Clip", ["x"], ["c"], min=-1.0, max=1.0),
         helper.make_node("Softmax", ["c"], ["s"], axis=1),
         helper.make_node("MatMul", ["s", "w"], ["y"])], "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.save(model, str(path))
    return path


def convert(tmp_path: Path, model: Path, **params):
    step = Opset(OpsetParams.model_validate({"input": "source", **params}), tmp_path, tmp_path)
    ctx = context(tmp_path / "out", tmp_path, inputs={"input": artifact(model, "r:source")}, step_id="r:opset")
    step.run(ctx)
    return ctx


def test_an_old_model_is_converted_and_computes_the_same(tmp_path):
    import onnx
    import onnxruntime as ort

    source = old_model(tmp_path / "old.onnx")
    ctx = convert(tmp_path, source, version=13)
    out = ctx.out_dir / "model.onnx"
    model = onnx.load(str(out))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]
    clip = next(n for n in model.graph.node if n.op_type == "Clip")
    assert len(clip.input) == 3 and not clip.attribute, "opset 11+ takes Clip's bounds as inputs"
    assert ctx.metrics["opset_before"] == 10 and ctx.metrics["opset_after"] == 13
    assert ctx.metrics["checks"] == 3 and ctx.metrics["max_rel_error"] <= 1e-4
    x = np.linspace(-3, 3, 20, dtype=np.float32).reshape(4, 5)
    (expected,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_model_already_at_the_version_passes_unchanged(tmp_path):
    source = old_model(tmp_path / "old.onnx", opset=13)
    ctx = convert(tmp_path, source, version=13)
    assert (ctx.out_dir / "model.onnx").read_bytes() == source.read_bytes()


def test_a_version_newer_than_onnx_knows_is_refused_with_the_newest(tmp_path):
    import onnx

    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(StepError, match=f"converts up to opset {newest}"):
        convert(tmp_path, old_model(tmp_path / "old.onnx"), version=newest + 1)


def test_an_operator_without_an_adapter_fails_with_advice(tmp_path):
    """LayerNormalization exists from opset 17 only: it cannot go down to 13."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=-1)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0] * 4)])
    path = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(StepError, match=r"cannot take r:source from opset 17 to 13: .*try a nearer version"):
        convert(tmp_path, path, version=13)


def test_check_zero_still_refuses_a_model_onnxruntime_cannot_load(tmp_path):
    """A custom-domain op passes onnx.checker's full check and the converter keeps it; with
    check = 0 nothing ran the result, and it was cached though nothing can open it."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Frobnicate", ["r"], ["y"], domain="com.example")],
        "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])])
    path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11),
                                                      helper.make_opsetid("com.example", 1)]), str(path))
    with pytest.raises(StepError, match=r"^onnxruntime cannot load the model the opset 11 -> 13 conversion made "
                                        r"of r:source: .*com.example:Frobnicate\(-1\) is not a registered"):
        convert(tmp_path, path, version=13, check=0)


def test_check_zero_passes_a_loadable_conversion(tmp_path):
    ctx = convert(tmp_path, old_model(tmp_path / "old.onnx"), version=13, check=0)
    assert ctx.metrics["checks"] == 0 and "max_rel_error" not in ctx.metrics


def test_versions_older_than_onnxruntime_runs_are_refused_at_load():
    with pytest.raises(ValueError, match="greater than or equal to 7"):
        OpsetParams.model_validate({"input": "source", "version": 6})


def test_a_recipe_converts_then_quantizes_per_channel(project: ProjectDir):
    """Per-channel INT8 needs opset 13: an opset-10 model gets there through an opset step."""
    old_model(project.root / "recipes" / "old.onnx")
    project.write("recipes/m.toml", """
[steps.source]
kind = "onnx"
path = "old.onnx"

[steps.opset13]
kind = "opset"
input = "source"
version = 13

[steps.int8]
kind = "quantize"
input = "opset13"
mode = "dynamic"
per_channel = true
""")
    run = project.cli("build", "m", "--json")
    assert run.returncode == 0, run.stderr
    assert sorted(run.steps("built")) == ["m:int8", "m:opset13", "m:source"]
    again = project.cli("build", "m", "--json")
    assert sorted(again.steps("cached")) == ["m:int8", "m:opset13", "m:source"]
