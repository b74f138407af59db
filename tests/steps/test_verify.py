"""kind = "verify": figures, thresholds, the readable report, ORT-format and float16 candidates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from plugins.models import make_mlp, make_two_inputs
from plugins.steps import run_step

from optbuild.steps.verify import Verify, VerifyParams


def verify(tmp_path: Path, reference: Path, candidate: Path, name: str = "verify", **params):
    inputs = {"reference": reference, "candidate": candidate}
    _, ctx = run_step(Verify, {"reference": "ref", "candidate": "cand", **params}, inputs, tmp_path, name)
    return ctx, json.loads((ctx.out_dir / "report.json").read_text())


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The MLP, a copy, and one with first-layer weights scaled by 1.05."""
    ref = make_mlp(tmp_path / "ref.onnx")
    same = make_mlp(tmp_path / "same.onnx")
    off = make_mlp(tmp_path / "off.onnx", scale=1.05)
    return ref, same, off


def test_identical_models_pass_with_exact_figures(tmp_path, models):
    ref, same, _ = models
    ctx, report = verify(tmp_path, ref, same, max_abs=0.0, min_cosine=1.0, min_top1=1.0, samples=5)
    figures = report["outputs"]["y"]
    assert figures["max_abs"] == 0.0 and figures["max_rel"] == 0.0
    assert figures["cosine"] == pytest.approx(1.0) and figures["top1"] == 1.0
    assert report["passed"] is True and report["data"] == {"source": "random (seed 0)", "samples": 5}
    assert [c["metric"] for c in report["checks"]] == ["max_abs", "cosine", "top1"]
    text = (ctx.out_dir / "report.txt").read_text()
    assert "passed: 3 of 3 checks" in text and text.startswith("verify: candidate same.onnx (blake3-256 ")
    assert ctx.metrics["cosine"] == pytest.approx(1.0) and ctx.metrics["passed"] is True


def test_exceeded_threshold_fails_with_the_readable_table(tmp_path, models):
    ref, _, off = models
    with pytest.raises(StepError) as info:
        verify(tmp_path, ref, off, max_abs=1e-4, min_cosine=0.9, samples=4)
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0].startswith("verify: candidate off.onnx") and "4 samples from random (seed 0)" in lines[1]
    row = next(line for line in lines if line.startswith("y") and "max_abs" in line)
    assert row.split()[-1] == "FAIL" and "<= 0.0001" in row
    assert next(line for line in lines if " cosine " in line).split()[-1] == "ok"
    assert lines[-1].startswith("FAILED: 1 of 2 checks: y max_abs")
    assert not (tmp_path / "out" / "verify" / "report.json").exists()  # a failed step keeps nothing



def test_with_fail_false_an_exceeded_threshold_is_recorded_and_the_step_succeeds(tmp_path, models):
    ref, _, off = models
    ctx, report = verify(tmp_path, ref, off, max_abs=1e-4, samples=4, fail=False)
    assert report["passed"] is False and ctx.metrics["passed"] is False
    assert "FAILED: 1 of 1 checks" in (ctx.out_dir / "report.txt").read_text()


def test_fail_enters_the_key_only_when_set():
    from optbuild.builder.keys import key_params

    assert "fail" not in key_params(VerifyParams(reference="a", candidate="b", max_abs=0.1))
    assert key_params(VerifyParams(reference="a", candidate="b", max_abs=0.1, fail=False))["fail"] is False

