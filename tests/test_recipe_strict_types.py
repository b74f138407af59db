"""Recipes take numbers and booleans as written (#34 item 4).

A string is not a number (``runs = "50"``), an integral float is not an integer (``runs = 50.0``)
and nothing but true or false is a boolean (``dynamic_batching = "yes"``, ``1``): each is an
error with its file, line and field and the fix, in a step's table, a nested table and
optbuild.toml alike. What TOML can only write otherwise still loads: an integer for a float,
a string for a path, an array for a tuple, a string key for an integer key, and ``-S`` values.
A failed check prints its threshold as written, and messages agree in number.
"""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from optbuild.model import verifyreport
from optbuild.model.inputdecl import InputDecl
from optbuild.project.problems import validation_problems
from optbuild.project.recipe import load_project
from optbuild.project.tomlsource import load_toml
from optbuild.steps.benchmark import BenchmarkParams
from optbuild.steps.deploy import DeployParams
from optbuild.steps.quantize import QuantizeParams


@pytest.mark.parametrize("written, expected", [
    ('sleep = "0.5"', "expected a number, got the string '0.5': write the number without quotes"),
    ("fail = \"yes\"", "expected true or false, got the string 'yes'"),
    ('fail = "true"', "expected true or false, got the string 'true': write true without quotes"),
    ("fail = 1", "expected true or false, got 1"),
    ("sleep = true", "expected a number, got true"),
])
def test_a_step_parameter_of_the_wrong_type_is_an_error_at_its_line(project, written, expected):
    recipe = "recipes/chain.toml"
    project.write(recipe, project.read(recipe).replace('suffix = "-mid"', f'suffix = "-mid"\n{written}'))
    field = written.split(" ")[0]
    assert project.problems() == [f"{project.root / recipe}:10: steps.mid.{field}: {expected}"]


@pytest.mark.parametrize("written, expected", [
    ("jobs = 2.0", "expected an integer, got 2.0: write 2"),
    ('jobs = "2"', "expected an integer, got the string '2': write the number without quotes"),
])
def test_optbuild_toml_takes_numbers_as_written_too(project, written, expected):
    project.write("optbuild.toml", project.read("optbuild.toml").replace("jobs = 2", written))
    assert project.problems() == [f"{project.root / 'optbuild.toml'}:10: build.jobs: {expected}"]


@pytest.mark.parametrize("params, data, loc", [
    (BenchmarkParams, {"input": "m", "runs": "50"}, ("runs",)),
    (BenchmarkParams, {"input": "m", "runs": 50.0}, ("runs",)),
    (DeployParams, {"input": "m", "dynamic_batching": "yes"}, ("dynamic_batching",)),
    (InputDecl, {"shape": [1, "3"]}, ("shape",)),
    (InputDecl, {"range": ["0", 1]}, ("range", 0)),
])
def test_the_built_in_kinds_refuse_converted_values(params, data, loc):
    with pytest.raises(ValidationError) as info:
        params.model_validate(data)
    assert any(error["loc"][:len(loc)] == loc for error in info.value.errors())


def test_a_union_field_says_what_each_form_expects_once(tmp_path):
    doc_path = tmp_path / "r.toml"
    doc_path.write_text('[steps.q]\nkind = "quantize"\ninput = "m"\nmode = "fp16"\nkeep_io_types = "yes"\n')
    doc = load_toml(doc_path)
    with pytest.raises(ValidationError) as info:
        QuantizeParams.model_validate({k: v for k, v in doc.data["steps"]["q"].items() if k != "kind"})
    problems = validation_problems(doc, ("steps", "q"), info.value, QuantizeParams)
    expected = f"{doc_path}:5: steps.q.keep_io_types: expected true or false or a list, got the string 'yes'"
    assert [str(p) for p in problems] == [expected]


def test_what_toml_can_only_write_otherwise_still_loads(project):
    recipe = "recipes/chain.toml"
    project.write(recipe, project.read(recipe).replace('suffix = "-mid"', 'suffix = "-mid"\nsleep = 0'))
    mid = load_project(project.root, overrides=["chain:mid.fail=false"]).steps["chain:mid"].step.params
    assert (mid.sleep, type(mid.sleep), mid.fail) == (0.0, float, False)
    assert InputDecl.model_validate({"range": [0, 1], "values": None}).range == (0.0, 1.0)
    assert BenchmarkParams.model_validate({"input": "m", "runs": 7}).runs == 7


def test_a_failed_check_prints_its_threshold_as_written():
    report = {
        "reference": {"file": "ref.onnx", "digest": "blake3-256:" + "a" * 64},
        "candidate": {"file": "c.onnx", "digest": "blake3-256:" + "b" * 64},
        "data": {"source": "random (seed 0)", "samples": 4},
        "outputs": {"y": {"max_abs": 0.1, "max_rel": 0.1, "cosine": 0.99999, "cosine_min": 0.9, "top1": 0.9}},
        "checks": [{"output": "y", "metric": "cosine", "value": 0.99999, "op": ">=", "threshold": 0.9999999,
                    "ok": False},
                   {"output": "y", "metric": "top1", "value": 0.9, "op": ">=", "threshold": 0.999, "ok": False}],
        "latency_ms": {"reference": 1.0, "candidate": 0.5},
        "runtime": {"reference": "onnxruntime (CPU)", "candidate": "onnxruntime (CPU)"},
    }
    failed = verifyreport.table(report).splitlines()[-1]
    assert "(needs >= 0.9999999)" in failed and "(needs >= 99.9%)" in failed


@pytest.mark.parametrize("data, expected", [
    ({"input": "m", "mode": "dynamic", "calibration": "c"}, "^'calibration' does not apply to mode 'dynamic'"),
    ({"input": "m", "mode": "fp16", "calibration": "c", "per_channel": True},
     "^'calibration', 'per_channel' do not apply to mode 'fp16'"),
])
def test_messages_agree_in_number(data, expected):
    with pytest.raises(ValidationError) as info:
        QuantizeParams.model_validate(data)
    assert re.match(expected, str(info.value.errors()[0]["ctx"]["error"]))
