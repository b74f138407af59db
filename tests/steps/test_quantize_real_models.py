"""kind = "quantize" on real third-party models (issue #9 items 3, 4, 8, 10): exports this
project did not write quantize with the default settings, or fail saying what to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optbuild.common.errors import StepError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from plugins.steps import run_step
from plugins.thirdparty_models import corpus_model

from optbuild.common.fingerprint import Fingerprint
from optbuild.model.onnxgraph import all_nodes
from optbuild.steps.calibrate import Calibrate
from optbuild.steps.opset import Opset
from optbuild.steps.quantize import Quantize, x86_without_vnni
from optbuild.steps.simplify import Simplify

pytestmark = pytest.mark.slow

# silero-vad's chunk: 512 samples at 16 kHz plus 64 of context (what the model is fed)
SILERO_INPUTS = {"input": {"shape": [1, 576]}, "sr": {"values": [16000]}}


def quantize(tmp_path: Path, model: Path, name: str = "quantize", calibration: Path | None = None, **params):
    inputs = {"input": model} | ({"calibration": calibration} if calibration else {})
    refs = {"calibration": "calibrate"} if calibration else {}
    _, ctx = run_step(Quantize, {"input": "model", **refs, **params}, inputs, tmp_path, name)
    return ctx.out_dir / "model.onnx", ctx


def calibrate(tmp_path: Path, model: Path, name: str) -> Path:
    """A table from 8 seeded images in [0, 1] for PaddleOCR's classifier (x: N x 3 x 48 x 192)."""
    data = tmp_path / f"{name}.npz"
    np.savez(data, x=np.random.default_rng(0).random((8, 3, 48, 192), dtype=np.float32))
    _, ctx = run_step(Calibrate, {"input": "model", "data": data.name}, {"input": model}, tmp_path, name)
    return ctx.out_dir / "calibration.json"


def ops(path: Path) -> list[str]:
    return [n.op_type for n in all_nodes(onnx.load(str(path)).graph)]


@pytest.mark.parametrize("name", ["ppocr_det", "ppocr_rec", "layout_cdla"])
def test_paddle_exports_quantize_dynamically_with_the_defaults(tmp_path, name):
    """Their weights are Constant nodes: onnxruntime alone fails with 'Expected
    conv2d_394.w_0 to be an initializer'."""
    model = corpus_model(name)
    upstream = model.read_bytes()
    out, ctx = quantize(tmp_path, model, mode="dynamic")
    assert ctx.metrics["constants_to_initializers"] > 300
    assert "ConvInteger" in ops(out) and ctx.metrics["integer_ops"] > 40
    assert ctx.metrics["reduce_range"] is x86_without_vnni(Fingerprint())
    assert model.read_bytes() == upstream
    if name == "ppocr_det":  # the same bytes again: the cache may share the result
        again, _ = quantize(tmp_path, model, "again", mode="dynamic")
        assert again.read_bytes() == out.read_bytes()


def test_static_on_ppocr_cls_and_per_channel_through_an_opset_step(tmp_path, capsys):
    """Static INT8 with the defaults; per_channel at its opset 11 fails first and names the
    fix, which then works: an opset step to 13, calibrated and quantized."""
    model = corpus_model("ppocr_cls")
    table = calibrate(tmp_path, model, "calibrate")
    out, ctx = quantize(tmp_path, model, "static", table, mode="static")
    assert ctx.metrics["quantize_linear"] > 50 and ctx.metrics["constants_to_initializers"] == 308
    assert "calibrated another file" not in capsys.readouterr().err  # the table names the upstream file
    with pytest.raises(StepError, match=r"per_channel = true in static mode needs opset 13 or later.* is opset "
                                        r"11,(.|\n)*\[steps.opset13\]\nkind = \"opset\"\ninput = \"model\"\nversion = 13"):
        quantize(tmp_path, model, "per_channel", table, mode="static", per_channel=True)
    _, converted = run_step(Opset, {"input": "model", "version": 13, "inputs": {"x": {"shape": [1, 3, 48, 192]}}},
                            {"input": model}, tmp_path, "opset13")
    opset13 = converted.out_dir / "model.onnx"
    out, _ = quantize(tmp_path, opset13, "per_channel13", calibrate(tmp_path, opset13, "calibrate13"),
                      mode="static", per_channel=True)
    axes = [a.i for n in all_nodes(onnx.load(str(out)).graph) if n.op_type == "DequantizeLinear"
            for a in n.attribute if a.name == "axis"]
    assert axes  # per-channel weights, and the model loads and ran (the step's check)


