"""kind = "verify": top-1 per token and per pixel, the collapse check relative to the reference's
scale, and warnings that reach the build's output (issue #33, items 2 and 5).

A GPT-2 whose INT8 variant changed 14.5% of next-token predictions passed: its [batch, seq,
vocab] logits got no top-1, and min_top1 was dropped with a note in report.txt only. A reference
varying in its 7th significant digit failed a candidate within 1.5e-6 as "constant". A reference
that ignores its input (a randomly initialised net) lets every variant pass: a warning says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.projects import ProjectDir
from plugins.steps import run_step

from optbuild.common.errors import StepError
from optbuild.steps.verify import Verify

VOCAB, SEQ = 10, 25


def verify(tmp_path: Path, reference: Path, candidate: Path, name: str = "verify", **params) -> tuple[dict, dict]:
    """(report.json, the step's metrics)."""
    inputs = {"reference": reference, "candidate": candidate}
    _, ctx = run_step(Verify, {"reference": "ref", "candidate": "cand", **params}, inputs, tmp_path, name)
    return json.loads((ctx.out_dir / "report.json").read_text()), ctx.metrics


def save(nodes: list, inits: dict[str, np.ndarray], inputs: list, outputs: list, path: Path) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs,
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# --- a causal language model's [batch, seq, vocab] logits -------------------------------------------
def language_model(path: Path, moved: tuple[int, ...] = ()) -> Path:
    """ids [N, SEQ] -> embedding (Gather) -> linear to the vocabulary (MatMul + Add): logits
    [N, SEQ, VOCAB] whose argmax at a token t is t, or t + 1 for the tokens in ``moved``."""
    rng = np.random.default_rng(0)
    weight = (3 * np.eye(VOCAB) + 0.1 * rng.standard_normal((VOCAB, VOCAB))).astype(np.float32)
    for token in moved:
        weight[token, (token + 1) % VOCAB] += 10
    inits = {"embedding": np.eye(VOCAB, dtype=np.float32), "head": weight,
             "bias": (0.01 * rng.standard_normal(VOCAB)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["hidden"]),
             helper.make_node("MatMul", ["hidden", "head"], ["scores"]),
             helper.make_node("Add", ["scores", "bias"], ["logits"])]
    return save(nodes, inits, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", SEQ])],
                [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", SEQ, VOCAB])], path)


def token_data(path: Path) -> Path:
    """8 samples of [1, SEQ] ids, 29 of the 200 tokens being 0: 14.5%."""
    rng = np.random.default_rng(1)
    ids = np.concatenate([np.zeros(29, np.int64), rng.integers(1, VOCAB, 200 - 29)])
    np.savez(path, ids=rng.permutation(ids).reshape(8, 1, SEQ))
    return path


def test_min_top1_catches_a_language_model_that_changes_next_token_predictions(tmp_path):
    reference, data = language_model(tmp_path / "lm.onnx"), token_data(tmp_path / "ids.npz")
    changed = language_model(tmp_path / "lm_changed.onnx", moved=(0,))
    with pytest.raises(StepError) as failed:
        verify(tmp_path, reference, changed, data=str(data), min_top1=0.95)
    assert "logits top1 85.5% (needs >= 95%)" in str(failed.value)

    report, _ = verify(tmp_path, reference, reference, name="same", data=str(data), min_top1=0.95)
    assert report["outputs"]["logits"]["top1"] == 1.0
    assert report["outputs"]["logits"]["top1_axis"] == 2
    assert report["passed"] and not report["warnings"]


# --- a segmentation head's [batch, classes, H, W] map ---------------------------------------------
def segmenter(path: Path, weight: np.ndarray, kernel: int = 1) -> Path:
    """x [N, 3, 8, 8] -> Conv (``kernel`` wide, same padding) -> scores [N, classes, 8, 8]."""
    pad = kernel // 2
    nodes = [helper.make_node("Conv", ["x", "w"], ["scores"], kernel_shape=[kernel, kernel], pads=[pad] * 4)]
    classes = weight.shape[0]
    return save(nodes, {"w": weight}, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes, 8, 8])], path)


