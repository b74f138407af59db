"""INT8 that excludes nodes by itself until it is good enough (issue 24, item 3):
``exclude_until = { min_cosine, max_excluded }`` on the quantize step keeps float, one at a
time, the node where the INT8 model first departs from the float one, until every output
(and every part of an output that joins quantities of different scales) reaches min_cosine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from plugins.models import make_mlp
from plugins.steps import calibrate
from pydantic import ValidationError
from test_quantize_report import X, make_detector, quantize, run

from optbuild.common.errors import StepError
from optbuild.steps.quantize import REPORT_FILE, QuantizeParams

CONCAT = "/model.22/Concat_5"


@pytest.fixture
def detector(tmp_path: Path) -> tuple[Path, Path]:
    """The issue's detector head (Concat of boxes 0..320 and scores 0..1) and its calibration table."""
    model = make_detector(tmp_path / "detector.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32))
    calibrate(tmp_path, model, data="calib.npz")
    return model, tmp_path / "out" / "calibrate" / "calibration.json"


def test_the_concat_that_wipes_the_scores_is_kept_float_and_the_scores_come_back(tmp_path, detector, capsys):
    model, table = detector
    out, ctx = quantize(tmp_path, model, "auto", table, mode="static", exclude_until={"min_cosine": 0.99})
    assert ctx.metrics["auto_excluded"] == [CONCAT]
    assert ctx.metrics["auto_exclude_cosine_before"] < 0.99 <= ctx.metrics["auto_exclude_cosine_after"]
    assert np.abs(run(out, X)[:, 4:] - run(model, X)[:, 4:]).max() < 0.05  # wiped to 0 without the search

    search = json.loads((ctx.out_dir / REPORT_FILE).read_text())["exclude_until"]
    assert search["met"] and search["excluded"] == [CONCAT] and search["min_cosine"] == 0.99
    assert [r["excluded"] for r in search["rounds"]] == [[], [CONCAT]]
    assert search["rounds"][0]["output"] == "y[:, 4:7]"  # the scores, which the whole output's cosine hides
    log = capsys.readouterr().err
    assert f"exclude_until: kept 1 node(s) float to reach min_cosine 0.99: {CONCAT}" in log
    assert f"nodes_to_exclude = {[CONCAT]!r} gives this model without the search" in log

    # the excluded nodes are a result: written into nodes_to_exclude, they give the same model
    by_hand, ctx = quantize(tmp_path, model, "by-hand", table, mode="static", nodes_to_exclude=[CONCAT])
    assert by_hand.read_bytes() == out.read_bytes()


def test_a_model_that_meets_the_target_excludes_nothing_and_is_the_model_without_the_search(tmp_path, capsys):
    mlp = make_mlp(tmp_path / "mlp.onnx")
    plain, _ = quantize(tmp_path, mlp, "plain", mode="dynamic")
    out, ctx = quantize(tmp_path, mlp, "auto", mode="dynamic", exclude_until={"min_cosine": 0.99})
    assert ctx.metrics["auto_excluded"] == []
    assert ctx.metrics["auto_exclude_cosine_before"] == ctx.metrics["auto_exclude_cosine_after"] >= 0.99
    assert out.read_bytes() == plain.read_bytes()
    assert "meets min_cosine 0.99; no node excluded" in capsys.readouterr().err
    search = json.loads((ctx.out_dir / REPORT_FILE).read_text())["exclude_until"]
    assert search["excluded"] == [] and search["tried"] == [] and len(search["rounds"]) == 1


def test_the_bound_reached_without_the_target_fails_with_the_table_and_the_nodes_tried(tmp_path, detector):
    """min_cosine 1 cannot be met by any INT8 model: one node kept float (the Concat its warning
    names, tried first), then an error that says what was kept and which parameter to change."""
    model, table = detector
    with pytest.raises(StepError) as failed:
        quantize(tmp_path, model, "bound", table, mode="static",
                 exclude_until={"min_cosine": 1.0, "max_excluded": 1})
    message = str(failed.value)
    assert "worst output stays under min_cosine = 1.0 (1 nodes kept float, exclude_until.max_excluded = 1)" in message
    assert f"nodes kept float: [{CONCAT!r}]" in message
    assert "tensor  op" in message and "cosine" in message  # the worst tensors' table
    assert "The error is spread over the network" in message  # under cosine 1, every tensor departs
    assert "per_channel = true" in message and 'mode = "fp16"' in message


def test_exclude_until_is_checked_where_the_recipe_is_read():
    base = {"input": "model", "calibration": "calibrate", "mode": "static"}
    assert QuantizeParams.model_validate(base | {"exclude_until": {"min_cosine": 0.99}}).exclude_until.max_excluded == 8
    assert QuantizeParams.model_validate(base | {"exclude_until": {"min_cosine": 0.99}}).exclude_until.max_seconds == 300
    for wrong, field in (({"min_cosine": 1.5}, "min_cosine"), ({"min_cosine": 0.99, "max_excluded": 0}, "max_excluded"),
                         ({"min_cosine": 0.99, "max_seconds": 0}, "max_seconds"),
                         ({}, "min_cosine"), ({"min_cosine": 0.99, "max_exclude": 4}, "max_exclude")):
        with pytest.raises(ValidationError, match=field):
            QuantizeParams.model_validate(base | {"exclude_until": wrong})
    with pytest.raises(ValidationError, match="'exclude_until' does not apply to mode 'fp16'"):
        QuantizeParams.model_validate({"input": "model", "mode": "fp16", "exclude_until": {"min_cosine": 0.99}})


def test_the_report_judges_a_concat_of_boxes_and_scores_by_parts(tmp_path, detector):
    """Whole, the wiped output's cosine is near 1 (the boxes dominate it); its scores part is not."""
    model, table = detector
    _, ctx = quantize(tmp_path, model, "report", table, mode="static", report=True)
    report = json.loads((ctx.out_dir / REPORT_FILE).read_text())
    y = next(t for t in report["tensors"] if t["tensor"] == "y")
    assert y["cosine"] > 0.999 and y["part"] == "y[:, 4:7]" and y["part_cosine"] < 0.99
    assert report["first_departure"]["tensor"] == "y" and report["first_departure"]["node"] == CONCAT
