"""kind = "verify": checks that see what a user would see (issue #24, item 2).

A detector's single output [N, 84, anchors] concatenates box coordinates (0..320) and scores
(0..1). Static INT8 put one QuantizeLinear (scale 1.25) on that Concat and every score became
0, yet the whole-output cosine stayed at 0.9999 and verify passed. So: outputs are judged per
part where their reference holds quantities of different scales; a reference that is constant
(a zero-initialised head) makes any comparison meaningless and fails; top-1 is not taken on an
embedding (BERT's pooler, Tanh); and a user's own metric (``metric = "file.py:fn"``) is run.
The models are real ONNX graphs run by onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.steps import run_step

from optbuild.common.errors import StepError
from optbuild.steps.verify import Verify, VerifyParams

ANCHORS = 100  # more than 84: the channel axis is the smallest non-batch axis, as in YOLOv8


def verify(tmp_path: Path, reference: Path, candidate: Path, name: str = "verify", **params):
    inputs = {"reference": reference, "candidate": candidate}
    _, ctx = run_step(Verify, {"reference": "ref", "candidate": "cand", **params}, inputs, tmp_path, name)
    return ctx, json.loads((ctx.out_dir / "report.json").read_text())


def save(graph, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def detector(path: Path, quantize: str | None = None) -> Path:
    """x [N, 8] -> output0 [N, 84, ANCHORS]: 4 box coordinates in 0..320 (Sigmoid * 320), then
    80 scores in 0..0.6 (Sigmoid * 0.6), concatenated on axis 1. ``quantize``: "concat" puts
    one uint8 Q/DQ of scale 1.25 on the Concat (the broken static INT8: every score rounds to
    0); "parts" gives boxes and scores each their own scale before the Concat (a healthy one)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4 * ANCHORS)).astype(np.float32), "w_box"),
             numpy_helper.from_array(rng.standard_normal((8, 80 * ANCHORS)).astype(np.float32), "w_score"),
             numpy_helper.from_array(np.array([-1, 4, ANCHORS], np.int64), "s_box"),
             numpy_helper.from_array(np.array([-1, 80, ANCHORS], np.int64), "s_score"),
             numpy_helper.from_array(np.array(320.0, np.float32), "image_size"),
             numpy_helper.from_array(np.array(0.6, np.float32), "score_max"),
             numpy_helper.from_array(np.array(1.25, np.float32), "box_scale"),
             numpy_helper.from_array(np.array(1 / 255, np.float32), "score_scale"),
             numpy_helper.from_array(np.array(0, np.uint8), "zero")]
    nodes = [helper.make_node("MatMul", ["x", "w_box"], ["b0"]),
             helper.make_node("Reshape", ["b0", "s_box"], ["b1"]),
             helper.make_node("Sigmoid", ["b1"], ["b2"]),
             helper.make_node("Mul", ["b2", "image_size"], ["boxes"]),
             helper.make_node("MatMul", ["x", "w_score"], ["c0"]),
             helper.make_node("Reshape", ["c0", "s_score"], ["c1"]),
             helper.make_node("Sigmoid", ["c1"], ["c2"]),
             helper.make_node("Mul", ["c2", "score_max"], ["scores"])]

    def qdq(tensor: str, scale: str, out: str) -> list:
        return [helper.make_node("QuantizeLinear", [tensor, scale, "zero"], [f"{out}_q"]),
                helper.make_node("DequantizeLinear", [f"{out}_q", scale, "zero"], [out])]

    if quantize == "parts":
        nodes += qdq("boxes", "box_scale", "boxes_dq") + qdq("scores", "score_scale", "scores_dq")
        nodes.append(helper.make_node("Concat", ["boxes_dq", "scores_dq"], ["output0"], axis=1))
    elif quantize == "concat":
        nodes.append(helper.make_node("Concat", ["boxes", "scores"], ["cat"], axis=1))
        nodes += qdq("cat", "box_scale", "output0")
    else:
        nodes.append(helper.make_node("Concat", ["boxes", "scores"], ["output0"], axis=1))
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 84, ANCHORS])],
                              inits)
    return save(graph, path)


