"""Issue 33, item 9: a recipe's [inputs.NAME] declarations enter each step's key only through
the parts that step reads with its parameters, so a shape only the benchmark reads rebuilds
the benchmark, and nothing upstream of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from plugins.projects import ProjectDir


def batch_model(path: Path) -> Path:
    """y = relu(x @ w): x is [batch, 4], the batch symbolic, as an exported model's is."""
    import onnx
    from onnx import TensorProto, helper

    weights = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])], "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 2], weights.ravel().tolist())])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


CHECKS_OFF = """
[inputs.x]
shape = [{batch}, 4]

[steps.source]
kind = "onnx"
path = "net.onnx"

[steps.simplify]
kind = "simplify"
input = "source"
check = 0

[steps.int8]
kind = "quantize"
input = "simplify"
mode = "dynamic"
check = false

[steps.verify]
kind = "verify"
reference = "simplify"
candidate = "int8"
data = "samples.npz"
max_abs = 10.0

[steps.bench]
kind = "benchmark"
input = "int8"
runs = 3
warmup = 1
"""


def test_a_shape_only_the_benchmark_reads_rebuilds_the_benchmark_alone(project: ProjectDir):
    batch_model(project.root / "recipes" / "net.onnx")
    np.savez(project.root / "recipes" / "samples.npz", x=np.ones((2, 4), np.float32))
    project.write("recipes/m.toml", CHECKS_OFF.format(batch=1))
    assert project.build(["m"]).ok
    project.write("recipes/m.toml", CHECKS_OFF.format(batch=8))
    result = project.build(["m"])
    assert result.ok
    status = {sid: outcome.status for sid, outcome in result.outcomes.items() if sid.startswith("m:")}
    assert status == {"m:source": "cached", "m:simplify": "cached", "m:int8": "cached",
                      "m:verify": "cached", "m:bench": "built"}


EXPORT = """
[inputs.x]
{declaration}

[steps.export]
kind = "export"
model = "net.py:build"
input_names = ["x"]
output_names = ["y"]
dynamic_axes = {{x = {{0 = "batch"}}, y = {{0 = "batch"}}}}

[steps.simplify]
kind = "simplify"
input = "export"
"""

NET = """
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2), (torch.randn(2, 4),)
"""


def test_export_is_keyed_on_the_shapes_of_its_dynamic_inputs_and_a_check_on_what_it_feeds(project: ProjectDir):
    project.write("recipes/net.py", NET)
    project.write("recipes/m.toml", EXPORT.format(declaration="range = [0.0, 1.0]"))
    assert project.build(["m"]).ok

    project.write("recipes/m.toml", EXPORT.format(declaration="range = [-1.0, 1.0]"))
    result = project.build(["m"])
    assert result.ok
    assert result.outcomes["m:export"].status == "cached"  # values never reach the export
    assert result.outcomes["m:simplify"].status == "built"  # its numeric check draws from the range

    project.write("recipes/m.toml", EXPORT.format(declaration="range = [-1.0, 1.0]\nshape = [[1, 8], 4]"))
    result = project.build(["m"])
    assert result.ok
    assert result.outcomes["m:export"].status == "built"  # its re-check grows the batch to 8


def test_a_step_keeps_what_it_reads_and_the_project_keeps_the_whole_declaration(project: ProjectDir):
    """What `optbuild bench` feeds a step's model is the whole declaration, though the step itself
    (a quantize that runs no check) reads none of it."""
    from optbuild.project.recipe import load_project

    batch_model(project.root / "recipes" / "net.onnx")
    np.savez(project.root / "recipes" / "samples.npz", x=np.ones((2, 4), np.float32))
    recipe = CHECKS_OFF.format(batch=8).replace("[inputs.x]\n", "[inputs.x]\nrange = [0.0, 1.0]\n")
    project.write("recipes/m.toml", recipe + '\n[steps.best]\nkind = "select"\ncandidates = ["bench"]\n')
    steps = load_project(project.root).steps
    assert steps["m:best"].step.params.inputs["x"].shape is None  # it times the shapes the benchmark recorded
    assert steps["m:best"].step.params.inputs["x"].range == (0.0, 1.0)
    assert steps["m:int8"].step.params.inputs is None
    assert steps["m:verify"].step.params.inputs is None  # it reads its data
    assert steps["m:bench"].step.params.inputs["x"].shape == [8, 4]
    assert steps["m:int8"].declared["x"].shape == [8, 4] and steps["m:int8"].declared["x"].range == (0.0, 1.0)
