"""kind = "verify": top-1 only where the last axis holds class scores; reports that name no step.

Issue #9's survey printed top-1 for DBNet's pixel map [N, 1, H, W] and silero-vad's recurrent
state [2, N, 128]; issue #24's, for BERT's pooler embedding [N, 256]. The rule (verify.py's
docstring): outputs named in top1_outputs, else float outputs with a last axis of 2 or more that
a Softmax / LogSoftmax over that axis computes, or that are [batch, classes] or [batch, seq,
vocab] computed by a linear layer; axis 1 of a [batch, classes, H, W] map that a Softmax over
axis 1 or a 1x1 Conv computes (tests/steps/test_verify_classes.py). The corpus tests run the real models (slow: fetched once, cached).

Two verify steps over byte-identical models share one key (the key holds content, not step
names), so a report restored for one must not name the other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from plugins.projects import ProjectDir

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import make_mlp
from plugins.steps import run_step
from plugins.thirdparty_models import corpus_model

from optbuild.common.errors import StepError
from optbuild.model.classaxes import class_axis, class_scores, linear_heads, softmax_axes
from optbuild.steps.verify import Verify


def verify(tmp_path: Path, reference: Path, candidate: Path, name: str = "verify", **params) -> dict:
    inputs = {"reference": reference, "candidate": candidate}
    _, ctx = run_step(Verify, {"reference": "ref", "candidate": "cand", **params}, inputs, tmp_path, name)
    return {"json": json.loads((ctx.out_dir / "report.json").read_text()),
            "text": (ctx.out_dir / "report.txt").read_text()}


def save(model, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def three_heads(path: Path, opset: int = 17) -> Path:
    """x [N, 8] -> a pixel map [N, 1, 4, 4] (Sigmoid), a recurrent state [2, N, 16] (Tanh),
    class probabilities [N, 3, 5] (Softmax on the last axis, then an Identity) and logits [N, 6]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w_map", (8, 16)), ("w_state", (8, 32)), ("w_cls", (8, 15)), ("w_log", (8, 6)))]
    shapes = {name: numpy_helper.from_array(np.array(shape, np.int64), name)
              for name, shape in (("s_map", (-1, 1, 4, 4)), ("s_state", (-1, 2, 16)), ("s_cls", (-1, 3, 5)))}
    nodes = [
        helper.make_node("MatMul", ["x", "w_map"], ["m0"]),
        helper.make_node("Reshape", ["m0", "s_map"], ["m1"]),
        helper.make_node("Sigmoid", ["m1"], ["pixel_map"], name="map"),
        helper.make_node("MatMul", ["x", "w_state"], ["s0"]),
        helper.make_node("Reshape", ["s0", "s_state"], ["s1"]),
        helper.make_node("Transpose", ["s1"], ["s2"], perm=[1, 0, 2]),
        helper.make_node("Tanh", ["s2"], ["state"], name="state_out"),
        helper.make_node("MatMul", ["x", "w_cls"], ["c0"]),
        helper.make_node("Reshape", ["c0", "s_cls"], ["c1"]),
        helper.make_node("Softmax", ["c1"], ["c2"], axis=-1 if opset >= 13 else 2),
        helper.make_node("Identity", ["c2"], ["probs"]),
        helper.make_node("MatMul", ["x", "w_log"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "three_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("pixel_map", TensorProto.FLOAT, ["N", 1, 4, 4]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "N", 16]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3, 5]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 6])],
        inits + list(shapes.values()))
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


# --- the rule -------------------------------------------------------------------------------------
def test_class_scores_rule():
    floats = np.zeros
    assert class_scores(floats((4, 10), np.float32), None, linear=True)  # [batch, classes] from a Gemm: logits
    assert not class_scores(floats((4, 256), np.float32), None, linear=False)  # BERT's pooler: Tanh, an embedding
    assert class_scores(floats((4, 10), np.float16), -1, linear=False)
    assert class_scores(floats((1, 40, 6625), np.float32), -1, linear=False)  # PP-OCR rec: softmax over the charset
    assert class_scores(floats((1, 40, 6625), np.float32), 2, linear=False)
    assert class_scores(floats((1, 40, 6625), np.float32), None, linear=True)  # a language model's [batch, seq, vocab]
    assert not class_scores(floats((1, 1, 64, 64), np.float32), None, linear=False)  # DBNet's pixel map
    assert not class_scores(floats((2, 1, 128), np.float32), None, linear=False)  # silero-vad's state
    assert not class_scores(floats((1, 19, 64, 64), np.float32), 1, linear=False)  # softmax over channels: axis 1
    assert class_axis(floats((1, 19, 64, 64), np.float32), 1, None) == 1  # a segmentation map, per pixel
    assert class_axis(floats((1, 19, 64, 64), np.float32), None, 1) == 1  # a 1x1 Conv's classes
    assert class_axis(floats((1, 1, 64, 64), np.float32), None, 1) is None  # one channel: a pixel map
    assert class_axis(floats((1, 19, 64, 64), np.float32), None, -1) is None  # rank 4 from a MatMul: not guessed
    assert not class_scores(floats((4, 1), np.float32), -1, linear=False)  # one entry: nothing to pick
    assert not class_scores(np.zeros((4, 10), np.int64), None, linear=True)  # ids, not scores
    assert not class_scores(floats((10,), np.float32), None, linear=True)


def test_softmax_axes_read_through_identity_and_by_opset(tmp_path):
    assert softmax_axes(three_heads(tmp_path / "m17.onnx")) == {"probs": -1}
    assert softmax_axes(three_heads(tmp_path / "m11.onnx", opset=11)) == {"probs": 2}
    # opset < 13: Softmax's default axis is 1, the last axis of a rank-2 input
    graph = helper.make_graph([helper.make_node("LogSoftmax", ["x"], ["y"]), helper.make_node("Cast", ["y"], ["z"], to=1)],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 5])])
    old = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), tmp_path / "log.onnx")
    assert softmax_axes(old) == {"z": 1}
    assert class_scores(np.zeros((3, 5), np.float32), 1, linear=False)
    assert softmax_axes(tmp_path / "model.ort") == {}  # no ONNX graph to read: only top1_outputs
    assert linear_heads(tmp_path / "model.ort") == set()