def test_figures_match_numpy(tmp_path, models):
    ref, _, off = models
    x = np.random.default_rng(9).standard_normal((12, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    _, report = verify(tmp_path, ref, off, data="data.npz", max_rel=1.0)
    import onnxruntime as ort

    a = ort.InferenceSession(str(ref), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].astype(np.float64)
    b = ort.InferenceSession(str(off), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].astype(np.float64)
    figures = report["outputs"]["y"]
    assert figures["max_abs"] == pytest.approx(np.abs(a - b).max(), rel=1e-5)
    assert figures["max_rel"] == pytest.approx(np.abs(a - b).max() / np.abs(a).max(), rel=1e-5)
    assert figures["cosine"] == pytest.approx(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-9)
    assert figures["top1"] == pytest.approx(np.mean(a.argmax(-1) == b.argmax(-1)))
    assert report["data"]["samples"] == 12


def test_ort_format_and_float16_candidates(tmp_path, models):
    ref = models[0]
    from optbuild.steps.engine_ort import OrtEngine
    from optbuild.steps.quantize import Quantize

    _, ctx = run_step(OrtEngine, {"backend": "onnxruntime", "input": "m", "level": "extended", "format": "ort"},
                      {"input": ref}, tmp_path, "engine")
    ort_model = ctx.out_dir / "model.ort"
    _, report = verify(tmp_path, ref, ort_model, name="v1", max_rel=1e-5)
    assert report["candidate"]["file"] == "model.ort" and report["passed"]

    pytest.importorskip("onnxconverter_common")
    _, ctx = run_step(Quantize, {"input": "m", "mode": "fp16", "keep_io_types": False}, {"input": ref}, tmp_path,
                      "fp16")
    _, report = verify(tmp_path, ref, ctx.out_dir / "model.onnx", name="v2", min_cosine=0.999, max_rel=0.01)
    assert report["outputs"]["y"]["dtype"] == "float16"  # inputs were cast to float16 for it


def test_random_data_for_integer_inputs(tmp_path):
    model = make_two_inputs(tmp_path / "two.onnx")
    _, report = verify(tmp_path, model, model, samples=3, seed=4, int_range=[0, 10], dynamic_size=3, max_abs=0.0)
    assert report["outputs"]["y"]["shape"] == [3, 3]  # dynamic batch of 3
    with pytest.raises(StepError, match="fails on the samples"):  # ids past the 10-row embedding
        verify(tmp_path, model, model, name="v2", int_range=[50, 60], max_abs=0.0)


def test_top1_needs_class_scores(tmp_path, models):
    ref, same, _ = models
    with pytest.raises(StepError, match="top1_outputs: no compared output 'logits'"):
        verify(tmp_path, ref, same, min_top1=0.9, top1_outputs=["logits"])
    with pytest.raises(StepError, match="outputs: the reference .* has no output 'logits'"):
        verify(tmp_path, ref, same, name="v2", outputs=["logits"], max_abs=0.0)


def test_mismatched_models_are_named(tmp_path, models):
    ref = models[0]
    two = make_two_inputs(tmp_path / "two.onnx")
    with pytest.raises(StepError, match=r"candidate .* lacks inputs \['x'\]"):
        verify(tmp_path, ref, two, max_abs=0.0)


@pytest.mark.parametrize("params, words", [
    ({}, "set at least one threshold"),
    ({"candidate": "ref", "max_abs": 1.0}, "same step"),
    ({"min_cosine": 1.5}, "less than or equal to 1"),
    ({"min_top1": -0.1}, "greater than or equal to 0"),
    ({"max_abs": 1.0, "top1_outputs": ["y"]}, "'top1_outputs' needs min_top1"),
    ({"max_abs": 1.0, "data": "d.npz", "seed": 3}, "'seed' only apply to random inputs"),
    ({"max_abs": 1.0, "int_range": [5, 5]}, "low < high"),
    ({"max_abs": 1.0, "data": "d.npz", "data_args": {"a": 1}}, "'data_args' only apply"),
    ({"max_abs": 1.0, "data": "d.npy"}, "single .npy file"),
])
def test_params_are_validated(params, words):
    with pytest.raises(ValidationError, match=words):
        VerifyParams.model_validate({"reference": "ref", "candidate": "cand", **params})


def test_key_holds_the_cpu_and_the_data(tmp_path):
    (tmp_path / "calib.py").write_text("def feeds():\n    return []\n")
    step = Verify(VerifyParams(reference="a", candidate="b", min_cosine=0.99, data="calib.py:feeds"),
                  tmp_path, tmp_path)
    host = Fingerprint({"cpu.arch": "x86_64", "cpu.flags": "avx2,fma"})
    assert step.host_key(host) == {"cpu.arch": "x86_64", "cpu.flags": "avx2,fma"}
    assert step.key_files() == [(tmp_path / "calib.py").resolve()]
    params = VerifyParams(reference="a", candidate="b", min_cosine=0.99, data="d.npz")
    assert VerifyParams.model_validate(params.model_dump(mode="json")) == params
