"""INT8 that can be debugged (issue 24, item 3): quantize's per-tensor error report
(``report = true``: quant_report.json, where the INT8 model first departs from the float one)
and its warning for a Concat whose inputs' ranges are too far apart for one scale."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import make_mlp, save
from plugins.steps import calibrate, run_step

from optbuild.model.int8report import SHARED_SCALE_RATIO, shared_scales
from optbuild.steps.quantize import REPORT_FILE, Quantize

X = {"x": np.random.default_rng(7).standard_normal((16, 4)).astype(np.float32)}


def quantize(tmp_path: Path, model: Path, name: str, calibration: Path | None = None, **params):
    inputs = {"input": model} | ({"calibration": calibration} if calibration else {})
    refs = {"calibration": "calibrate"} if calibration else {}
    _, ctx = run_step(Quantize, {"input": "model", **refs, **params}, inputs, tmp_path, name)
    return ctx.out_dir / "model.onnx", ctx


def run(path: Path, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def make_detector(path: Path) -> Path:
    """A detector's head: y = Concat(boxes in 0..320, scores in 0..1), like YOLOv8's output0."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wb"], ["b"], name="box_fc"),
         helper.make_node("Sigmoid", ["b"], ["bs"], name="box_sigmoid"),
         helper.make_node("Mul", ["bs", "size"], ["boxes"], name="box_scale"),
         helper.make_node("MatMul", ["x", "ws"], ["s"], name="score_fc"),
         helper.make_node("Sigmoid", ["s"], ["scores"], name="score_sigmoid"),
         helper.make_node("Concat", ["boxes", "scores"], ["y"], name="/model.22/Concat_5", axis=1)],
        "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 7])],
        [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "wb"),
         numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "ws"),
         numpy_helper.from_array(np.array(320, np.float32), "size")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def write_table(path: Path, tensors: dict) -> Path:
    path.write_text(json.dumps({"format": "optbuild.calibration", "version": 1, "method": "minmax",
                                "tensors": tensors}))
    return path


def test_a_concat_of_boxes_and_scores_is_warned_with_the_exclusion_that_fixes_it(tmp_path, capsys):
    """The issue's detector: one QuantizeLinear (scale 1.25) on the Concat wiped every score
    under 0.63 to 0, and nothing said so."""
    model = make_detector(tmp_path / "detector.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32))
    calibrate(tmp_path, model, data="calib.npz")
    table = tmp_path / "out" / "calibrate" / "calibration.json"
    wiped, ctx = quantize(tmp_path, model, "int8", table, mode="static")
    log = capsys.readouterr().err
    assert ctx.metrics["shared_scales"] == ["/model.22/Concat_5"]
    assert ("warning: Concat '/model.22/Concat_5' joins 'scores' (range [" in log
            and f"more than {SHARED_SCALE_RATIO}x apart" in log
            and "nodes_to_exclude = ['/model.22/Concat_5'] on this step" in log)
    reference = run(model, X)[:, 4:]
    assert np.abs(run(wiped, X)[:, 4:] - reference).max() > 0.3  # the scores are gone

    fixed, ctx = quantize(tmp_path, model, "excluded", table, mode="static", nodes_to_exclude=["/model.22/Concat_5"])
    assert ctx.metrics["shared_scales"] == [] and "warning: Concat" not in capsys.readouterr().err
    assert np.abs(run(fixed, X)[:, 4:] - reference).max() < 0.05


def test_shared_scales_needs_ranges_more_than_16x_apart():
    graph = helper.make_graph([helper.make_node("Concat", ["a", "b"], ["c"], name="cat", axis=0),
                               helper.make_node("Relu", ["c"], ["d"], name="after")], "g", [], [])
    assert shared_scales(graph, {"a": [0.0, 1.0], "b": [-8.0, 8.0]}) == []  # 16x: one scale is fine
    found = shared_scales(graph, {"a": [0.0, 1.0], "b": [0.0, 320.0]})
    assert [(s.node, s.small, s.large, s.exclude, s.levels) for s in found] == [("cat", "a", "b", ["cat", "after"], 1)]
    assert shared_scales(graph, {"a": [0.0, 1.0]}) == []  # one calibrated input: nothing to compare


def test_the_report_names_the_tensor_where_int8_first_departs(tmp_path, capsys):
    """A range far too tight for fc1's output h (as a bad calibration gives) saturates it:
    the report says h is where the INT8 model leaves the float one, and everything after it
    follows."""
    mlp = make_mlp(tmp_path / "mlp.onnx")
    tight = write_table(tmp_path / "tight.json", {"x": [-3.0, 3.0], "h": [-0.05, 0.05], "hb": [-6.0, 6.0],
                                                  "r": [0.0, 6.0], "y": [-10.0, 10.0]})
    _, ctx = quantize(tmp_path, mlp, "tight", tight, mode="static", report=True)
    report = json.loads((ctx.out_dir / REPORT_FILE).read_text())
    tensors = [t["tensor"] for t in report["tensors"]]
    assert tensors[0] == "h" and tensors[-1] == "y"  # node order; graph outputs keep their names
    assert "hb" not in tensors  # onnxruntime fused Add and Relu into one node writing r: no hb to compare
    assert report["first_departure"]["tensor"] == "h" and report["first_departure"]["node"] == "fc1"
    assert report["first_departure"]["op"] == "MatMul" and report["first_departure"]["cosine"] < 0.99
    assert ctx.metrics["report_first_departure"] == "h"
    assert "first departs at 'h' (MatMul node 'fc1'" in capsys.readouterr().err

    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32))
    calibrate(tmp_path, mlp, data="calib.npz")  # ranges the data gives: h stays close
    fair = tmp_path / "out" / "calibrate" / "calibration.json"
    _, ctx = quantize(tmp_path, mlp, "fair", fair, mode="static", report=True)
    report = json.loads((ctx.out_dir / REPORT_FILE).read_text())
    cosine = {t["tensor"]: t["cosine"] for t in report["tensors"]}
    assert cosine["h"] > 0.99 and (report["first_departure"] or {}).get("tensor") != "h"


def test_dynamic_int8_reports_too_and_no_report_is_written_unless_asked(tmp_path):
    mlp = make_mlp(tmp_path / "mlp.onnx")
    _, ctx = quantize(tmp_path, mlp, "plain", mode="dynamic")
    assert not (ctx.out_dir / REPORT_FILE).exists()
    _, ctx = quantize(tmp_path, mlp, "reported", mode="dynamic", report=True)
    report = json.loads((ctx.out_dir / REPORT_FILE).read_text())
    assert [t["tensor"] for t in report["tensors"]] == ["h", "hb", "r", "y"]
    assert all(t["cosine"] > 0.99 for t in report["tensors"])
