"""exclude_until on what real models showed (issue 24): a ViT's static INT8 (cosine 0.878)
did not reach 0.99 in 8 nodes, because keeping float the node that makes a departing tensor
leaves that tensor quantized for the nodes that read it; and a convnext's search judged one
of its 1000 logits on its own, a part verify never judges."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import make_linear, save
from plugins.steps import calibrate
from test_quantize_report import quantize, run

from optbuild.steps.quantize import REPORT_FILE


def make_class_token(path: Path) -> Path:
    """A ViT's first block in small: token 0 (the class token) is 250x smaller than the
    others, a LayerNormalization and a residual Add read the tokens, and the head reads
    token 0 only. Quantized with one scale, token 0 keeps no level, and the LayerNormalization
    blows up what is left of it."""
    rng = np.random.default_rng(5)
    rows = np.ones((1, 5, 1), np.float32)
    rows[0, 0, 0] = 0.004
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="embed"),
         helper.make_node("Mul", ["h", "rows"], ["t"], name="scale_rows"),
         helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], name="ln", axis=-1),
         helper.make_node("Add", ["t", "n"], ["r"], name="residual"),
         helper.make_node("Gather", ["r", "i0"], ["c"], name="class_token", axis=1),
         helper.make_node("MatMul", ["c", "w2"], ["y"], name="head")],
        "class_token", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w1"),
         numpy_helper.from_array(rows, "rows"),
         numpy_helper.from_array(np.ones(8, np.float32), "g"), numpy_helper.from_array(np.zeros(8, np.float32), "b"),
         numpy_helper.from_array(np.array(0, np.int64), "i0"),
         numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def make_classifier(path: Path) -> Path:
    """logits = x @ w: class 9's weights are 100x smaller, so its logit is far below the others
    on every sample (as some of a real classifier's 1000 are on a few samples)."""
    w = np.random.default_rng(11).standard_normal((16, 10)).astype(np.float32)
    w[:, 9] *= 0.01
    return make_linear(path, w, output="logits")


def _calibrated(tmp_path: Path, model: Path, shape: tuple[int, ...]) -> Path:
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    calibrate(tmp_path, model, data="calib.npz")
    return tmp_path / "out" / "calibrate" / "calibration.json"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_tensor_its_readers_keep_quantized_is_kept_float_with_them(tmp_path, capsys):
    """Kept float, scale_rows still hands its readers a quantized t (they quantize what they
    read): the class token stays lost. The search then keeps t's readers float too, and the
    output comes back; before, it went on to other nodes and gave up with t still lost. The
    nodes tried on the way that did not help are passed over, and not counted."""
    model = make_class_token(tmp_path / "class_token.onnx")
    table = _calibrated(tmp_path, model, (64, 5, 8))
    x = {"x": np.random.default_rng(7).standard_normal((16, 5, 8)).astype(np.float32)}
    plain, _ = quantize(tmp_path, model, "plain", table, mode="static")
    assert _cosine(run(plain, x), run(model, x)) < 0.5  # the class token is gone

    out, ctx = quantize(tmp_path, model, "auto", table, mode="static",
                        exclude_until={"min_cosine": 0.99, "max_excluded": 3})
    assert ctx.metrics["auto_excluded"] == ["scale_rows", "ln", "residual"]
    assert _cosine(run(out, x), run(model, x)) > 0.99
    search = json.loads((ctx.out_dir / REPORT_FILE).read_text())["exclude_until"]
    assert search["met"] and [r["excluded"] for r in search["rounds"]] == [[], ["scale_rows", "ln", "residual"]]
    assert ["scale_rows"] in search["passed_over"] and len(search["passed_over"]) > 1  # from the output back
    log = capsys.readouterr().err
    assert ("kept 'scale_rows', 'ln', 'residual' float (with the nodes that read 't': it stays quantized for "
            "them): worst output y") in log

    # a tensor's readers are kept float together, or not at all: past max_excluded, never
    with pytest.raises(Exception, match=r"keeping scale_rows, ln, residual float together \(with the nodes that "
                                        r"read 't'.*\) would pass exclude_until.max_excluded = 2(.|\n)*"
                                        r"Raise exclude_until.max_excluded or max_seconds"):
        quantize(tmp_path, model, "bound", table, mode="static", exclude_until={"min_cosine": 0.99, "max_excluded": 2})


def test_class_scores_are_judged_whole_as_verify_judges_them(tmp_path):
    """Class 9's logit is far below the others, so by peak it is a part of its own; verify does
    not judge parts of class scores, and neither do the report and the search: the INT8 model
    (whole cosine over 0.999) meets 0.99 with nothing excluded."""
    model = make_classifier(tmp_path / "classifier.onnx")
    table = _calibrated(tmp_path, model, (64, 16))
    _, ctx = quantize(tmp_path, model, "auto", table, mode="static", report=True,
                      exclude_until={"min_cosine": 0.99})
    report = json.loads((ctx.out_dir / REPORT_FILE).read_text())
    logits = next(t for t in report["tensors"] if t["tensor"] == "logits")
    assert logits["cosine"] > 0.999 and logits["part"] is None and logits["part_cosine"] is None
    assert ctx.metrics["auto_excluded"] == [] and report["exclude_until"]["met"]


def test_only_steps_that_search_or_report_are_built_again_after_the_search_changed(tmp_path):
    """The search and the report changed what they make; a plain INT8 step did not, and keeps
    its key (and its users' cache); a step that searches is built again whenever the search
    changes."""
    from optbuild.steps.quantize import Quantize, QuantizeParams

    def version(**params) -> str:
        return Quantize(QuantizeParams(input="m", mode="dynamic", **params), tmp_path, tmp_path).version

    assert version() == Quantize.version == "4"
    assert version(report=True) == "5"
    assert version(exclude_until={"min_cosine": 0.99}) == "7"  # 7: the search starts where the model departs
    static = QuantizeParams(input="m", mode="static", calibration="c", report=True)
    fp16 = QuantizeParams(input="m", mode="fp16")  # 6: infinite fills kept float, outputs read inside
    assert Quantize(static, tmp_path, tmp_path).version == Quantize(fp16, tmp_path, tmp_path).version == "6"
