"""kind = "calibrate": real onnxruntime calibrators on small models made here with onnx.helper.

Also home of the small helpers the other step tests import (models, running a step in-process).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import make_mlp, make_two_inputs, save
from plugins.steps import calibrate

from optbuild.steps.calibrate import Calibrate, CalibrateParams, read_table

OPSET = 17


# --- helpers shared with the quantize / verify / engine tests ------------------------------------
def activations(model: Path, feeds: list[dict]) -> dict[str, np.ndarray]:
    """Every intermediate tensor of the MLP over ``feeds``, computed with numpy."""
    m = onnx.load(str(model))
    init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    x = np.concatenate([f["x"] for f in feeds])
    h = x @ init["w1"]
    hb = h + init["b1"]
    r = np.maximum(hb, 0)
    return {"x": x, "h": h, "hb": hb, "r": r, "y": r @ init["w2"]}


# --- data sources ---------------------------------------------------------------------------------
@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return make_mlp(tmp_path / "models" / "mlp.onnx")


def data(n: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


CALLABLE = """\
import numpy as np

def feeds(count=16, seed=0):
    x = np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)
    for row in x:
        yield {"x": row[None, :]}

def endless():
    while True:
        yield {"x": np.zeros((1, 4), np.float32)}
"""


def test_minmax_table_format_and_ranges_from_every_data_form(tmp_path, mlp):
    x = data()
    np.savez(tmp_path / "calib.npz", x=x)  # rank 2 = model rank: rows of the batch axis
    (tmp_path / "stacked").mkdir()
    np.save(tmp_path / "stacked" / "x.npy", x[:, None, :])  # rank 3: axis 0 enumerates samples
    (tmp_path / "per_sample" / "x").mkdir(parents=True)
    for i, row in enumerate(x):
        np.save(tmp_path / "per_sample" / "x" / f"{i:03d}.npy", row)  # no batch axis: one is added
    (tmp_path / "calib.py").write_text(CALLABLE)

    tables = {source: calibrate(tmp_path, mlp, name=f"c{i}", data=source)
              for i, source in enumerate(["calib.npz", "stacked", "per_sample", "calib.py:feeds"])}
    table = tables["calib.npz"]
    assert table["format"] == "optbuild.calibration" and table["version"] == 1
    assert table["method"] == "minmax" and table["symmetric"] is False
    assert table["samples"] == 16 and table["rows"] == 16
    assert table["model"]["inputs"] == {"x": {"dtype": "float32", "shape": ["batch", 4]}}
    expected = activations(mlp, [{"x": x}])
    assert set(table["tensors"]) == set(expected)
    for name, values in expected.items():
        low, high = table["tensors"][name]
        assert low == pytest.approx(float(values.min()), rel=1e-5, abs=1e-6), name
        assert high == pytest.approx(float(values.max()), rel=1e-5, abs=1e-6), name
    for source, other in tables.items():
        assert other["tensors"] == table["tensors"], source


def test_samples_limit_and_callable_arguments(tmp_path, mlp):
    (tmp_path / "calib.py").write_text(CALLABLE)
    table = calibrate(tmp_path, mlp, data="calib.py:feeds", data_args={"count": 40, "seed": 3}, samples=5)
    assert table["samples"] == 5
    x = np.random.default_rng(3).standard_normal((40, 4)).astype(np.float32)[:5]
    assert table["tensors"]["x"] == pytest.approx([float(x.min()), float(x.max())], rel=1e-6)
    # an endless generator is fine when samples bounds it
    assert calibrate(tmp_path, mlp, name="endless", data="calib.py:endless", samples=3)["samples"] == 3


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_methods(tmp_path, mlp, method):
    np.savez(tmp_path / "calib.npz", x=data(64))
    extra = {"num_bins": 256} if method == "entropy" else {"percentile": 99.0}
    table = calibrate(tmp_path, mlp, data="calib.npz", method=method, **extra)
    minmax = calibrate(tmp_path, mlp, name="minmax", data="calib.npz")
    assert table["method"] == method and table["samples"] == 64
    assert set(table["tensors"]) == set(minmax["tensors"])
    # histogram methods clip: no range is wider than the observed one
    for name, (low, high) in table["tensors"].items():
        mlow, mhigh = minmax["tensors"][name]
        span = max(abs(mlow), abs(mhigh))
        assert -span - 1e-3 <= low <= high <= span + 1e-3, name
    if method == "percentile":
        assert table["symmetric"] is True  # onnxruntime's default for percentile
        for name, (low, high) in table["tensors"].items():  # (clipped to what was observed)
            mlow, mhigh = minmax["tensors"][name]
            assert low == pytest.approx(-high) or low == pytest.approx(mlow) or high == pytest.approx(mhigh)
        assert table["options"]["percentile"] == 99.0


def test_entropy_without_more_bins_than_quantized_bins_warns_that_it_is_minmax(tmp_path, mlp, capsys):
    np.savez(tmp_path / "calib.npz", x=data(64))
    default = calibrate(tmp_path, mlp, data="calib.npz", method="entropy")
    minmax = calibrate(tmp_path, mlp, name="minmax", data="calib.npz")
    assert default["tensors"] == minmax["tensors"]
    assert ("warning: method = 'entropy' with num_bins = num_quantized_bins = 128 leaves no room to clip, "
            "so its ranges are minmax's: set num_bins larger" in capsys.readouterr().err)
    wide = calibrate(tmp_path, mlp, name="wide", data="calib.npz", method="entropy", num_bins=2048)
    assert "warning" not in capsys.readouterr().err and wide["tensors"] != minmax["tensors"]


def test_symmetric_minmax_and_op_types(tmp_path, mlp):
    np.savez(tmp_path / "calib.npz", x=data())
    table = calibrate(tmp_path, mlp, data="calib.npz", symmetric=True, op_types=["Relu"])
    assert set(table["tensors"]) == {"hb", "r"}  # inputs and outputs of Relu nodes only
    assert all(low == -high for low, high in table["tensors"].values())


# --- tensors with no elements (#9 F4) -------------------------------------------------------------
def make_resize(path: Path) -> Path:
    """x: float32 [1, 1, 4, 4] -> Resize (nearest, x2) -> Relu -> y, its roi an empty Constant
    as paddle2onnx writes it (layout_cdla's 'p2o.helper.constant.125')."""
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["roi"], value=numpy_helper.from_array(np.zeros(0, np.float32))),
         helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))),
         helper.make_node("Resize", ["x", "roi", "scales"], ["up"], mode="nearest"),
         helper.make_node("Relu", ["up"], ["y"])],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # percentile's, on roi