def test_top1_per_pixel_of_a_segmentation_map(tmp_path):
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    other = weight + 0.5 * rng.standard_normal(weight.shape).astype(np.float32)
    x = rng.standard_normal((4, 1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    reference, candidate = segmenter(tmp_path / "seg.onnx", weight), segmenter(tmp_path / "seg2.onnx", other)

    report, _ = verify(tmp_path, reference, candidate, data=str(tmp_path / "x.npz"), min_top1=0.0)
    classes = [np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x[:, 0]).argmax(axis=1) for w in (weight, other)]
    figures = report["outputs"]["scores"]
    assert figures["top1_axis"] == 1
    assert figures["top1"] == pytest.approx(float(np.mean(classes[0] == classes[1])))
    assert 0 < figures["top1"] < 1

    wide = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)  # a 3x3 Conv: a feature map, no classes
    features = segmenter(tmp_path / "features.onnx", wide, kernel=3)
    report, metrics = verify(tmp_path, features, features, name="features", data=str(tmp_path / "x.npz"),
                             min_top1=0.9, max_abs=1e-5)
    assert report["outputs"]["scores"]["top1"] is None
    assert any("min_top1 not applied" in w for w in metrics["warnings"])  # for the build's output, not a note


# --- the reference's scale ------------------------------------------------------------------------
def offset(path: Path, slope: float) -> Path:
    """x [N, 4] -> 2 + slope * tanh(x @ w) [N, 4]: with slope 1.5e-6, 2 varying in its 7th digit;
    with slope 0, the constant 2."""
    w = (50 * np.random.default_rng(3).standard_normal((4, 4))).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Mul", ["t", "slope"], ["s"]), helper.make_node("Add", ["s", "two"], ["y"])]
    inits = {"w": w, "slope": np.array(slope, np.float32), "two": np.array(2, np.float32)}
    return save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], path)


def test_a_constant_candidate_within_rounding_of_the_reference_passes(tmp_path):
    reference, flat = offset(tmp_path / "ref.onnx", 1.5e-6), offset(tmp_path / "flat.onnx", 0.0)
    report, metrics = verify(tmp_path, reference, flat, max_rel=1e-5)
    figures = report["outputs"]["y"]
    assert figures["max_rel"] <= 1e-5 and figures["collapsed"] is None
    assert report["passed"]
    # and the reference itself is flagged: it hardly changes with its input
    assert any("the reference's output 'y' barely depends on its input" in w for w in metrics["warnings"])


def test_a_reference_that_ignores_its_input_warns(tmp_path):
    """One class for every sample: a candidate is compared with a constant and passes."""
    w = np.zeros((4, 6), np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["logits"])]
    inits = {"w": w, "b": np.arange(6, dtype=np.float32)}
    model = save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                 [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 6])], tmp_path / "ignores.onnx")
    report, metrics = verify(tmp_path, model, model, min_top1=0.9)
    assert report["passed"]
    assert report["outputs"]["logits"]["one_class"] == 5
    assert [w for w in metrics["warnings"] if "gives class 5 at every position of all 8 samples" in w]
    report, metrics = verify(tmp_path, language_model(tmp_path / "lm.onnx"), language_model(tmp_path / "lm.onnx"),
                             name="varies", min_top1=0.9, int_range=[0, VOCAB])
    assert "warnings" not in metrics and not report["warnings"]


# --- warnings in the build's output -----------------------------------------------------------------
RECIPE = """
[steps.ref]
kind = "onnx"
path = "../ignores.onnx"

[steps.cand]
kind = "onnx"
path = "../ignores.onnx"

[steps.verify]
kind = "verify"
reference = "ref"
candidate = "cand"
max_abs = 0.01
min_top1 = 0.9
"""


def test_verify_warnings_reach_the_build_output_and_json_built_or_cached(tmp_path):
    proj = ProjectDir(tmp_path / "proj")
    proj.root.mkdir()
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n')
    proj.write("recipes/r.toml", RECIPE)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["logits"])]
    save(nodes, {"w": np.zeros((4, 6), np.float32), "b": np.arange(6, dtype=np.float32)},
         [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
         [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 6])], proj.root / "ignores.onnx")
    built = proj.cli("build", "--json")
    assert built.returncode == 0, built.stderr
    [event] = [e for e in built.events if e.get("event") == "warning"]
    assert event["step"] == "r:verify" and "the reference's output 'logits' barely depends on its input" in event["message"]
    cached = proj.cli("build")
    assert cached.returncode == 0, cached.stderr
    assert "warning: r:verify: the reference's output 'logits' barely depends on its input" in cached.stdout + cached.stderr
