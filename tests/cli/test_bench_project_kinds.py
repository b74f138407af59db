"""optbuild bench reads what a step kind says it is (Step.carries_model, checks_model,
builds_engine, precision()), never a kind's name: a project's own kinds, written against
optbuild.plugin alone, are benched as the built-in ones they resemble, on a real build and real
onnxruntime runs of a small model."""

from __future__ import annotations

import json

import pytest
from plugins.projects import ProjectDir

pytest.importorskip("onnxruntime")
from plugins.serving import tokens_model

KINDS = '''
import json
import shutil

from optbuild.plugin import Step, StepContext, StepParams, StepRef


class CopyParams(StepParams):
    input: StepRef


class Tuned(Step):
    """Its input, as a model that computes in INT8 (the kind says so)."""

    Params = CopyParams

    def precision(self) -> str:
        return "int8"

    def run(self, ctx: StepContext) -> None:
        shutil.copy(ctx.inputs["input"].primary, ctx.out_dir / "model.onnx")


class Optimized(Tuned):
    """An engine the runtime made of its input."""

    builds_engine = True

    def precision(self) -> None:
        return None


class Chosen(Tuned):
    """A copy of the model of the step it chose."""

    carries_model = True


class JudgeParams(StepParams):
    candidate: StepRef
    reference: StepRef


class Judge(Step):
    """Compares the candidate's outputs with the reference's."""

    Params = JudgeParams
    primary_output = "report.json"
    checks_model = "candidate"

    def run(self, ctx: StepContext) -> None:
        report = {"passed": True, "outputs": {"y": {"cosine": 0.875, "max_abs": 0.25}}}
        (ctx.out_dir / "report.json").write_text(json.dumps(report))
'''

CONFIG = """\
[project]
recipes = ["recipes/*.toml"]

[kinds]
tuned = "kinds.py:Tuned"
optimized = "kinds.py:Optimized"
chosen = "kinds.py:Chosen"
judge = "kinds.py:Judge"
"""

RECIPE = """\
[inputs.tokens]
shape = [1, 8]
range = [0, 7]

[steps.model]
kind = "onnx"
path = "../tokens.onnx"

[steps.tuned]
kind = "tuned"
input = "model"

[steps.optimized]
kind = "optimized"
input = "model"

[steps.chosen]
kind = "chosen"
input = "tuned"

[steps.judge]
kind = "judge"
candidate = "tuned"
reference = "model"
"""


@pytest.fixture(scope="module")
def benched_project(tmp_path_factory) -> ProjectDir:
    root = tmp_path_factory.mktemp("kinds") / "proj"
    root.mkdir()
    proj = ProjectDir(root)
    proj.write("optbuild.toml", CONFIG)
    proj.write("kinds.py", KINDS)
    proj.write("recipes/r.toml", RECIPE)
    tokens_model(root / "tokens.onnx")
    return proj


@pytest.fixture(scope="module")
def benched(benched_project) -> dict:
    run = benched_project.cli("bench", "r", "--runs", "2", "--warmup", "0", "--threads", "1", "--json")
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(run.stdout)["recipes"]
    return result


def test_a_kind_that_gives_a_model_is_benched_labelled_in_the_precision_it_says(benched):
    labels = {row["step"]: row["label"] for row in benched["rows"]}
    # an ONNX file computes in what it holds ("source"); an engine without a precision of its own
    # computes in its input's, told apart from it as "-optimized"
    assert labels == {"r:model": "ORT source", "r:tuned": "ORT INT8", "r:optimized": "ORT-optimized source"}


def test_a_kind_that_carries_a_model_is_not_benched_again_and_a_note_says_why(benched):
    assert "not benched (carries the model of the step it measured or chose): chosen" in benched["notes"]
    assert "not benched (no model output): judge" in benched["notes"]


def test_a_carrier_named_as_a_target_is_refused_saying_what_to_bench(benched_project):
    run = benched_project.cli("bench", "r:chosen", "--no-build")
    assert run.returncode == 2, run.stdout
    assert ("error: r:chosen is a chosen step: it carries the model of the step it measured or chose; "
            "bench that step, or the recipe") in run.stderr


def test_a_kind_that_checks_a_model_puts_its_figures_beside_that_model(benched):
    rows = {row["step"]: row for row in benched["rows"]}
    (figures,) = rows["r:tuned"]["verify"]
    assert (figures["step"], figures["reference"], figures["cosine"]) == ("r:judge", "r:model", 0.875)
    assert rows["r:model"]["verify"] == [] and rows["r:optimized"]["verify"] == []
    assert benched["baseline"] == {"step": "r:model", "runtime": "onnxruntime"}  # the judge's reference
