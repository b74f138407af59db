"""A weight that one per-tensor scale serves badly is warned of (issue 24): convnext_tiny with
random weights held 2.0 beside a std of 0.02 in three weights (torch's trunc_normal_ at its
bound); quantized per tensor with 7-bit weights, its logits' cosine was 0.83, per channel
0.997, and nothing said why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper
from plugins.models import make_linear
from plugins.steps import calibrate
from test_quantize_report import quantize, run

from optbuild.model.int8report import outlier_weights


def make_outlier(path: Path) -> Path:
    """y = x @ w, w [16, 32] of std 0.02 with one value of 2.0 (in output channel 5)."""
    w = (0.02 * np.random.default_rng(3).standard_normal((16, 32))).astype(np.float32)
    w[4, 5] = 2.0
    return make_linear(path, w)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_weight_with_an_outlier_is_warned_with_per_channel_as_the_fix(tmp_path, capsys):
    model = make_outlier(tmp_path / "outlier.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32))
    calibrate(tmp_path, model, data="calib.npz")
    table = tmp_path / "out" / "calibrate" / "calibration.json"
    x = {"x": np.random.default_rng(7).standard_normal((16, 16)).astype(np.float32)}
    others = [c for c in range(32) if c != 5]  # the channels without the outlier
    reference = run(model, x)[:, others]

    per_tensor, ctx = quantize(tmp_path, model, "per-tensor", table, mode="static", reduce_range=True)
    assert ctx.metrics["outlier_weights"] == ["fc"]
    log = capsys.readouterr().err
    assert "warning: the weight 'w' of MatMul 'fc' peaks at |w| = 2" in log
    assert "most channels keep about 1 of 63 levels. per_channel = true gives each output channel its own scale" in log
    assert "nodes_to_exclude = ['fc']" in log
    assert _cosine(run(per_tensor, x)[:, others], reference) < 0.95  # 1 level: each weight -s, 0 or s

    per_channel, ctx = quantize(tmp_path, model, "per-channel", table, mode="static", reduce_range=True,
                                per_channel=True)
    assert "outlier_weights" not in ctx.metrics and "warning: the weight" not in capsys.readouterr().err
    assert _cosine(run(per_channel, x)[:, others], reference) > 0.985  # y's one activation scale still costs

    _, ctx = quantize(tmp_path, model, "dynamic", mode="dynamic", weight_type="uint8")
    assert ctx.metrics["outlier_weights"] == ["fc"] and "of 255 levels" in capsys.readouterr().err
    _, ctx = quantize(tmp_path, model, "excluded", table, mode="static", nodes_to_exclude=["fc"], allow_unchanged=True)
    assert ctx.metrics["outlier_weights"] == []


def test_outlier_weights_needs_a_peak_more_than_16x_the_typical_channel_peak():
    def graph(op: str, w: np.ndarray, **attrs) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x", "w"], ["y"], name="n", **attrs)], "g", [], [],
                                 [numpy_helper.from_array(w.astype(np.float32), "w")])

    w = np.ones((8, 4))  # MatMul [K, N]: output channels on the last axis
    assert outlier_weights(graph("MatMul", w)) == []
    w[0, 1] = 16.0  # 16x: one scale is still fine
    assert outlier_weights(graph("MatMul", w)) == []
    w[0, 1] = 17.0
    [found] = outlier_weights(graph("MatMul", w))
    assert (found.node, found.op, found.weight, found.peak, found.typical, found.levels(127)) == ("n", "MatMul", "w", 17.0, 1.0, 7)
    # Gemm with transB = 1 holds [N, K]: the same values seen per row
    assert [f.typical for f in outlier_weights(graph("Gemm", w.T, transB=1))] == [1.0]
    assert outlier_weights(graph("Relu", w)) == []  # no weight to quantize
