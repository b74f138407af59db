"""exclude_until starts where the INT8 model departs (issue 33, item 1): on a detector whose
boxes and class scores share one Concat, the search walked the backbone from the first Conv,
tried 8 nodes that changed nothing (score cosine 0.00000 throughout) and gave up, while the
step's own warning named the Concat whose exclusion alone fixes it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
from plugins.steps import calibrate
from test_quantize_report import quantize, run

from optbuild.common.errors import StepError
from optbuild.steps.quantize import REPORT_FILE

CONCAT = "/Concat"
DEPTH = 6  # backbone convolutions, each with a departing (tiny) channel that the outputs barely read


class Detector(torch.nn.Module):
    """A backbone of 3x3 convolutions whose last channel is 1000x smaller than the others (one
    scale per tensor wipes it: each backbone tensor departs, by that part, with no effect on the
    outputs), and a head that concatenates boxes in 0..320 and sigmoid class scores, as YOLO's
    output0 does."""

    def __init__(self) -> None:
        super().__init__()
        convs = [torch.nn.Conv2d(3 if i == 0 else 4, 4, 3, padding=1) for i in range(DEPTH)]
        self.box, self.cls = torch.nn.Conv2d(4, 4, 1), torch.nn.Conv2d(4, 3, 1)
        with torch.no_grad():
            for conv in convs:
                conv.weight[-1] *= 1e-3
                conv.bias[-1] *= 1e-3
            self.box.weight *= 20
            self.cls.weight *= 20  # scores spread over 0..1
        self.backbone = torch.nn.ModuleList(convs)

    def forward(self, x):
        for conv in self.backbone:
            x = torch.relu(conv(x))
        boxes = torch.sigmoid(self.box(x)) * 320
        return torch.cat([boxes, torch.sigmoid(self.cls(x))], 1).flatten(2)


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> tuple[Path, Path]:
    """The exported detector and its calibration table (32 seeded samples)."""
    tmp = tmp_path_factory.mktemp("detector")
    torch.manual_seed(0)
    model = tmp / "detector.onnx"
    torch.onnx.export(Detector().eval(), torch.randn(1, 3, 8, 8), str(model), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    np.savez(tmp / "calib.npz", x=np.random.default_rng(0).standard_normal((32, 3, 8, 8)).astype(np.float32))
    calibrate(tmp, model, data="calib.npz")
    return model, tmp / "out" / "calibrate" / "calibration.json"


X = {"x": np.random.default_rng(7).standard_normal((4, 3, 8, 8)).astype(np.float32)}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_search_starts_at_the_concat_its_warning_names_and_meets_the_floor(tmp_path, detector, capsys):
    """Before: it kept float the backbone's nodes one by one (each departs, by its tiny channel)
    and gave up after 8 with the scores still lost."""
    model, table = detector
    plain, _ = quantize(tmp_path, model, "plain", table, mode="static")
    assert np.abs(run(plain, X)[:, 4:] - run(model, X)[:, 4:]).max() > 0.3  # the scores are gone

    out, ctx = quantize(tmp_path, model, "auto", table, mode="static", exclude_until={"min_cosine": 0.99})
    assert ctx.metrics["auto_excluded"] == [CONCAT]
    assert ctx.metrics["auto_exclude_cosine_after"] >= 0.99
    assert np.abs(run(out, X)[:, 4:] - run(model, X)[:, 4:]).max() < 0.05
    search = json.loads((ctx.out_dir / REPORT_FILE).read_text())["exclude_until"]
    assert search["met"] and search["tried"] == [CONCAT] and search["passed_over"] == []
    log = capsys.readouterr().err
    assert f"warning: Concat {CONCAT!r}" in log and f"exclude_until: kept {CONCAT!r} float" in log


def make_deep_mlp(path: Path, depth: int = 8) -> Path:
    """A chain of Linear + Tanh layers, 16 wide: calibrated on inputs 10x smaller than it is
    fed, every layer clips a little and the error builds up over the whole chain."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[m for _ in range(depth) for m in (torch.nn.Linear(16, 16), torch.nn.Tanh())])
    torch.onnx.export(net.eval(), torch.randn(1, 16), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    return path


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_error_spread_over_the_network_is_said_so_with_what_works_instead(tmp_path, capsys):
    """A mobile net's INT8 error builds up over all its layers: no node holds it. The search
    passes over what does not help (not counted), and the failure says the error is spread
    and what works there, rather than only 'raise max_excluded'."""
    model = make_deep_mlp(tmp_path / "deep.onnx")
    np.savez(tmp_path / "calib.npz", x=(0.1 * np.random.default_rng(0).standard_normal((8, 16))).astype(np.float32))
    calibrate(tmp_path, model, data="calib.npz")
    table = tmp_path / "out" / "calibrate" / "calibration.json"
    with pytest.raises(StepError) as failed:
        quantize(tmp_path, model, "spread", table, mode="static", exclude_until={"min_cosine": 0.99, "max_excluded": 4})
    message = str(failed.value)
    assert "worst output stays under min_cosine = 0.99" in message
    assert "The error is spread over the network, not held by a few nodes" in message
    assert "(made by Tanh 8, Gemm 7)" in message  # every tensor but the first layer's, which the search kept float
    for works in ("per_channel = true", "more calibration data", "op_types_to_quantize", 'mode = "dynamic"',
                  'mode = "fp16"'):
        assert works in message
    assert "passed over (no gain on the outputs): [[" in message
    log = capsys.readouterr().err
    assert log.count("no better; passed over") >= 4  # more than max_excluded, none of them counted


def test_the_search_is_bounded_in_time(tmp_path, detector):
    model, table = detector
    with pytest.raises(StepError, match=r"exclude_until.max_seconds = 0.001 spent"):
        quantize(tmp_path, model, "timed", table, mode="static",
                 exclude_until={"min_cosine": 1.0, "max_seconds": 0.001})