# --- the step ----------------------------------------------------------------------------------------
def test_top1_only_on_class_scores(tmp_path):
    model = three_heads(tmp_path / "m.onnx")
    report = verify(tmp_path, model, model, min_top1=0.9, max_abs=0.0, samples=3, dynamic_size=2)
    figures = report["json"]["outputs"]
    assert figures["probs"]["top1"] == 1.0 and figures["logits"]["top1"] == 1.0
    assert figures["pixel_map"]["top1"] is None and figures["state"]["top1"] is None
    checked = {(c["output"], c["metric"]) for c in report["json"]["checks"]}
    assert {o for o, m in checked if m == "top1"} == {"probs", "logits"}
    top1_rows = [line.split()[0] for line in report["text"].splitlines() if " top1 " in f" {line} "]
    assert sorted(top1_rows) == ["logits", "probs"]


def test_top1_outputs_names_what_the_rule_leaves_out(tmp_path):
    model = three_heads(tmp_path / "m.onnx")
    report = verify(tmp_path, model, model, min_top1=0.9, top1_outputs=["state"], outputs=["state", "probs"])
    figures = report["json"]["outputs"]
    assert figures["state"]["top1"] == 1.0 and figures["probs"]["top1"] is None  # named: only these


def test_min_top1_applies_where_outputs_hold_class_scores_and_warns_where_none_does(tmp_path):
    """A template's min_top1 over a classifier and an encoder: a table cannot unset it for the
    encoder, so there it is not applied, and a warning in the build's output says why; alone it
    would check nothing."""
    model = three_heads(tmp_path / "m.onnx")
    report = verify(tmp_path, model, model, min_top1=0.9, min_cosine=0.99, outputs=["pixel_map", "state"])
    assert report["json"]["passed"] is True
    assert not [c for c in report["json"]["checks"] if c["metric"] == "top1"]
    warning = ("min_top1 not applied: no compared output holds class scores on an axis "
               "(pixel_map float32 [1, 1, 4, 4], state float32 [2, 1, 16])")
    assert report["json"]["warnings"][0].startswith(warning)
    assert f"warning: {warning}" in report["text"]
    assert "name the outputs whose last axis is the classes in top1_outputs" in report["json"]["warnings"][0]
    with pytest.raises(StepError, match=r"^min_top1 is the only threshold, and it applies nowhere: no compared "
                                        r"output holds class scores on an axis \(pixel_map float32"):
        verify(tmp_path, model, model, name="v3", min_top1=0.9, outputs=["pixel_map", "state"])


