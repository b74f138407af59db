"""The example project builds for real: torch export, onnxsim, onnxruntime checks."""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO, ProjectDir  # noqa: E402

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