@pytest.mark.parametrize(("method", "options"), [
    ("minmax", {}), ("minmax", {"symmetric": True}), ("entropy", {}), ("percentile", {})])
def test_an_empty_tensor_is_left_out_of_the_table(tmp_path, capsys, method, options):
    """Its range was [inf, -inf] (minmax, a failure), [-inf, inf] (symmetric) or made up
    ([0, 0] entropy, [0, -0.5] percentile)."""
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, 1, 4, 4)).astype(np.float32))
    table = calibrate(tmp_path, make_resize(tmp_path / "resize.onnx"), data="calib.npz", method=method, **options)
    assert "roi" not in table["tensors"] and {"x", "up", "y"} <= set(table["tensors"])
    assert "2 Constant node tensor(s) left out of calibration" in capsys.readouterr().err  # roi, scales


def test_a_tensor_empty_on_every_sample_is_left_out_and_an_infinite_one_still_fails(tmp_path):
    """Compress keeps the values above 100: none of N(0, 1), so minmax saw no value of
    'picked' ([inf, -inf]); shape inference cannot know that. An infinity is a real range
    problem: x / 0."""
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    big = numpy_helper.from_array(np.array(100, np.float32), "big")
    graph = helper.make_graph(
        [helper.make_node("Greater", ["x", "big"], ["g"]), helper.make_node("Compress", ["x", "g"], ["picked"]),
         helper.make_node("ReduceSum", ["picked"], ["y"], keepdims=0)],
        "compress", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [big])
    np.savez(tmp_path / "calib.npz", x=data(8))
    table = calibrate(tmp_path, save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]),
                                     tmp_path / "compress.onnx"), data="calib.npz")
    assert set(table["tensors"]) == {"x", "y"}
    graph = helper.make_graph(
        [helper.make_node("Div", ["x", "zero"], ["y"])], "div",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [zero])
    divide = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), tmp_path / "div.onnx")
    with pytest.raises(StepError, match=r"tensor 'y' has a non-finite range \[-inf, inf\] and no finite value: "
                                        r"the model produces only infinity"):
        calibrate(tmp_path, divide, name="div", data="calib.npz")


