"""optbuild.model.compare and the modules it measures with (metrics) and verify judges and shows
its figures with (thresholds, verifyreport): one set of metrics for the per-feed checks and
verify's figures."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")

from optbuild.model import compare, metrics, thresholds, verifyreport


def test_max_errors_are_relative_to_the_reference_scale():
    ref = np.array([[10.0, -20.0], [0.0, 5.0]], np.float32)
    cand = ref + np.array([[0.0, 0.5], [0.01, 0.0]], np.float32)
    max_abs, max_rel = metrics.max_errors(ref, cand)
    assert max_abs == pytest.approx(0.5) and max_rel == pytest.approx(0.5 / 20)
    assert metrics.max_errors(np.zeros(0), np.zeros(0)) == (0.0, 0.0)


def test_nan_and_inf_in_the_same_places_are_equal_elsewhere_infinite():
    ref = np.array([1.0, np.nan, np.inf])
    assert metrics.max_errors(ref, ref.copy()) == (0.0, 0.0)
    assert metrics.max_errors(ref, np.array([1.0, 0.0, np.inf]))[0] == math.inf


def test_cosine():
    a = np.array([1.0, 2.0, 3.0])
    assert metrics.cosine(a, 2 * a) == pytest.approx(1.0)
    assert metrics.cosine(a, -a) == pytest.approx(-1.0)
    assert metrics.cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert metrics.cosine(a, np.zeros(3)) == 0.0
    assert math.isnan(metrics.cosine(a, np.array([1.0, np.nan, 3.0])))


def test_the_per_feed_check_and_the_figures_share_their_metrics():
    rng = np.random.default_rng(0)
    refs = [rng.standard_normal((2, 5)).astype(np.float32) for _ in range(3)]
    cands = [r + rng.normal(0, 1e-3, r.shape).astype(np.float32) for r in refs]
    figures = compare.output_figures(refs, cands, top1_axis=-1)
    per_feed = [compare.compare_outputs(["y"], [r], [c]) for r, c in zip(refs, cands)]
    assert figures["max_abs"] == max(c.max_abs for c in per_feed)
    scale = max(float(np.abs(r).max()) for r in refs)
    assert figures["max_rel"] == pytest.approx(figures["max_abs"] / scale)
    assert figures["cosine_min"] <= figures["cosine"] <= 1.0
    assert figures["top1"] == pytest.approx(np.mean([np.argmax(r, -1) == np.argmax(c, -1)
                                                     for r, c in zip(refs, cands)]))
    assert compare.output_figures(refs, cands, top1_axis=None)["top1"] is None


def test_figures_of_mismatched_shapes_fail_a_shape_check():
    figures = {"y": compare.output_figures([np.zeros((1, 2))], [np.zeros((1, 3))], top1_axis=None)}
    assert figures["y"]["shape_mismatch"] == "sample 0: (1, 3) vs (1, 2)"
    checks = thresholds.threshold_checks(figures, {"max_abs": 1.0}, [])
    assert checks == [{"output": "y", "metric": "shape", "value": "sample 0: (1, 3) vs (1, 2)", "op": "==",
                       "threshold": "reference", "ok": False}]


def test_threshold_checks_take_each_set_threshold_and_fail_nan():
    figures = {"a": {"max_abs": 0.5, "max_rel": 0.01, "cosine": 0.99, "top1": 0.9},
               "b": {"max_abs": float("nan"), "max_rel": float("nan"), "cosine": float("nan"), "top1": None}}
    limits = {"max_abs": 1.0, "max_rel": None, "min_cosine": 0.995, "min_top1": 0.8}
    checks = thresholds.threshold_checks(figures, limits, top1_outputs=["a"])
    assert [(c["output"], c["metric"], c["ok"]) for c in checks] == [
        ("a", "max_abs", True), ("a", "cosine", False), ("a", "top1", True),
        ("b", "max_abs", False), ("b", "cosine", False)]


def test_the_table_and_strict_json():
    report = {
        "reference": {"file": "ref.onnx", "digest": "blake3-256:" + "a" * 64},
        "candidate": {"file": "int8.onnx", "digest": "blake3-256:" + "b" * 64},
        "data": {"source": "random (seed 0)", "samples": 4},
        "outputs": {"y": {"max_abs": 0.25, "max_rel": float("inf"), "cosine": 0.9, "cosine_min": 0.8,
                          "top1": 0.75}},
        "checks": [{"output": "y", "metric": "top1", "value": 0.75, "op": ">=", "threshold": 0.9, "ok": False}],
        "latency_ms": {"reference": 1.0, "candidate": 0.5},
        "runtime": {"reference": "onnxruntime (CPU)", "candidate": "onnxruntime (CPU)"},
    }
    text = verifyreport.table(report)
    lines = text.splitlines()
    assert lines[0] == "verify: candidate int8.onnx (blake3-256 bbbbbbbbbbbb) vs reference ref.onnx " \
                       "(blake3-256 aaaaaaaaaaaa)"
    assert lines[1] == "4 samples from random (seed 0)"
    assert lines[-1] == "FAILED: 1 of 1 checks: y top1 75.0% (needs >= 90%)"
    assert any(line.split() == ["y", "max_rel", "inf"] for line in lines)
    assert verifyreport.jsonable(report["outputs"])["y"]["max_rel"] == "inf"


def test_the_split_axis_is_the_smallest_non_batch_axis():
    assert compare.split_axis((1, 84, 8400)) == 1  # YOLOv8: [batch, 4 + classes, anchors]
    assert compare.split_axis((1, 8400, 84)) == 2
    assert compare.split_axis((4, 1000)) == 1
    assert compare.split_axis((2, 1, 128)) == 2  # an axis of 1 has nothing to split
    assert compare.split_axis((4, 1)) is None and compare.split_axis((10,)) is None


def test_runs_part_where_the_reference_scale_drops_16_fold():
    rng = np.random.default_rng(0)
    boxes, scores = rng.uniform(0, 320, (1, 4, 50)), rng.uniform(0, 1, (1, 80, 50))
    samples = [np.concatenate([boxes, scores], axis=1)] * 2
    assert compare.scale_runs(samples, 1) == [(0, 4), (4, 84)]
    assert compare.scale_runs(samples, 2) == [(0, 50)]  # every anchor holds both quantities
    logits = [rng.standard_normal((1, 1000))]
    assert compare.scale_runs(logits, 1) == [(0, 1000)]  # one scale: one run
    interleaved = [np.tile([100.0, 1.0], 20)[None]]  # 40 alternating runs: noise, not parts
    assert compare.scale_runs(interleaved, 1) == [(0, 40)]


def test_slice_figures_are_relative_to_the_slice():
    ref = np.concatenate([np.full((1, 2, 3), 300.0), np.linspace(0.1, 0.9, 12).reshape(1, 4, 3)], axis=1)
    cand = ref.copy()
    cand[:, 2:] += 0.01
    figures = compare.output_figures([ref], [cand], None, name="out", slices=(1, [(0, 2), (2, 6)]))
    assert list(figures["slices"]) == ["out[:, 0:2, :]", "out[:, 2:6, :]"]
    small = figures["slices"]["out[:, 2:6, :]"]
    assert small["max_rel"] == pytest.approx(0.01 / 0.9) and figures["max_rel"] == pytest.approx(0.01 / 300)
    assert figures["slices"]["out[:, 0:2, :]"]["degenerate"] == "constant 300"  # reported, not checked
    checks = thresholds.threshold_checks({"out": figures}, {"max_rel": 0.001}, [])
    assert [(c["output"], c["ok"]) for c in checks] == [("out", True), ("out[:, 2:6, :]", False)]


def test_degenerate_references_and_collapsed_candidates():
    varying = np.linspace(0.0, 0.5, 10, dtype=np.float32)
    assert compare.output_figures([np.zeros(10)], [varying], None)["degenerate"] == "constant 0"
    assert compare.output_figures([np.array([np.nan, np.inf])], [varying[:2]], None)["degenerate"] == \
        "no finite value"
    assert compare.output_figures([np.ones(1)], [np.ones(1)], None)["degenerate"] is None  # one value tells nothing
    collapsed = compare.output_figures([varying], [np.zeros(10, np.float32)], None)["collapsed"]
    assert collapsed == "constant 0 where the reference spans [0, 0.5]"
    # a spread under FLAT_REL of the reference's scale is not lost information: float16 of 1 + 1e-5 k,
    # a float32 constant 2 against 2 varying in its 7th significant digit (issue #33)
    fine = (1 + 1e-5 * np.arange(10)).astype(np.float32)
    assert compare.output_figures([fine], [fine.astype(np.float16)], None)["collapsed"] is None
    seventh = np.float32(2) + np.array([-1.5e-6, 1.5e-6, 0.5e-6], np.float32)
    assert compare.output_figures([seventh], [np.full(3, 2, np.float32)], None)["collapsed"] is None


def test_importing_it_loads_no_numpy():
    code = ("import sys, optbuild.model.compare, optbuild.model.classaxes, optbuild.steps.verify; "
            "print('numpy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_top1_per_token_and_per_pixel_and_a_reference_of_one_class():
    rng = np.random.default_rng(0)
    tokens = rng.standard_normal((2, 5, 7))  # [batch, seq, vocab]
    moved = tokens.copy()
    moved[0, 0, (tokens[0, 0].argmax() + 1) % 7] += 100  # one token of ten predicts another
    assert metrics.top1([tokens], [moved], axis=-1) == pytest.approx(0.9)
    pixels = rng.standard_normal((1, 3, 4, 4))  # [batch, classes, H, W]
    flipped = pixels.copy()
    flipped[0, :, 0, :] = -flipped[0, :, 0, :] - 10 * (flipped[0, :, 0, :] == flipped[0, :, 0, :].max(axis=0))
    assert metrics.top1([pixels], [flipped], axis=1) == pytest.approx(12 / 16)
    same = [np.array([[0.0, 1.0, 0.5]])] * 8
    assert metrics.one_class(same, -1) == 1
    assert metrics.one_class(same[:7], -1) is None  # 7 positions may agree by chance
    assert compare.output_figures(same, same, None)["flat"].startswith("changes by at most 0 from sample to sample")
