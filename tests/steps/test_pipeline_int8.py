"""The INT8 pipelines of the example recipes, built for real through the CLI:
simplify -> calibrate -> quantize (static QDQ, dynamic) -> verify, and the onnxruntime engine."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from plugins.projects import REPO, ProjectDir

pytestmark = pytest.mark.slow
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

NEW_STEPS = {
    "cnn:calibrate", "cnn:quantize_int8", "cnn:verify[int8]", "cnn:engine_ort",
    "transformer:calibrate", "transformer:quantize_int8", "transformer:verify[int8]",
    "transformer:quantize_dynamic", "transformer:verify[dynamic]", "transformer:engine_ort",
}


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> ProjectDir:
    root = tmp_path_factory.mktemp("int8")
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    project = ProjectDir(root)
    first = project.cli("build", "--json", "-j", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert NEW_STEPS <= set(first.steps("built"))
    return project


def ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_quantized_models_load_run_and_pass_verify(examples):
    build = examples.root / "build"
    for recipe, verify in (("cnn", "verify[int8]"), ("transformer", "verify[int8]"), ("transformer", "verify[dynamic]")):
        report = json.loads((build / recipe / verify / "report.json").read_text())
        assert report["passed"] is True
        figures = report["outputs"]["logits"]
        assert figures["cosine"] >= 0.99 and figures["top1"] >= 0.9, (recipe, verify, figures)
        assert report["data"]["samples"] == 64
        assert "passed: 3 of 3 checks" in (build / recipe / verify / "report.txt").read_text()

    assert "QuantizeLinear" in ops(build / "cnn/quantize_int8/model.onnx")
    assert "QuantizeLinear" in ops(build / "transformer/quantize_int8/model.onnx")
    assert "MatMulInteger" in ops(build / "transformer/quantize_dynamic/model.onnx")
    image = {"image": np.random.default_rng(0).standard_normal((3, 3, 64, 64)).astype(np.float32)}
    tokens = {"tokens": np.random.default_rng(0).integers(0, 1000, (3, 32))}
    for path, feed, shape in (("cnn/quantize_int8/model.onnx", image, (3, 10)),
                              ("transformer/quantize_int8/model.onnx", tokens, (3, 4)),
                              ("transformer/quantize_dynamic/model.onnx", tokens, (3, 4))):
        sess = ort.InferenceSession(str(build / path), providers=["CPUExecutionProvider"])
        assert sess.run(None, feed)[0].shape == shape  # batch 3: the dynamic batch axis survived

    table = json.loads((build / "cnn/calibrate/calibration.json").read_text())
    assert table["format"] == "optbuild.calibration" and table["samples"] == 64
    assert (build / "cnn/engine_ort/model.ort").is_file()
    assert (build / "transformer/engine_ort/model.onnx").is_file()


def test_changing_only_quantize_params_reruns_quantize_not_calibrate(examples):
    recipe = examples.root / "recipes/transformer.toml"
    original = recipe.read_text()
    assert original.count("[steps.quantize_int8]\n") == 1  # the recipe's changes to the template's step
    chosen = examples.root / "build/transformer/best/model.onnx"
    before = chosen.read_bytes()
    try:  # edit quantize_int8 only
        recipe.write_text(original.replace("[steps.quantize_int8]\n", "[steps.quantize_int8]\nper_channel = true\n"))
        plan = examples.cli("plan", "--json")
        reasons = {e["step"]: e["reasons"] for e in plan.events if e.get("event") == "step"}
        assert "parameter per_channel: false -> true" in reasons["transformer:quantize_int8"]
        run = examples.cli("build", "--json")
        assert run.returncode == 0, run.stdout + run.stderr
        # ...and what takes the new model: its verify, its benchmark, the choice among them (measured
        # again, together) and the deployment of that choice when the chosen model is another
        # (deploy reads the model, not the choice's report: Step.outputs_read)
        served = ["transformer:serve"] if chosen.read_bytes() != before else []
        assert run.steps("built") == sorted(["transformer:bench[int8]", "transformer:best",
                                             "transformer:quantize_int8", "transformer:verify[int8]", *served])
        assert "transformer:calibrate" in run.steps("cached")
    finally:
        recipe.write_text(original)
    again = examples.cli("build", "--json")  # back to the first params: all from the cache
    assert again.returncode == 0 and again.steps("built") == []


STRICT = """\
[steps.verify]
kind = "verify"
reference = "cnn:simplify"
candidate = "cnn:quantize_int8"
data = "models/calib.py:images"
data_args = { count = 8, seed = 2 }
max_abs = 1e-7
min_cosine = 0.999999
"""


def test_impossible_tolerance_fails_with_the_report_and_keeps_earlier_artifacts(examples):
    strict = examples.root / "recipes/strict.toml"
    strict.write_text(STRICT)
    try:
        plain = examples.cli("build", "strict")
        assert plain.returncode != 0
        out = plain.stdout + plain.stderr
        assert "Traceback" not in out
        assert re.search(r"failed   strict:verify\n +verify: candidate model\.onnx \(blake3-256 [0-9a-f]{12}\) "
                         r"vs reference model\.onnx \(blake3-256 [0-9a-f]{12}\)", out), out
        assert "8 samples from models/calib.py:images (count=8, seed=2)" in out
        row = next(line for line in out.splitlines() if "max_abs" in line and "<= 1e-07" in line)
        assert row.split()[-1] == "FAIL"
        assert "FAILED: 2 of 2 checks: logits max_abs" in out

        run = examples.cli("build", "strict", "--json")
        assert run.returncode != 0
        assert run.steps("failed") == ["strict:verify"]
        assert {"cnn:simplify", "cnn:calibrate", "cnn:quantize_int8"} <= set(run.steps("cached"))
        error = next(e["error"] for e in run.events if e.get("step") == "strict:verify" and e["status"] == "failed")
        assert error.startswith("verify: candidate model.onnx") and "FAIL" in error
        assert "remembered: it failed this way" in error, "the same key fails the same way: not run again"
        assert (examples.root / "build/cnn/quantize_int8/model.onnx").is_file()
        assert not (examples.root / "build/strict/verify/report.json").exists()
    finally:
        strict.unlink()


def test_bad_calibration_data_is_a_clear_error_through_the_cli(examples):
    data = examples.root / "recipes/data"
    data.mkdir(exist_ok=True)
    np.savez(data / "float64.npz", image=np.zeros((4, 3, 64, 64)))  # float64: the classic slip
    bad = examples.root / "recipes/bad.toml"
    bad.write_text('[steps.calibrate]\nkind = "calibrate"\ninput = "cnn:simplify"\ndata = "data/float64.npz"\n')
    try:
        run = examples.cli("build", "bad")
        out = run.stdout + run.stderr
        assert run.returncode != 0 and "Traceback" not in out
        assert ("input 'image' expects float32 [batch, 3, 64, 64]; array 'image' of data/float64.npz has "
                "dtype float64 (convert it with .astype('float32'))") in out
    finally:
        bad.unlink()
        shutil.rmtree(data)