def make_masked_attention(path: Path, mask_value: float = -np.inf) -> Path:
    """x: [1, 4] -> scores = x @ w -> masked = scores + mask -> Softmax -> y: the additive mask
    hides the last two scores with ``mask_value``, as attention masks do."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32), "w")
    mask = numpy_helper.from_array(np.array([0, 0, mask_value, mask_value], np.float32), "mask")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]), helper.make_node("Add", ["scores", "mask"], ["masked"]),
         helper.make_node("Softmax", ["masked"], ["y"], axis=-1)],
        "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, mask])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


@pytest.mark.parametrize("symmetric", [False, True])
def test_an_additive_masks_infinity_is_bounded_by_the_finite_values(tmp_path, capsys, symmetric):
    """[-inf, x] is a mask working as meant: the table keeps the range of the finite values."""
    model = make_masked_attention(tmp_path / "masked.onnx")
    x = data(8)
    np.savez(tmp_path / "calib.npz", x=x)
    table = calibrate(tmp_path, model, data="calib.npz", symmetric=symmetric)
    scores = x @ numpy_helper.to_array(onnx.load(str(model)).graph.initializer[0])
    finite = scores[:, :2]  # what the mask lets through
    low, high = table["tensors"]["masked"]
    if symmetric:
        end = np.float32(np.abs(finite).max())
        assert (low, high) == (-end, end)
    else:
        assert (low, high) == (np.float32(finite.min()), np.float32(finite.max()))
    unmasked = [scores.min(), scores.max()]
    assert table["tensors"]["scores"] == pytest.approx(unmasked if not symmetric
                                                        else [-np.abs(scores).max(), np.abs(scores).max()])
    log = capsys.readouterr().err
    assert "tensor 'masked': range [-inf, " in log and "holds infinity (an additive attention mask's -inf?)" in log


def masked_fill_attention(path: Path) -> Path:
    """A tiny attention block exported by torch: masked_fill(mask == 0, -inf) becomes a Where
    that reads a Constant holding -inf only."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))

        def forward(self, x, mask):
            scores = self.q(x) @ self.k(x).transpose(-1, -2) / 8 ** 0.5
            scores = scores.masked_fill(mask[:, None, :] == 0, float("-inf"))
            return torch.softmax(scores, -1) @ self.v(x)

    torch.manual_seed(0)
    x, mask = torch.randn(2, 6, 8), torch.ones(2, 6)
    torch.onnx.export(Attention().eval(), (x, mask), str(path), dynamo=False, opset_version=OPSET,
                      input_names=["x", "mask"], output_names=["y"], dynamic_axes={"x": {0: "b"}, "mask": {0: "b"}})
    return path


