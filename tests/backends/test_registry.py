"""The backend layer: what runs an artifact (by its engine.json, else by suffix), what a step's
output will run on before it is built, and the onnxruntime runner behind the Runner contract."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from plugins.models import make_mlp
from plugins.trt import matmul_relu

from optbuild.backends import registry
from optbuild.backends.base import Backend, TensorSpec
from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint

pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[2]
NO_GPU = Fingerprint({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVIDIA driver not loaded)",
                      "cpu.arch": "x86_64", "cpu.flags": "avx2"})


def test_every_builtin_backend_is_a_backend_with_a_name_it_is_registered_under():
    for name in registry.BUILTIN:
        backend = registry.get(name)
        assert isinstance(backend, Backend) and backend.name == name
        assert backend.label and backend.short and backend.extra
        assert all(isinstance(d, str) and d for d in backend.distributions())


def test_an_unknown_backend_is_named_with_the_known_ones():
    with pytest.raises(KeyError, match=r"no backend 'tensorflow' \(known: .*onnxruntime.*tensorrt"):
        registry.get("tensorflow")


def test_a_plain_model_runs_on_onnxruntime_by_its_suffix(tmp_path):
    model = make_mlp(tmp_path / "m.onnx")
    backend, manifest = registry.for_artifact(model, "the model")
    assert backend.name == "onnxruntime" and manifest == {"backend": "onnxruntime"}
    assert registry.by_suffix(".ort").name == "onnxruntime"
    assert registry.by_suffix(".engine") is None


def test_an_engine_runs_on_the_backend_its_manifest_names(tmp_path):
    (tmp_path / "model.engine").write_bytes(b"plan")
    (tmp_path / "engine.json").write_text(json.dumps({"backend": "tensorrt-rtx", "targets": ["sm89"]}))
    backend, manifest = registry.for_artifact(tmp_path / "model.engine", "the candidate r:rtx")
    assert backend.name == "tensorrt-rtx" and manifest["targets"] == ["sm89"]
    assert backend.host_fields(manifest) == ("gpu.0.compute_capability", "gpu.0.name")
    assert backend.unavailable(NO_GPU, manifest).startswith(
        "needs an NVIDIA GPU to run the TensorRT-RTX engine (here: NVIDIA driver not loaded)")


@pytest.mark.parametrize(("manifest", "message"), [
    ('{"backend": "tensorflow"}', (r"the candidate r:e is an engine of backend 'tensorflow', which no installed "
                                  r"backend runs \(they are .*onnxruntime")),
    ("{not json", r"the candidate r:e: .*engine.json: unreadable engine.json \(.* is not JSON"),
    ('{"targets": []}', r"the candidate r:e: .*engine.json: not an engine.json .*\(field backend: Field required\)"),
    (None, (r"the candidate r:e gives model.engine with no engine.json beside it to say which backend runs it "
           r"\(without one, the backends run .*\.onnx, \.ort")),
])
def test_what_no_backend_runs_is_refused_naming_the_artifact(tmp_path, manifest, message):
    (tmp_path / "model.engine").write_bytes(b"plan")
    if manifest is not None:
        (tmp_path / "engine.json").write_text(manifest)
    with pytest.raises(StepError, match=message):
        registry.for_artifact(tmp_path / "model.engine", "the candidate r:e")


def test_a_step_says_what_will_run_its_output_before_it_is_built():
    from optbuild.steps.engine_trt import TensorRTRTXEngine
    from optbuild.steps.simplify import Simplify
    from optbuild.steps.verify import Verify

    simplify = Simplify(Simplify.Params.model_validate({"input": "export"}), Path("."), Path("."))
    assert registry.for_step(simplify)[0].name == "onnxruntime"
    rtx = TensorRTRTXEngine(TensorRTRTXEngine.Params.model_validate(
        {"backend": "tensorrt-rtx", "input": "simplify", "targets": ["8.9"]}), Path("."), Path("."))
    backend, manifest = registry.for_step(rtx)
    assert backend.name == "tensorrt-rtx" and manifest["targets"] == ["sm89"]
    verify = Verify(Verify.Params.model_validate({"reference": "a", "candidate": "b", "max_abs": 1.0}),
                    Path("."), Path("."))
    assert registry.for_step(verify) is None  # a report, not a model


def test_the_onnxruntime_runner_describes_loads_and_infers(tmp_path):
    model = make_mlp(tmp_path / "m.onnx")
    backend, manifest = registry.for_artifact(model, "the model")
    runner = backend.open(model, manifest, NO_GPU, threads=1)
    assert runner.load_ms == 0.0  # not loaded until entered
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with runner:
        assert runner.load_ms > 0 and runner.label.startswith("onnxruntime ") and runner.label.endswith("(CPU)")
        assert runner.input_specs() == [TensorSpec("x", "float32", ("batch", 4))]
        assert runner.output_names() == ["y"]
        literal = backend.open(model, manifest, NO_GPU, literal=True)
        with literal:
            np.testing.assert_allclose(runner.infer({"x": x})["y"], literal.infer({"x": x})["y"], rtol=1e-6)
    assert runner.session is None  # freed on leaving the block


def test_a_float16_model_gets_its_float_inputs_cast(tmp_path):
    model = matmul_relu(tmp_path / "half.onnx", fp16=True)
    backend, manifest = registry.for_artifact(model, "the model")
    with backend.open(model, manifest, NO_GPU) as runner:
        feed = runner.cast({"x": np.ones((2, 16), np.float32)})
        assert feed["x"].dtype == np.float16
        assert runner.infer(feed)["y"].dtype == np.float16


BACKEND_NAMES = {"onnxruntime", "tensorrt", "tensorrt-rtx", "openvino", "engine/tensorrt", "engine/onnxruntime",
                 "engine/tensorrt-rtx", "engine/openvino", ".engine", ".xml"}


@pytest.mark.parametrize("module", ["optbuild/steps/verify.py", "optbuild/model/runmodels.py",
                                    *sorted(str(p.relative_to(REPO)) for folder in ("optbuild/app/bench", "optbuild/cli/bench")
                                            for p in (REPO / folder).glob("*.py"))])
def test_verify_and_bench_name_no_backend(module):
    """They get what runs an artifact from the registry; a new backend needs no edit there.
    (Messages and docs may mention backends; code that tells one apart spells its name.)"""
    tree = ast.parse((REPO / module).read_text())
    named = [(node.lineno, node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in BACKEND_NAMES]
    imports = [(node.lineno, node.module) for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("optbuild.backends.")
               and node.module not in ("optbuild.backends.base", "optbuild.backends.registry")]
    assert named == [] and imports == []