def test_silero_vad_is_quantized_inside_its_if_or_refused(tmp_path):
    """Every op sits inside a top-level If. Before: both INT8 modes returned the float model
    and passed."""
    model = corpus_model("silero_vad")
    out, ctx = quantize(tmp_path, model, "dynamic", mode="dynamic", inputs=SILERO_INPUTS)
    assert ctx.metrics["integer_ops"] > 0
    top = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert not any(op.endswith("Integer") for op in top)  # all of them inside the If
    onnx.checker.check_model(str(out), full_check=True)

    table = tmp_path / "table.json"
    table.write_text('{"format": "optbuild.calibration", "version": 1, "method": "minmax", '
                     '"tensors": {"input": [-1.0, 1.0]}}')
    with pytest.raises(StepError, match=r"the static INT8 result quantizes nothing .* all sit inside If/Loop/Scan "
                                        r"subgraphs, which onnxruntime's static quantization does not enter"):
        quantize(tmp_path, model, "static", table, mode="static", inputs=SILERO_INPUTS)
    out, _ = quantize(tmp_path, model, "accepted", table, mode="static", inputs=SILERO_INPUTS,
                      allow_unchanged=True)
    assert not any("Quantize" in op for op in ops(out))


def test_fp16_of_silero_vad_blocks_the_nodes_the_converter_types_wrong(tmp_path):
    """onnxconverter-common leaves Casts to float32 inside silero-vad's If branches, whose
    outputs it declares float16, and onnxruntime then refuses a Pad and Gathers of the
    branches, one per load. Before, the result did not load ('Type (tensor(float16)) of
    output arg (...stft/padding/Pad_output_0) ... does not match expected type')."""
    pytest.importorskip("onnxconverter_common")
    model = corpus_model("silero_vad")
    out, ctx = quantize(tmp_path, model, mode="fp16", inputs=SILERO_INPUTS)
    blocked = ctx.metrics["fp16_blocked_nodes"]
    assert {b.rsplit("/", 2)[-2] + "/" + b.rsplit("/", 1)[-1] for b in blocked} >= {
        "stft/Cast", "padding/Pad", "decoder/Gather_2"}
    feeds = {"input": np.random.default_rng(0).uniform(-0.5, 0.5, (1, 576)).astype(np.float32),
             "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.dtype == np.float32 and np.abs(got - reference).max() < 0.01  # a speech probability


def test_fp16_of_ppocr_det_simplified_by_onnxslim_loads(tmp_path):
    """onnxslim writes each value_info entry twice; the converter retyped only the first.
    Before: 'Type (tensor(float)) of output arg (nearest_interp_v2_0.tmp_0) of node
    (p2o.Resize.0_output_cast0) does not match expected type (tensor(float16))'."""
    pytest.importorskip("onnxconverter_common")
    pytest.importorskip("onnxslim")
    shape = {"x": {"shape": [1, 3, 64, 96]}}
    _, slim = run_step(Simplify, {"input": "model", "backend": "onnxslim", "inputs": shape},
                       {"input": corpus_model("ppocr_det")}, tmp_path, "simplify")
    simplified = slim.out_dir / "model.onnx"
    out, ctx = quantize(tmp_path, simplified, mode="fp16", keep_io_types=True, inputs=shape)
    assert ctx.metrics["value_info_dropped"] > 0
    x = {"x": np.random.default_rng(0).random((1, 3, 64, 96), dtype=np.float32)}
    reference = ort.InferenceSession(str(simplified), providers=["CPUExecutionProvider"]).run(None, x)[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, x)[0]
    assert np.abs(got - reference).max() < 0.02  # a probability map in [0, 1]