def attention_feeds(n: int, seed: int) -> dict[str, np.ndarray]:
    mask = np.ones((n, 6), np.float32)
    mask[:, 4:] = 0  # the last two places hidden
    return {"x": np.random.default_rng(seed).standard_normal((n, 6, 8)).astype(np.float32), "mask": mask}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_masked_fill_constant_is_no_calibration_range_and_static_int8_works(tmp_path, capsys):
    """Before: "tensor '/Constant_3_output_0' has a non-finite range [-inf, -inf] and no finite
    value: the model produces only infinity on the calibration data". With the Constant left out
    but the masked scores quantized, the masked places got weight (cosine 0.989)."""
    import onnxruntime as ort
    from plugins.steps import run_step

    from optbuild.steps.quantize import Quantize

    model = masked_fill_attention(tmp_path / "attention.onnx")
    constants = {n.output[0] for n in onnx.load(str(model)).graph.node if n.op_type == "Constant"}
    np.savez(tmp_path / "calib.npz", **attention_feeds(16, 0))
    table = calibrate(tmp_path, model, data="calib.npz")
    assert constants and not constants & set(table["tensors"])
    log = capsys.readouterr().err
    assert f"{len(constants)} Constant node tensor(s) left out of calibration" in log
    assert "nodes_to_exclude = ['/Softmax'] on the quantize step" in log  # the -inf scores' reader
    _, ctx = run_step(Quantize, {"input": "model", "calibration": "calibrate", "mode": "static"},
                      {"input": model, "calibration": tmp_path / "out" / "calibrate" / "calibration.json"},
                      tmp_path, "quantize")
    assert ctx.metrics["infinite_fill_nodes"] == ["/Where", "/Softmax"]  # kept float: the mask stays -inf
    feeds = attention_feeds(4, 9)
    want, got = (ort.InferenceSession(str(m), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
                 for m in (model, ctx.out_dir / "model.onnx"))
    assert float(np.dot(want.ravel(), got.ravel()) / np.linalg.norm(want) / np.linalg.norm(got)) > 0.999


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_a_histogram_method_on_an_infinite_mask_says_to_use_minmax(tmp_path, method):
    np.savez(tmp_path / "calib.npz", x=data(8))
    with pytest.raises(StepError, match=r"is not finite; a tensor holds infinity .*use method = 'minmax'"):
        calibrate(tmp_path, make_masked_attention(tmp_path / "masked.onnx"), data="calib.npz", method=method)


@pytest.mark.filterwarnings("ignore:All-NaN axis encountered:RuntimeWarning")
def test_nan_fails_calibration(tmp_path):
    """onnxruntime's minmax skips NaN ('masked' gets the range of its numbers); a tensor of
    NaN only ('y', the Softmax of rows with NaN) fails."""
    model = make_masked_attention(tmp_path / "nan.onnx", mask_value=np.nan)
    np.savez(tmp_path / "calib.npz", x=data(8))
    with pytest.raises(StepError, match=r"tensor 'y' has a range \[nan, nan\]: the model produces NaN"):
        calibrate(tmp_path, model, data="calib.npz")


# --- bad data: one clear error per class ----------------------------------------------------------
EXPECTED = "float32 [batch, 4]"


@pytest.mark.parametrize("case, arrays, words", [
    ("wrong dtype", {"x": np.zeros((8, 4), np.float64)}, ["'x'", EXPECTED, "float64", ".astype('float32')"]),
    ("wrong static dim", {"x": np.zeros((8, 5), np.float32)}, ["'x'", EXPECTED, "dimension 1 is 5, expected 4"]),
    ("wrong rank", {"x": np.zeros((8,), np.float32)}, ["'x'", EXPECTED, "shape (8,)"]),
    ("missing input", {"image": np.zeros((8, 4), np.float32)}, ["no array for input 'x'", EXPECTED, "'image'"]),
    ("unknown input", {"x": np.zeros((8, 4), np.float32), "extra": np.zeros(3, np.float32)},
     ["unknown inputs ['extra']", "x: " + EXPECTED]),
    ("empty set", {"x": np.zeros((0, 4), np.float32)}, ["no samples", "x: " + EXPECTED]),
])
def test_bad_npz_data_is_a_clear_error(tmp_path, mlp, case, arrays, words):
    np.savez(tmp_path / "calib.npz", **arrays)
    with pytest.raises(StepError) as info:
        calibrate(tmp_path, mlp, data="calib.npz")
    message = str(info.value)
    for word in words:
        assert word in message, (case, message)


BAD_CALLABLES = """\
import numpy as np

def float64():
    yield {"x": np.zeros((1, 4))}

def shape():
    yield {"x": np.zeros((1, 4), np.float32)}
    yield {"x": np.zeros((2, 3), np.float32)}

def missing():
    yield {"a": np.zeros((1, 4), np.float32)}

def nothing():
    return []

def not_dicts():
    yield np.zeros((1, 4), np.float32)

def raises():
    raise RuntimeError("no data today")
"""


@pytest.mark.parametrize("name, words", [
    ("float64", ["'x'", EXPECTED, "sample 0", "float64"]),
    ("shape", ["'x'", EXPECTED, "sample 1", "(2, 3)"]),
    ("missing", ["no value for input 'x'", EXPECTED, "sample 0"]),
    ("nothing", ["no samples", "x: " + EXPECTED]),
    ("not_dicts", ["yielded 'ndarray'", "x: " + EXPECTED]),
    ("raises", ["RuntimeError", "no data today"]),
])
def test_bad_callable_data_is_a_clear_error(tmp_path, mlp, name, words):
    (tmp_path / "bad.py").write_text(BAD_CALLABLES)
    with pytest.raises(StepError) as info:
        calibrate(tmp_path, mlp, data=f"bad.py:{name}")
    for word in words:
        assert word in str(info.value), str(info.value)


def test_bad_folder_data_is_a_clear_error(tmp_path, mlp):
    (tmp_path / "empty").mkdir()
    with pytest.raises(StepError, match=r"no '<name>.npy' file or '<name>/' folder for input 'x' \(expected float32 \[batch, 4\]\)"):
        calibrate(tmp_path, mlp, name="c1", data="empty")
    (tmp_path / "samples" / "x").mkdir(parents=True)
    np.save(tmp_path / "samples" / "x" / "0.npy", np.zeros(4, np.float32))
    np.save(tmp_path / "samples" / "x" / "1.npy", np.zeros(4, np.int32))
    with pytest.raises(StepError, match=r"input 'x' expects float32 \[batch, 4\]; samples/x/1.npy has dtype int32"):
        calibrate(tmp_path, mlp, name="c2", data="samples")
    with pytest.raises(StepError, match="data not found"):
        calibrate(tmp_path, mlp, name="c3", data="nowhere")


def test_inputs_with_different_sample_counts(tmp_path):
    model = make_two_inputs(tmp_path / "two.onnx")
    np.savez(tmp_path / "calib.npz", a=np.zeros((4, 4), np.float32), ids=np.zeros((3, 2), np.int64))
    with pytest.raises(StepError, match=r"different sample counts \(a: 4, ids: 3\)"):
        calibrate(tmp_path, model, name="c1", data="calib.npz")
    np.savez(tmp_path / "calib.npz", a=np.zeros((4, 4), np.float32), ids=np.zeros((4, 2), np.int32))
    with pytest.raises(StepError, match=r"input 'ids' expects int64 \[batch, 2\].* has dtype int32"):
        calibrate(tmp_path, model, name="c2", data="calib.npz")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", a=rng.standard_normal((4, 4)).astype(np.float32),
             ids=rng.integers(0, 10, (4, 2)))
    table = calibrate(tmp_path, model, name="c3", data="calib.npz")
    assert "ids" not in table["tensors"] and "a" in table["tensors"]  # integer tensors have no range


