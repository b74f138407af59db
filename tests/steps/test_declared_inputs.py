"""A recipe declares what its model's inputs take, once; every self-check feeds that, and a
check that fails on its own guesses blames the model that cannot run them, not the step."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugins.projects import ProjectDir


def rate_model(path: Path) -> Path:
    """y = x + table[sr / 8000 - 3]: runs for sr = 8000 or 16000 only, like a voice model
    whose sample rate picks its filters (any other rate indexes out of the table)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Div", ["sr", "k8000"], ["q"]),
         helper.make_node("Sub", ["q", "three"], ["idx"]),
         helper.make_node("Gather", ["table", "idx"], ["row"], axis=0),
         helper.make_node("Add", ["x", "row"], ["y"])], "rate",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("k8000", TensorProto.INT64, [], [8000]),
         helper.make_tensor("three", TensorProto.INT64, [], [3]),
         helper.make_tensor("table", TensorProto.FLOAT, [2, 4], [0.5] * 4 + [-0.5] * 4)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


RECIPE = """
{inputs}
[steps.source]
kind = "onnx"
path = "rate.onnx"

[steps.simplify]
kind = "simplify"
input = "source"

[steps.ort]
kind = "engine"
backend = "onnxruntime"
input = "source"

[steps.int8]
kind = "quantize"
input = "source"
mode = "dynamic"
"""


@pytest.fixture
def rate_project(project: ProjectDir) -> ProjectDir:
    rate_model(project.root / "recipes" / "rate.onnx")
    return project


def test_without_a_declaration_the_checks_say_what_they_fed_and_blame_the_input_model(rate_project):
    rate_project.write("recipes/v.toml", RECIPE.format(inputs=""))
    run = rate_project.cli("build", "v", "-k", "--json")
    assert run.returncode == 1
    assert sorted(run.steps("failed")) == ["v:int8", "v:ort", "v:simplify"]
    errors = {e["step"]: e["error"] for e in run.events if e.get("status") == "failed"}
    simplify = errors["v:simplify"]
    assert "the input model of v:source does not run on the inputs the check made" in simplify
    assert "fed x float32 [1, 4] / [2, 4] / [3, 4] N(0, 1) (the model's own); sr int64 [] integers 0..7" in simplify
    assert "[inputs.x] shape = [...], range = [...] or values = [...]" in simplify
    for step in ("v:ort", "v:int8"):  # their products are not blamed for the input model's failure
        assert "the input model of v:source does not run on the inputs the check made" in errors[step]
        assert "it is not at fault" in errors[step]


def test_a_recipe_declaration_reaches_every_check(rate_project):
    rate_project.write("recipes/v.toml", RECIPE.format(inputs="[inputs.sr]\nvalues = [8000, 16000]\n"))
    run = rate_project.cli("build", "v", "--json")
    assert run.returncode == 0, run.stderr
    assert sorted(run.steps("built")) == ["v:int8", "v:ort", "v:simplify", "v:source"]


def test_a_step_entry_overrides_the_recipe_entry_and_changes_only_its_key(rate_project):
    rate_project.write("recipes/v.toml", RECIPE.format(inputs="[inputs.sr]\nvalues = [8000, 16000]\n"))
    assert rate_project.cli("build", "v").returncode == 0
    text = rate_project.read("recipes/v.toml").replace(
        'backend = "onnxruntime"\n', 'backend = "onnxruntime"\ninputs = { sr = { values = [16000] } }\n')
    rate_project.write("recipes/v.toml", text)
    run = rate_project.cli("build", "v", "--json")
    assert run.returncode == 0, run.stderr
    assert run.steps("built") == ["v:ort"]


def test_a_declaration_the_model_contradicts_is_named(rate_project):
    rate_project.write("recipes/v.toml", RECIPE.format(inputs="[inputs.SR]\nvalues = [8000]\n"))
    run = rate_project.cli("build", "v:simplify", "--json")
    assert run.returncode == 1
    (error,) = [e["error"] for e in run.events if e.get("status") == "failed"]
    assert "inputs.SR: v:source has no input 'SR'; did you mean 'sr'? (its inputs: x, sr)" in error


def test_a_malformed_declaration_is_refused_at_load_with_its_line(rate_project):
    rate_project.write("recipes/v.toml", RECIPE.format(inputs="[inputs.x]\nshape = [[4, 2], 4]\n"))
    run = rate_project.cli("plan", "v")
    assert run.returncode == 2
    assert "recipes/v.toml:3: inputs.x.shape: dim 0: sizes must be >= 0 and in order" in run.stderr


def test_a_tensorrt_engine_without_profiles_takes_one_from_the_declared_shapes():
    from optbuild.model.inputdecl import InputDecl
    from optbuild.steps.engine_trt_params import ShapeRange
    from optbuild.steps.engine_trt_profiles import declared_profiles

    decls = {"x": InputDecl(shape=[[1, 4, 8], 4])}
    assert declared_profiles([("x", (-1, 4)), ("sr", ())], decls) == [
        {"x": ShapeRange(min=[1, 4], opt=[4, 4], max=[8, 4])}]
    assert declared_profiles([("x", (-1, 4))], None) == []
