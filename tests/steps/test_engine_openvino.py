"""kind = "engine", backend = "openvino": ONNX -> OpenVINO IR (fp32, fp16 weights, NNCF INT8),
checked against onnxruntime, run through the openvino backend's runner."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from optbuild.backends.openvino import loader
from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint

loader.block_telemetry()  # before openvino is first imported: a plain import writes ~/intel/
ov = pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import graph_model, make_convnet, save, value
from plugins.steps import run_step

from optbuild.backends import registry
from optbuild.steps.engine_ov import OpenVINOEngine, OpenVINOEngineParams

SHAPE = (8, 16, 16)  # make_convnet's input, batch aside


@pytest.fixture
def convnet(tmp_path: Path) -> Path:
    return make_convnet(tmp_path / "convnet.onnx")


@pytest.fixture
def calib(tmp_path: Path) -> str:
    """32 samples of x, N(0, 1), stacked along a sample axis."""
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((32, 1, *SHAPE)).astype(np.float32))
    return "calib.npz"


def engine(tmp_path: Path, model: Path, name: str = "engine", **params):
    return run_step(OpenVINOEngine, {"backend": "openvino", "input": "m", **params}, {"input": model},
                    tmp_path, name)


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def run_ir(ctx, x: np.ndarray, threads: int | None = 1) -> tuple[np.ndarray, str]:
    """The IR of a finished step, opened as verify and bench open it: through the backend
    registry, from its engine.json."""
    model = ctx.out_dir / "model.xml"
    backend, manifest = registry.for_artifact(model, "the engine")
    assert backend.name == "openvino"
    with backend.open(model, manifest, Fingerprint(), threads=threads) as runner:
        return runner.infer({"x": x})["y"], runner.label


def test_fp32_ir_agrees_with_onnxruntime(tmp_path, convnet):
    step, ctx = engine(tmp_path, convnet, "fp32")
    assert step.primary_output == "model.xml"
    assert {p.name for p in ctx.out_dir.iterdir()} == {"model.xml", "model.bin", "engine.json"}
    manifest = json.loads((ctx.out_dir / "engine.json").read_text())
    assert manifest["backend"] == "openvino" and manifest["precision"] == "fp32"
    assert manifest["hint"] == "latency" and manifest["inference_precision"] == "f32"
    assert manifest["openvino_version"] == ov.get_version()
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, *SHAPE]}]
    assert manifest["outputs"] == [{"name": "y", "dtype": "float32", "shape": [None, 16, 16, 16]}]
    assert ctx.metrics["checks"] == 3 and ctx.metrics["max_rel_error"] <= 1e-5

    x = np.random.default_rng(7).standard_normal((2, *SHAPE)).astype(np.float32)
    got, label = run_ir(ctx, x)
    assert label.startswith("OpenVINO ") and label.endswith("(CPU, latency, f32)")  # f32 on any CPU
    expected = reference(convnet, x)
    assert cosine(got, expected) > 0.99999
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def test_fp16_halves_the_weights_and_stays_close(tmp_path, convnet):
    _, fp32 = engine(tmp_path, convnet, "fp32")
    _, fp16 = engine(tmp_path, convnet, "fp16", precision="fp16")
    size32 = (fp32.out_dir / "model.bin").stat().st_size
    size16 = (fp16.out_dir / "model.bin").stat().st_size
    assert size16 <= size32 * 0.55
    manifest = json.loads((fp16.out_dir / "engine.json").read_text())
    assert manifest["precision"] == "fp16" and "inference_precision" not in manifest
    assert 0 < fp16.metrics["max_rel_error"] <= 1e-2

    x = np.random.default_rng(8).standard_normal((1, *SHAPE)).astype(np.float32)
    got, label = run_ir(fp16, x)
    assert cosine(got, reference(convnet, x)) > 0.9999  # also at bf16, the default of CPUs that have it
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    assert label.endswith(f", {default})")


def test_int8_quantizes_with_nncf_and_stays_close(tmp_path, convnet, calib):
    pytest.importorskip("nncf")
    step, ctx = engine(tmp_path, convnet, "int8", precision="int8", calibration=calib, samples=16)
    assert step.tool_names() == ("openvino", "nncf", "numpy")
    assert tmp_path / "calib.npz" in step.key_files()
    assert ctx.metrics["fake_quantize"] >= 2  # activations and weights of the convolutions
    assert ctx.metrics["calibration_samples"] == 16
    assert ctx.metrics["checks"] == 3 and 0.99 <= ctx.metrics["cosine"] < 1
    manifest = json.loads((ctx.out_dir / "engine.json").read_text())
    assert manifest["precision"] == "int8" and manifest["preset"] == "performance"
    assert manifest["calibration_samples"] == 16 and manifest["nncf_version"]
    ir = ov.Core().read_model(str(ctx.out_dir / "model.xml"))
    assert ir.get_rt_info(["optbuild", "precision"]).astype(str) == "int8"

    x = np.random.default_rng(9).standard_normal((4, *SHAPE)).astype(np.float32)  # not calibration data
    got, _ = run_ir(ctx, x)
    assert cosine(got, reference(convnet, x)) > 0.98


def test_int8_calibration_from_a_data_callable_with_arguments(tmp_path, convnet):
    pytest.importorskip("nncf")
    (tmp_path / "data.py").write_text(textwrap.dedent("""
        import numpy as np

        def images(count, seed=0):
            rng = np.random.default_rng(seed)
            for _ in range(count):
                yield {"x": rng.standard_normal((8, 16, 16)).astype(np.float32)}
    """))
    step, ctx = engine(tmp_path, convnet, "int8c", precision="int8", calibration="data.py:images",
                       calibration_args={"count": 8, "seed": 3}, preset="mixed", check=2)
    assert [(c.field, c.keywords, c.keywords_field) for c in step.calls()] == [
        ("calibration", ("count", "seed"), "calibration_args")]
    assert tmp_path / "data.py" in step.key_files()
    assert ctx.metrics["calibration_samples"] == 8 and ctx.metrics["checks"] == 2
    assert json.loads((ctx.out_dir / "engine.json").read_text())["preset"] == "mixed"


def make_attention(path: Path) -> Path:
    """A transformer-like block: x [batch, 6, 16] -> MatMul "q" -> LayerNormalization "ln" ->
    Softmax "sm" -> MatMul "mix" (by x) -> Gemm "head" (with a bias) -> y [batch, 6, 4]."""
    rng = np.random.default_rng(2)
    init = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("wq", rng.standard_normal((16, 6)) * 0.5), ("scale", np.ones(6)), ("bias", np.zeros(6)),
        ("wh", rng.standard_normal((16, 4)) * 0.3), ("bh", rng.standard_normal(4) * 0.1))]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("LayerNormalization", ["q", "scale", "bias"], ["n"], name="ln", axis=-1),
             helper.make_node("Softmax", ["n"], ["s"], name="sm", axis=-1),
             helper.make_node("MatMul", ["s", "x"], ["m"], name="mix"),
             helper.make_node("Reshape", ["m", "flat"], ["mf"], name="flatten"),
             helper.make_node("Gemm", ["mf", "wh", "bh"], ["yf"], name="head"),
             helper.make_node("Reshape", ["yf", "shape"], ["y"], name="unflatten")]
    init += [numpy_helper.from_array(np.array([-1, 16], np.int64), "flat"),
             numpy_helper.from_array(np.array([-1, 6, 4], np.int64), "shape")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, 4])], init)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def attention(tmp_path: Path) -> tuple[Path, str]:
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "tokens.npz", x=rng.standard_normal((16, 1, 6, 16)).astype(np.float32))
    return make_attention(tmp_path / "attention.onnx"), "tokens.npz"


def float_weights(ir: Path, op_name: str) -> bool:
    """Whether the op ``op_name`` of an IR takes its weights as a float constant (not
    quantized: no FakeQuantize nor int8 constant upstream)."""
    ops = {op.get_friendly_name(): op for op in ov.Core().read_model(str(ir)).get_ops()}
    seen, todo = set(), [ops[op_name]]
    while todo:
        op = todo.pop()
        for port in op.inputs():
            source = port.get_source_output().get_node()
            kind = source.get_type_name()
            if kind == "FakeQuantize" or (kind == "Constant" and source.get_element_type().get_type_name() in ("i8", "u8")):
                return False
            if kind in ("Convert", "Multiply", "Subtract", "Reshape", "Transpose") and source not in seen:
                seen.add(source)
                todo.append(source)
    return True


def test_int8_for_transformers_with_an_ignored_scope(tmp_path, attention, capsys):
    """model_type, smooth_quant_alpha, overflow_fix and ignored_scope reach NNCF, enter the key
    and engine.json; the ignored Gemm (the MatMul "head/WithoutBiases" in OpenVINO) stays float."""
    pytest.importorskip("nncf")
    model, calib = attention
    common = {"precision": "int8", "calibration": calib, "check": 2, "model_type": "transformer",
              "min_cosine": 0.95}  # a random toy: 0.98 at INT8
    _, plain = engine(tmp_path, model, "plain", **common)
    step, ctx = engine(tmp_path, model, "scoped", **common, smooth_quant_alpha=0.5, overflow_fix="enable",
                       ignored_scope={"names": ["head/WithoutBiases"], "patterns": ["mi"], "types": ["Softmax"]})
    manifest = json.loads((ctx.out_dir / "engine.json").read_text())
    assert manifest["model_type"] == "transformer" and manifest["preset"] == "mixed"  # NNCF's default for them
    assert manifest["smooth_quant_alpha"] == 0.5 and manifest["overflow_fix"] == "enable"
    assert manifest["ignored_ops"] == ["head/WithoutBiases", "sm", "mix"]
    assert ctx.metrics["ignored_ops"] == 3 and 0.95 <= ctx.metrics["cosine"]
    assert not float_weights(plain.out_dir / "model.xml", "head/WithoutBiases")
    assert float_weights(ctx.out_dir / "model.xml", "head/WithoutBiases")
    assert ctx.metrics["fake_quantize"] < plain.metrics["fake_quantize"]
    log = capsys.readouterr().err
    assert "ignored_scope keeps 3 ops float: head/WithoutBiases, sm, mix" in log
    assert "(preset mixed, model type transformer, SmoothQuant alpha 0.5, overflow fix enable)" in log

    from optbuild.builder.keys import key_params

    params = key_params(step.params)
    assert params["ignored_scope"] == {"names": ["head/WithoutBiases"], "types": ["Softmax"], "patterns": ["mi"]}
    assert params["model_type"] == "transformer" and params["smooth_quant_alpha"] == 0.5
    _, no_sq = engine(tmp_path, model, "nosq", **common, smooth_quant_alpha=-1)
    assert (no_sq.out_dir / "model.bin").read_bytes() != (plain.out_dir / "model.bin").read_bytes()


def test_an_ignored_scope_that_matches_nothing_is_named(tmp_path, attention):
    pytest.importorskip("nncf")
    model, calib = attention
    with pytest.raises(StepError) as info:
        engine(tmp_path, model, "nomatch", precision="int8", calibration=calib, model_type="transformer",
               ignored_scope={"names": ["hed/WithoutBiases", "q"], "types": ["Gemm", "Softmax"],
                              "patterns": ["/head/"]})
    text = str(info.value)
    assert text.startswith("ignored_scope: name 'hed/WithoutBiases' (close: 'head/WithoutBiases'); type 'Gemm' "
                           "(close: 'MatMul'); pattern '/head/' match no op of t:input-of-nomatch as OpenVINO "
                           "converted it")
    assert "'q'" not in text and "'Softmax'" not in text  # those match
    assert "its op types here: Add, MVN, MatMul, Reshape, Softmax)" in text


def test_naming_the_onnx_gemm_warns_that_its_matmul_is_another_op(tmp_path, attention, capsys):
    pytest.importorskip("nncf")
    model, calib = attention
    _, ctx = engine(tmp_path, model, "gemm", precision="int8", calibration=calib, model_type="transformer",
                    min_cosine=0.9, check=1, ignored_scope={"names": ["head"]})
    assert json.loads((ctx.out_dir / "engine.json").read_text())["ignored_ops"] == ["head"]
    assert ("warning: ignored_scope name 'head' is the bias Add of the Gemm 'head' of t:input-of-gemm, which NNCF "
            "does not quantize anyway; its MatMul is 'head/WithoutBiases'") in capsys.readouterr().err


def test_declared_shapes_become_the_ir_shapes(tmp_path, convnet):
    _, ctx = engine(tmp_path, convnet, "static", inputs={"x": {"shape": [2, *SHAPE]}})
    manifest = json.loads((ctx.out_dir / "engine.json").read_text())
    assert manifest["inputs"][0]["shape"] == [2, *SHAPE]
    backend, manifest = registry.for_artifact(ctx.out_dir / "model.xml", "the engine")
    assert backend.unfit(manifest, {"x": np.zeros((2, *SHAPE), np.float32)}) is None
    assert "(dimension 0)" in backend.unfit(manifest, {"x": np.zeros((1, *SHAPE), np.float32)})
    _, ctx = engine(tmp_path, convnet, "bounded", inputs={"x": {"shape": [[1, 2, 4], *SHAPE]}})
    assert json.loads((ctx.out_dir / "engine.json").read_text())["inputs"][0]["shape"] == [[1, 4], *SHAPE]
    backend, manifest = registry.for_artifact(ctx.out_dir / "model.xml", "the engine")
    assert backend.unfit(manifest, {"x": np.zeros((4, *SHAPE), np.float32)}) is None
    assert backend.unfit(manifest, {"x": np.zeros((5, *SHAPE), np.float32)}) == (
        "input 'x' takes [1..4,8,16,16], the feed has shape [5, 8, 16, 16] (dimension 0)")
    _, ctx = engine(tmp_path, convnet, "dynamic")
    backend, manifest = registry.for_artifact(ctx.out_dir / "model.xml", "the engine")
    assert backend.unfit(manifest, {"x": np.zeros((64, *SHAPE), np.float32)}) is None
    assert "(dimension 2)" in backend.unfit(manifest, {"x": np.zeros((1, 8, 15, 16), np.float32)})
    with pytest.raises(StepError, match=r"inputs\.x: dim 1 is fixed at 8"):
        engine(tmp_path, convnet, "wrong", inputs={"x": {"shape": [1, 3, 16, 16]}})


def test_the_hint_is_stored_in_the_ir_and_applied_by_the_runner(tmp_path, convnet):
    _, ctx = engine(tmp_path, convnet, "tput", hint="throughput", check=0)
    assert ctx.metrics["checks"] == 0
    model = ctx.out_dir / "model.xml"
    assert ov.Core().read_model(str(model)).get_rt_info(["optbuild", "hint"]).astype(str) == "throughput"
    backend, manifest = registry.for_artifact(model, "the engine")
    with backend.open(model, manifest, Fingerprint()) as runner:
        assert runner.hint == "throughput"
        assert str(runner.compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
    (ctx.out_dir / "engine.json").unlink()  # a bare IR: the hint comes from its rt_info
    backend, manifest = registry.for_artifact(model, "the engine")
    assert backend.name == "openvino" and manifest == {"backend": "openvino"}
    with backend.open(model, manifest, Fingerprint()) as runner:
        assert runner.hint == "throughput"
        assert runner.inference_precision == "f32"  # from the rt_info's precision fp32


def test_a_too_strict_tolerance_fails_the_check(tmp_path, convnet):
    with pytest.raises(StepError, match=r"fp16 OpenVINO IR disagrees with t:input-of-strict .*tolerance 1e-07"):
        engine(tmp_path, convnet, "strict", precision="fp16", tolerance=1e-7, atol=0)


def test_int8_below_min_cosine_fails_the_check(tmp_path, convnet, calib):
    pytest.importorskip("nncf")
    with pytest.raises(StepError, match=r"int8 OpenVINO IR disagrees with t:input-of-cos: output 'y' has "
                                        r"cosine similarity 0\.99\d+ over 2 calibration samples, below "
                                        r"min_cosine 0\.99999"):
        engine(tmp_path, convnet, "cos", precision="int8", calibration=calib, samples=8, check=2,
               min_cosine=0.99999)


def test_a_corrupt_model_fails_clearly(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"this is not an onnx model\n")
    with pytest.raises(StepError, match=r"bad\.onnx, which OpenVINO's ONNX reader does not recognize"):
        engine(tmp_path, tmp_path / "bad.onnx", "corrupt")


def test_an_op_openvino_cannot_convert_is_named(tmp_path):
    model = graph_model(tmp_path / "custom.onnx",
                        [helper.make_node("Relu", ["x"], ["r"]),
                         helper.make_node("FancyOp", ["r"], ["y"], domain="com.example", name="fancy")],
                        [value("x", [1, 4])], [value("y", [1, 4])],
                        opsets=(("", 17), ("com.example", 1)))
    with pytest.raises(StepError, match=r"cannot convert the model of t:input-of-custom: OpenVINO has no "
                                        r"conversion rule for com\.example\.FancyOp"):
        engine(tmp_path, model, "custom")


def test_params(tmp_path):
    base = {"backend": "openvino", "input": "m"}
    with pytest.raises(ValidationError, match="precision 'int8' needs calibration data"):
        OpenVINOEngineParams.model_validate({**base, "precision": "int8"})
    with pytest.raises(ValidationError, match="'preset' only apply to precision 'int8'"):
        OpenVINOEngineParams.model_validate({**base, "preset": "mixed"})
    with pytest.raises(ValidationError, match="'calibration_args' only apply to a 'file.py:callable'"):
        OpenVINOEngineParams.model_validate({**base, "precision": "int8", "calibration": "c.npz",
                                             "calibration_args": {"n": 1}})
    with pytest.raises(ValidationError, match="single .npy file"):
        OpenVINOEngineParams.model_validate({**base, "precision": "int8", "calibration": "x.npy"})
    with pytest.raises(ValidationError):
        OpenVINOEngineParams.model_validate({**base, "hint": "cumulative_throughput"})
    int8 = {**base, "precision": "int8", "calibration": "c.npz"}
    with pytest.raises(ValidationError, match="'model_type', 'ignored_scope' only apply to precision 'int8'"):
        OpenVINOEngineParams.model_validate({**base, "model_type": "transformer", "ignored_scope": {"types": ["MVN"]}})
    with pytest.raises(ValidationError, match="'smooth_quant_alpha' only applies with model_type 'transformer'"):
        OpenVINOEngineParams.model_validate({**int8, "smooth_quant_alpha": 0.5})
    with pytest.raises(ValidationError, match=r"smooth_quant_alpha is 1\.5: give a number in \[0, 1\], or -1"):
        OpenVINOEngineParams.model_validate({**int8, "model_type": "transformer", "smooth_quant_alpha": 1.5})
    with pytest.raises(ValidationError, match="ignored_scope names no op"):
        OpenVINOEngineParams.model_validate({**int8, "ignored_scope": {"names": []}})
    with pytest.raises(ValidationError, match=r"'\(' is not a regular expression"):
        OpenVINOEngineParams.model_validate({**int8, "ignored_scope": {"patterns": ["("]}})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        OpenVINOEngineParams.model_validate({**int8, "ignored_scope": {"name": ["x"]}})
    with pytest.raises(ValidationError):
        OpenVINOEngineParams.model_validate({**int8, "model_type": "cnn"})
    with pytest.raises(ValidationError):
        OpenVINOEngineParams.model_validate({**int8, "overflow_fix": "always"})
    params = OpenVINOEngineParams.model_validate({**int8, "model_type": "transformer"})
    assert params.preset is None and params.resolved_preset() == "mixed"
    assert OpenVINOEngineParams.model_validate(int8).resolved_preset() == "performance"


def test_unavailable_says_what_to_install(tmp_path, monkeypatch):
    def step(**params):
        return OpenVINOEngine(OpenVINOEngineParams.model_validate({"backend": "openvino", "input": "m", **params}),
                              tmp_path, tmp_path)

    assert step().unavailable(Fingerprint()) is None
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "nncf", None)
    assert step().unavailable(Fingerprint()) == (
        "needs OpenVINO's Python module 'openvino' (pip install 'optbuild[openvino]')")
    message = step(precision="int8", calibration="c.npz").unavailable(Fingerprint())
    assert "NNCF's Python module 'nncf' (pip install 'optbuild[openvino]')" in message
    assert registry.get("openvino").unavailable(Fingerprint(), {"backend": "openvino"}).startswith("needs OpenVINO")


def test_the_key_follows_precision_and_not_the_host(tmp_path):
    def step(**params):
        return OpenVINOEngine(OpenVINOEngineParams.model_validate({"backend": "openvino", "input": "m", **params}),
                              tmp_path, tmp_path)

    from optbuild.builder.keys import key_params

    fp32, fp16 = step(), step(precision="fp16")
    int8 = step(precision="int8", calibration="calib.npz")
    assert len({json.dumps(key_params(s.params), sort_keys=True) for s in (fp32, fp16, int8)}) == 3
    assert fp32.tool_names() == fp16.tool_names() == ("openvino",)
    assert "nncf" in int8.tool_names()
    assert int8.key_files() == [tmp_path / "calib.npz"]
    assert fp32.host_key(Fingerprint()) == {} and int8.host_key(Fingerprint()) == {}
    assert fp32.runs_on() == {"backend": "openvino", "precision": "fp32", "hint": "latency",
                              "inference_precision": "f32"}
    backend = registry.get("openvino")
    assert backend.host_fields(int8.runs_on()) == ("cpu.arch", "cpu.flags")  # running it depends on the CPU


def test_importing_the_step_and_backend_imports_no_runtime():
    code = ("import sys, optbuild.steps.engine_ov, optbuild.backends.openvino; "
            "from optbuild.backends import registry; registry.get('openvino'); "
            "print(sorted(m for m in ('openvino', 'nncf', 'numpy', 'onnxruntime', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


RECIPE = """\
[steps.src]
kind = "onnx"
path = "../models/convnet.onnx"

[steps.ov]
kind = "engine"
backend = "openvino"
input = "src"
precision = "{precision}"
check = 1
"""


def test_a_project_build_rebuilds_the_ir_when_precision_changes(tmp_path):
    from plugins.projects import ProjectDir

    proj = ProjectDir(tmp_path / "proj")
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[build]\njobs = 1\n')
    make_convnet(proj.root / "models" / "convnet.onnx")
    proj.write("recipes/m.toml", RECIPE.format(precision="fp32"))
    result = proj.build()
    assert result.ok and sorted(result.steps("built")) == ["m:ov", "m:src"]
    assert (proj.root / "build" / "m" / "ov" / "model.xml").is_file()
    assert proj.build().steps("built") == []
    proj.write("recipes/m.toml", RECIPE.format(precision="fp16"))
    result = proj.build()
    assert result.steps("built") == ["m:ov"] and result.steps("cached") == ["m:src"]
    manifest = json.loads((proj.root / "build" / "m" / "ov" / "engine.json").read_text())
    assert manifest["precision"] == "fp16"