# --- parameters, checked when the recipe loads ----------------------------------------------------
@pytest.mark.parametrize("params, words", [
    ({"data": "x.npy"}, "single .npy file"),
    ({"data": "calib.py"}, "no callable"),
    ({"data": "model.onnx"}, "not calibration data"),
    ({"data": "calib.npz", "percentile": 99.0}, "'percentile' only apply to method 'percentile'"),
    ({"data": "calib.npz", "num_bins": 512}, "'num_bins' only applies"),
    ({"data": "calib.npz", "method": "entropy", "num_bins": 64}, "num_bins >= num_quantized_bins"),
    ({"data": "calib.npz", "data_args": {"seed": 1}}, "'data_args' only apply"),
    ({"data": "calib.npz", "method": "kl"}, "minmax"),
    ({"data": "calib.npz", "samples": 0}, "greater than or equal to 1"),
    ({"data": "calib.npz", "bins": 3}, "Extra inputs"),
])
def test_params_are_validated(params, words):
    with pytest.raises(ValidationError, match=words):
        CalibrateParams.model_validate({"input": "simplify", **params})


def test_params_survive_the_workers_round_trip():
    """The worker re-validates a full dump: method-specific checks must accept their defaults."""
    for raw in ({"method": "minmax"}, {"method": "entropy", "num_bins": 512}, {"method": "percentile"}):
        params = CalibrateParams.model_validate({"input": "s", "data": "c.npz", **raw})
        assert CalibrateParams.model_validate(params.model_dump(mode="json")) == params


