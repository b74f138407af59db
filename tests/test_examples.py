"""The example project builds for real: torch export, onnxsim, onnxruntime checks."""

from __future__ import annotations

import shutil

import pytest
from plugins.projects import REPO, ProjectDir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> ProjectDir:
    root = tmp_path_factory.mktemp("examples")
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    return ProjectDir(root)


def test_examples_build_then_noop(examples):
    first = examples.cli("build", "--json", "-j", "2")
    assert first.returncode == 0, first.stderr + first.stdout
    built = first.steps("built")
    assert {"cnn:export", "cnn:simplify", "transformer:export", "transformer:simplify"} <= set(built)
    # the larger encoder's static and dynamic INT8 models pass their verify steps
    assert {"encoder:verify_int8", "encoder:verify_dynamic", "encoder:engine_ort"} <= set(built)
    engines = {f"{model}:rtx_{precision}" for model in ("cnn", "transformer") for precision in ("fp32", "fp16", "int8")}
    assert engines <= set(built)
    for engine in engines:
        recipe, step = engine.split(":")
        assert (examples.root / "build" / recipe / step / "model.engine").stat().st_size > 100_000
    second = examples.cli("build", "--json")
    assert second.returncode == 0
    assert second.steps("built") == []


def test_editing_a_module_imported_by_the_export_callable_rebuilds_the_exports(examples):
    examples.cli("build")
    blocks = examples.root / "recipes/models/blocks.py"
    blocks.write_text(blocks.read_text() + "\n# an edit that changes no behaviour\n")
    plan = examples.cli("plan", "--json")
    reasons = {e["step"]: e["reasons"] for e in plan.events if e.get("event") == "step"}
    assert "input file recipes/models/blocks.py changed" in reasons["cnn:export"]
    run = examples.cli("build", "--json")
    assert {"cnn:export", "transformer:export"} <= set(run.steps("built"))
    # the exported bytes are the same, so the rest of each pipeline is reused
    assert "cnn:simplify" in run.steps("cached")


def test_a_changed_target_list_rebuilds_exactly_the_engines(examples):
    examples.cli("build")
    recipe = examples.root / "recipes/cnn.toml"
    recipe.write_text(recipe.read_text().replace('targets = ["sm86", "sm89"]', 'targets = ["sm89", "sm120"]'))
    plan = examples.cli("plan", "--json")
    reasons = {e["step"]: e["reasons"] for e in plan.events if e.get("event") == "step"}
    assert reasons["cnn:rtx_fp32"] == ['parameter targets: ["sm86", "sm89"] -> ["sm89", "sm120"]']
    run = examples.cli("build", "--json")
    assert run.returncode == 0, run.stderr
    assert run.steps("built") == ["cnn:rtx_fp16", "cnn:rtx_fp32", "cnn:rtx_int8"]