@pytest.fixture
def detectors(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The fp32 detector, the broken INT8 one (one scale on the Concat), the healthy INT8 one."""
    return (detector(tmp_path / "fp32.onnx"), detector(tmp_path / "broken.onnx", "concat"),
            detector(tmp_path / "healthy.onnx", "parts"))


BOXES, SCORES = "output0[:, 0:4, :]", "output0[:, 4:84, :]"


# --- per-part figures -------------------------------------------------------------------------
def test_scores_wiped_by_a_shared_scale_fail_naming_the_slice(tmp_path, detectors):
    fp32, broken, _ = detectors
    with pytest.raises(StepError) as info:
        verify(tmp_path, fp32, broken, min_cosine=0.999, max_rel=0.01)
    failed = str(info.value).splitlines()[-1]
    assert failed.startswith("FAILED: 3 of 7 checks: ")  # max_rel and cosine of output0 and of each slice
    assert f"{SCORES}: the candidate's {SCORES} is constant 0 where the reference spans [" in failed
    assert f"{SCORES} max_rel 1 (needs <= 0.01)" in failed and f"{SCORES} cosine 0.00000 (needs >= 0.999)" in failed

    _, report = verify(tmp_path, fp32, broken, name="v2", min_cosine=0.999, max_rel=0.01, fail=False)
    whole = report["outputs"]["output0"]
    assert whole["cosine"] > 0.9999  # what verify saw before: the boxes' energy hides the scores
    assert list(whole["slices"]) == [BOXES, SCORES]
    assert whole["slices"][BOXES]["cosine"] > 0.9999 and whole["slices"][SCORES]["cosine"] == 0.0
    failed_checks = {(c["output"], c["metric"]) for c in report["checks"] if not c["ok"]}
    assert failed_checks == {(SCORES, "max_rel"), (SCORES, "cosine"), (SCORES, "candidate")}
    assert report["passed"] is False


def test_a_scale_per_quantity_passes_with_figures_per_slice(tmp_path, detectors):
    fp32, _, healthy = detectors
    ctx, report = verify(tmp_path, fp32, healthy, min_cosine=0.999, max_rel=0.01)
    slices = report["outputs"]["output0"]["slices"]
    assert slices[BOXES]["max_abs"] <= 1.25 + 1e-4  # one step of the box scale (320 saturates at 318.75)
    assert slices[SCORES]["max_abs"] <= 0.5 / 255 + 1e-6 and slices[SCORES]["cosine"] > 0.9999
    assert slices[SCORES]["max_rel"] == pytest.approx(slices[SCORES]["max_abs"] / 0.6, rel=0.05)  # to its own peak
    assert report["passed"] is True
    text = (ctx.out_dir / "report.txt").read_text()
    assert any(line.startswith(f"{SCORES}  cosine ") and line.endswith("ok") for line in text.splitlines())


def test_benchmark_and_select_read_the_worst_part_not_the_whole_output(tmp_path, detectors):
    """Issue 33 item 8: a detector whose whole output gives cosine 0.99998 while its scores give
    0.0. The verify step's metrics, benchmark.json's verify summary, select's cosine column and
    its min_cosine show the scores part, named, as verify's thresholds judge it."""
    from optbuild.steps.benchmark import Benchmark
    from optbuild.steps.select import Select

    fp32, broken, healthy = detectors
    reports = {}
    for name, model in (("healthy", healthy), ("broken", broken)):
        ctx, report = verify(tmp_path, fp32, model, name=f"verify_{name}", min_cosine=0.5, fail=False)
        assert ctx.metrics[f"{SCORES}.cosine"] == report["outputs"]["output0"]["slices"][SCORES]["cosine"]
        assert ctx.metrics["cosine"] == report["outputs"]["output0"]["cosine"]  # the whole, as before
        _, bench = run_step(Benchmark, {"input": "model", "check": "verify", "runs": 2, "warmup": 0, "threads": 1},
                            {"input": model, "check": ctx.out_dir / "report.json"}, tmp_path, f"bench_{name}")
        reports[name] = bench.out_dir / "benchmark.json"
    summary = json.loads(reports["broken"].read_text())["verify"]
    assert summary["cosine"] == 0.0 and summary["cosine_at"] == SCORES and summary["passed"] is False
    healthy_summary = json.loads(reports["healthy"].read_text())["verify"]
    assert healthy_summary["passed"] is True and 0.9999 < healthy_summary["cosine"] < 1

    _, ctx = run_step(Select, {"candidates": ["bench_healthy", "bench_broken"], "measure": "cached", "min_cosine": 0.99},
                      {"candidates.0": reports["healthy"], "candidates.1": reports["broken"]}, tmp_path, "best")
    selection = json.loads((ctx.out_dir / "selection.json").read_text())
    broken_row = next(row for row in selection["candidates"] if row["input"] == "candidates.1")
    assert "cosine 0.000000 < 0.99" in broken_row["rejected"]
    line = next(line for line in (ctx.out_dir / "selection.txt").read_text().splitlines() if "candidates.1-of-best" in line)
    assert " 0.000000  " in line and "0.999" not in line


def test_declared_slices_replace_the_automatic_split(tmp_path, detectors):
    fp32, broken, _ = detectors
    _, report = verify(tmp_path, fp32, broken, min_cosine=0.999, fail=False,
                       slices={"output0": {"axis": 1, "at": [2, 4]}})
    assert list(report["outputs"]["output0"]["slices"]) == [
        "output0[:, 0:2, :]", "output0[:, 2:4, :]", SCORES]
    # at = []: judged whole, as before this rule, and the wiped scores pass unseen
    _, report = verify(tmp_path, fp32, broken, name="v2", min_cosine=0.999, slices={"output0": {"axis": 1, "at": []}})
    assert "slices" not in report["outputs"]["output0"] and report["passed"] is True
    with pytest.raises(StepError, match=r"slices.output0.at: 84 is not below the size 84 of axis 1 of output0 "
                                        r"\[1, 84, 100\]; give indices from 1 to 83"):
        verify(tmp_path, fp32, broken, name="v3", min_cosine=0.999, slices={"output0": {"axis": 1, "at": [84]}})
    with pytest.raises(StepError, match=r"slices.output0.axis: 3 is past the last axis"):
        verify(tmp_path, fp32, broken, name="v4", min_cosine=0.999, slices={"output0": {"axis": 3, "at": [1]}})
    with pytest.raises(StepError, match=r"slices: no compared output 'boxes'"):
        verify(tmp_path, fp32, broken, name="v5", min_cosine=0.999, slices={"boxes": {"axis": 1, "at": [1]}})


@pytest.mark.parametrize("slices, words", [
    ({"y": {"axis": 1, "at": [4, 4]}}, "at must be increasing indices above 0"),
    ({"y": {"axis": 1, "at": [0]}}, "at must be increasing indices above 0"),
    ({"y": {"axis": -1, "at": [1]}}, "greater than or equal to 0"),
    ({"y": {"at": [1]}}, "axis\n  Field required"),
])
def test_declared_slices_are_validated(slices, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=words):
        VerifyParams.model_validate({"reference": "a", "candidate": "b", "max_abs": 1.0, "slices": slices})
    with pytest.raises(ValidationError, match=r"slices \['z'\] are not in outputs"):
        VerifyParams.model_validate({"reference": "a", "candidate": "b", "max_abs": 1.0, "outputs": ["y"],
                                     "slices": {"z": {"axis": 1, "at": [1]}}})


# --- degenerate references --------------------------------------------------------------------
def head(path: Path, weight: float | None, activation: str | None = None, width: int = 10) -> Path:
    """x [N, 8] -> MatMul -> Add -> (activation) -> y [N, width]; ``weight`` None: random
    weights, else every weight and bias is ``weight`` (0: a zero-initialised head)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, width)) if weight is None else np.full((8, width), weight)
    b = rng.standard_normal(width) if weight is None else np.full(width, weight)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["y" if activation is None else "a"])]
    if activation is not None:
        nodes.append(helper.make_node(activation, ["a"], ["y"]))
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
                              [numpy_helper.from_array(w.astype(np.float32), "w"),
                               numpy_helper.from_array(b.astype(np.float32), "b")])
    return save(graph, path)


def test_a_constant_reference_fails_whatever_the_candidate(tmp_path):
    zero = head(tmp_path / "zero.onnx", 0.0)  # a ViT whose head was zero-initialised: every logit 0
    with pytest.raises(StepError) as info:
        verify(tmp_path, zero, zero, min_cosine=0.99, min_top1=0.9)
    message = str(info.value)
    rows = [line.split() for line in message.splitlines()]
    assert ["y", "cosine", "1.00000", ">=", "0.99", "ok"] in rows and ["y", "top1", "100.0%", ">=", "90%", "ok"] in rows
    assert message.splitlines()[-1] == (
        "FAILED: 1 of 3 checks: y: the reference's y is constant 0 on all 8 samples: any candidate agrees "
        "with it, so comparing shows nothing. Give the reference real weights (e.g. not a zero-initialised "
        "head), or samples that make it vary (data); or leave the output out of outputs")
    _, report = verify(tmp_path, zero, head(tmp_path / "random.onnx", None), name="v2", max_abs=100.0, fail=False)
    assert report["outputs"]["y"]["degenerate"] == "constant 0" and report["passed"] is False


def test_a_reference_that_varies_is_not_degenerate(tmp_path):
    model = head(tmp_path / "random.onnx", None)
    _, report = verify(tmp_path, model, model, max_abs=0.0, samples=1, dynamic_size=1)
    assert report["outputs"]["y"]["degenerate"] is None and report["passed"] is True


# --- top-1 only on class scores ---------------------------------------------------------------
def test_no_top1_on_an_embedding(tmp_path):
    pooler = head(tmp_path / "pooler.onnx", None, activation="Tanh", width=256)  # BERT's pooler: dense + tanh
    logits = head(tmp_path / "logits.onnx", None)  # a classifier's head: dense
    _, report = verify(tmp_path, logits, logits, min_top1=0.9)
    assert report["outputs"]["y"]["top1"] == 1.0
    _, report = verify(tmp_path, pooler, pooler, name="v2", min_cosine=0.99)
    assert report["outputs"]["y"]["top1"] is None
    with pytest.raises(StepError, match=r"min_top1 is the only threshold, and it applies nowhere: no compared "
                                        r"output holds class scores .* \(y float32 \[1, 256\]\)"):
        verify(tmp_path, pooler, pooler, name="v3", min_top1=0.9)


# --- a user's metric --------------------------------------------------------------------------
METRIC = '''
import numpy as np
from thresholds import SCORE  # a project-local module: it enters the key too


def agreement(reference, candidate, names):
    """Share of (anchor, class) pairs on the same side of the score threshold."""
    ref = np.concatenate(reference["output0"])[:, 4:, :]
    cand = np.concatenate(candidate["output0"])[:, 4:, :]
    share = float(np.mean((ref > SCORE) == (cand > SCORE)))
    return {"score_agreement": share, "outputs": len(names), "passed": share >= 0.99}


def broken(reference, candidate, names):
    return [1.0]


def raises(reference, candidate, names):
    return {"passed": 1 / 0}
'''


@pytest.fixture
def metric_file(tmp_path: Path) -> Path:
    (tmp_path / "thresholds.py").write_text("SCORE = 0.3\n")
    path = tmp_path / "det_metric.py"
    path.write_text(METRIC)
    return path


def test_a_user_metric_reports_its_figures_and_decides(tmp_path, detectors, metric_file):
    fp32, broken, healthy = detectors
    ctx, report = verify(tmp_path, fp32, healthy, metric="det_metric.py:agreement")  # a threshold of its own
    assert report["metric"]["callable"] == "det_metric.py:agreement" and report["metric"]["passed"] is True
    assert report["metric"]["figures"]["score_agreement"] > 0.99 and report["metric"]["figures"]["outputs"] == 1.0
    assert ctx.metrics["metric.score_agreement"] == report["metric"]["figures"]["score_agreement"]
    text = (ctx.out_dir / "report.txt").read_text()
    assert any(line.split()[:2] == ["det_metric.py:agreement", "score_agreement"] for line in text.splitlines())

    _, report = verify(tmp_path, fp32, broken, name="v2", metric="det_metric.py:agreement", fail=False,
                       slices={"output0": {"axis": 1, "at": []}})
    assert report["metric"]["passed"] is False
    assert {"output": "det_metric.py:agreement", "metric": "passed", "value": False, "op": "==",
            "threshold": True, "ok": False} in report["checks"]


def test_a_user_metric_that_breaks_the_contract_is_named(tmp_path, detectors, metric_file):
    fp32, _, healthy = detectors
    with pytest.raises(StepError, match=r"metric: det_metric.py:broken returned list; it must return a dict: "
                                        r"fn\(reference, candidate, names\)"):
        verify(tmp_path, fp32, healthy, metric="det_metric.py:broken")
    with pytest.raises(StepError, match=r"metric: det_metric.py:raises raised ZeroDivisionError: division by zero "
                                        r"\(at det_metric.py line 19, in raises\)"):
        verify(tmp_path, fp32, healthy, name="v2", metric="det_metric.py:raises")
    with pytest.raises(StepError, match=r"metric: file not found: .*nowhere.py \(metric = 'nowhere.py:f', "
                                        r"relative to the recipe file\)"):
        verify(tmp_path, fp32, healthy, name="v3", metric="nowhere.py:f")


def test_the_metric_file_and_its_imports_enter_the_key(tmp_path, metric_file):
    step = Verify(VerifyParams(reference="a", candidate="b", metric="det_metric.py:agreement"), tmp_path, tmp_path)
    assert step.key_files() == [metric_file.resolve(), (tmp_path / "thresholds.py").resolve()]
    assert [c.field for c in step.calls()] == ["metric"]