def test_key_files_cover_the_data(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "shapes.py").write_text("SIZE = 4\n")
    (tmp_path / "models" / "calib.py").write_text("from shapes import SIZE\n\ndef feeds():\n    return []\n")
    (tmp_path / "folder" / "x").mkdir(parents=True)
    for name in ("folder/x/0.npy", "folder/x/1.npy", "folder/notes.txt"):
        (tmp_path / name).write_bytes(b"")

    def files(data: str) -> list[str]:
        step = Calibrate(CalibrateParams(input="s", data=data), tmp_path, tmp_path)
        return [p.relative_to(tmp_path).as_posix() for p in step.key_files()]

    assert files("models/calib.py:feeds") == ["models/calib.py", "models/shapes.py"]
    assert files("folder") == ["folder/x/0.npy", "folder/x/1.npy"]
    assert files("calib.npz") == ["calib.npz"]
    step = Calibrate(CalibrateParams(input="s", data="calib.npz"), tmp_path, tmp_path)
    assert step.host_key(Fingerprint({"cpu.arch": "x86_64"})) == {}
    assert {"onnx", "onnxruntime", "numpy"} <= set(step.tool_names())


def test_read_table_rejects_what_is_not_a_table(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"version": 1, "passed": True}))
    with pytest.raises(StepError, match="is not a calibrate step"):
        read_table(path, "cnn:verify")
    path.write_text(json.dumps({"format": "optbuild.calibration", "version": 99, "method": "minmax", "tensors": {}}))
    with pytest.raises(StepError, match="version 99 is not supported"):
        read_table(path, "cnn:calibrate")
    path.write_text(json.dumps({"format": "optbuild.calibration", "version": 1, "method": "minmax",
                                "tensors": {"x": [0.0]}}))
    with pytest.raises(StepError, match="malformed"):
        read_table(path, "cnn:calibrate")


def test_calibration_says_which_sample_it_is_on(tmp_path, mlp):
    """What the build shows beside a running calibrate step: the sample it is on, of how
    many (the last message: the last sample)."""
    from optbuild.steps.base import Artifact, StepContext

    np.savez(tmp_path / "calib.npz", x=data(12))
    step = Calibrate(CalibrateParams.model_validate({"input": "model", "data": "calib.npz"}), tmp_path, tmp_path)
    (tmp_path / "out").mkdir()
    ctx = StepContext(step_id="t:calibrate", base_dir=tmp_path, project_root=tmp_path, out_dir=tmp_path / "out",
                      inputs={"input": Artifact(step="t:model", dir=mlp.parent, files={mlp.name: mlp}, primary=mlp)},
                      host=Fingerprint(), progress_file=tmp_path / "progress")
    step.run(ctx)
    assert (tmp_path / "progress").read_text() == "calibrating sample 12 of 12"
    assert sorted(p.name for p in tmp_path.iterdir() if "progress" in p.name) == ["progress"]  # no part left