def test_top1_outputs_must_hold_class_scores(tmp_path):
    with pytest.raises(StepError, match=r"top1 does not apply to output 'y' \(float32 \[1, 1\]\)"):
        one = tmp_path / "one.onnx"
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
        verify(tmp_path, save(helper.make_model(graph), one), one, name="v2", min_top1=0.9, top1_outputs=["y"])


# --- real models (issue #9's survey) ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name, inputs, with_top1, without_top1", [
    ("ppocr_det", {"x": {"shape": [1, 3, 64, 64]}}, [], ["sigmoid_0.tmp_0"]),  # pixel map [N, 1, H, W]
    ("silero_vad", {"input": {"shape": [1, 512]}, "state": {"shape": [2, 1, 128]}, "sr": {"values": [16000]}},
     [], ["output", "stateN"]),  # speech probability [N, 1] and the recurrent state [2, N, 128]
    ("ppocr_rec", {"x": {"shape": [1, 3, 48, 64]}}, ["softmax_11.tmp_0"], []),  # [N, T, charset], Softmax
    ("ppocr_cls", {"x": {"shape": [1, 3, 48, 64]}}, ["save_infer_model/scale_0.tmp_1"], []),  # Softmax, Identity
])
def test_corpus_models_get_top1_where_it_means_something(tmp_path, name, inputs, with_top1, without_top1):
    model = corpus_model(name)
    report = verify(tmp_path, model, model, max_abs=0.0, samples=2, inputs=inputs)["json"]
    assert [n for n, f in report["outputs"].items() if f["top1"] is not None] == with_top1
    assert all(report["outputs"][n]["top1"] is None for n in without_top1)


# --- reports restored for another step ----------------------------------------------------------------
def test_a_report_shared_by_two_verify_steps_names_neither(tmp_path):
    project = ProjectDir(tmp_path / "proj")
    project.write("optbuild.toml", "[build]\njobs = 1\n")
    model = make_mlp(tmp_path / "proj" / "recipes" / "fp32.onnx")
    for copy in ("dynamic.onnx", "static.onnx"):  # a quantizer that left both models byte-identical
        shutil.copy(model, model.parent / copy)
    project.write("recipes/m.toml", """
[steps.fp32]
kind = "onnx"
path = "fp32.onnx"
[steps.quantize_dynamic]
kind = "onnx"
path = "dynamic.onnx"
[steps.quantize_static]
kind = "onnx"
path = "static.onnx"
[steps.verify_dynamic]
kind = "verify"
reference = "fp32"
candidate = "quantize_dynamic"
max_abs = 0.0
[steps.verify_static]
kind = "verify"
reference = "fp32"
candidate = "quantize_static"
max_abs = 0.0
""")
    result = project.build()
    assert result.ok
    statuses = {sid: result.outcomes[sid].status for sid in ("m:verify_dynamic", "m:verify_static")}
    assert sorted(statuses.values()) != ["built", "built"], statuses  # one key: one run, one restored
    for step in ("verify_dynamic", "verify_static"):
        text = project.read(f"build/m/{step}/report.txt")
        report = project.read(f"build/m/{step}/report.json")
        for name in ("verify_", "quantize_", "fp32", "m:"):
            assert name not in text and name not in report, (step, name)
        assert text.startswith("verify: candidate model.onnx (blake3-256 ")
        digest = json.loads(report)["candidate"]["digest"]
        assert digest == json.loads(report)["reference"]["digest"] and digest.startswith("blake3-256:")
