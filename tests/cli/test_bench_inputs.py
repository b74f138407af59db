"""optbuild bench measures at the shapes the recipe declares ([inputs.NAME]), as the build's
steps read them, on a small real project: a tokens model whose sequence length is open, an
onnx source step (no inputs parameter: the recipe's declarations) and an onnxruntime engine
(the declarations merged into its inputs parameter)."""

from __future__ import annotations

import json

import pytest
from plugins.projects import ProjectDir

pytest.importorskip("onnxruntime")
from plugins.serving import tokens_model

FAST = ("--runs", "2", "--warmup", "0", "--threads", "1", "--json")

RECIPE = """\
DECLARATION
[steps.model]
kind = "onnx"
path = "../tokens.onnx"

[steps.engine]
kind = "engine"
backend = "onnxruntime"
input = "model"
level = "basic"
"""


def _bench(root, declaration: str, *flags: str) -> dict:
    proj = ProjectDir(root)
    root.mkdir()
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n')
    proj.write("recipes/r.toml", RECIPE.replace("DECLARATION", declaration))
    tokens_model(root / "tokens.onnx", mask=True)
    run = proj.cli("bench", "r", *FAST, *flags)
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(run.stdout)["recipes"]
    return result


def _inputs(result: dict) -> dict[str, dict]:
    return {row["step"]: row["inputs"] for row in result["rows"]}


def test_bench_measures_the_declared_length_on_every_model(tmp_path):
    result = _bench(tmp_path / "proj", "[inputs.tokens]\nshape = [1, [8, 48, 512]]\nrange = [0, 7]\n"
                                       "[inputs.mask]\nshape = [1, [8, 48, 512]]\nvalues = [0, 1]\n")
    measured = {"tokens": {"shape": [1, 48], "dtype": "int64"},  # the range's opt, not bench's 16
                "mask": {"shape": [1, 48], "dtype": "int64"}}
    assert _inputs(result) == {"r:model": measured, "r:engine": measured}
    assert not any("not declared" in note for note in result["notes"]), result["notes"]


def test_undeclared_the_open_length_is_measured_at_16_and_a_note_says_to_declare_it(tmp_path):
    result = _bench(tmp_path / "proj", "")
    assert _inputs(result)["r:model"]["tokens"]["shape"] == [1, 16]
    assert ("tokens dim 1 ('seq') is not declared: measured at 16; declare the size it serves at with "
            "[inputs.tokens] shape = [...] in the recipe") in result["notes"]
    assert sum("not declared" in note for note in result["notes"]) == 2, "one note per dim, not per model"


def test_batch_takes_a_declared_batch_range_and_is_noted_where_the_declaration_fixes_another(tmp_path):
    ranged = _bench(tmp_path / "ranged", "[inputs.tokens]\nshape = [[1, 8], 32]\n"
                                         "[inputs.mask]\nshape = [[1, 8], 32]\n", "--batch", "4")
    assert _inputs(ranged)["r:engine"]["tokens"]["shape"] == [4, 32]
    assert _inputs(ranged)["r:engine"]["mask"]["shape"] == [4, 32]
    fixed = _bench(tmp_path / "fixed", "[inputs.tokens]\nshape = [2, 32]\n[inputs.mask]\nshape = [2, 32]\n",
                   "--batch", "4")
    assert _inputs(fixed)["r:engine"]["tokens"]["shape"] == [2, 32]
    assert "[inputs.tokens] declares batch 2: --batch 4 does not apply to it" in fixed["notes"]


def test_a_declaration_the_model_contradicts_is_an_error_naming_the_recipe(tmp_path):
    proj = ProjectDir(tmp_path / "proj")
    proj.root.mkdir()
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n')
    proj.write("recipes/r.toml", RECIPE.replace("DECLARATION", "[inputs.tokens]\nshape = [1, 32]\ndtype = \"int32\"\n")
               .split("[steps.engine]")[0])
    tokens_model(proj.root / "tokens.onnx")
    run = proj.cli("bench", "r:model", *FAST)
    assert run.returncode == 2, run.stdout
    assert "inputs.tokens: dtype int32 declared, r:model takes int64" in run.stderr
    assert str(proj.root / "recipes/r.toml") in run.stderr and "Traceback" not in run.stderr
