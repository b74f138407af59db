"""An onnxruntime execution provider is one entry of backends/onnxruntime/providers.py: the
session factory, the backend's "cannot run here", the probe, the runner, the onnxruntime engine
step and the deploy step read it there (docs/architecture.md, "Adding a provider"). A fictional
provider added to the table alone is accepted by the engine step, put first in its sessions,
explained where the host lacks it and served by Triton on the GPU; nothing else names it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from plugins.steps import tiny_onnx

from optbuild.backends.manifest import write_manifest
from optbuild.backends.onnxruntime import BACKEND, providers
from optbuild.backends.onnxruntime.loader import providers_for
from optbuild.backends.onnxruntime.providers import PROVIDERS, Provider
from optbuild.common.fingerprint import Fingerprint
from optbuild.steps.base import Artifact, StepContext
from optbuild.steps.deploy import Deploy, DeployParams
from optbuild.steps.engine_ort import OrtEngine, OrtEngineParams

REPO = Path(__file__).resolve().parents[2]
FANCY = "FancyExecutionProvider"
HOST = Fingerprint({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVML library not found)",
                    "ort_providers.available": "CPUExecutionProvider", "onnxruntime.distribution": "onnxruntime",
                    "cpu.arch": "x86_64", "cpu.flags": "sse4_2,avx2"})


@pytest.fixture
def fancy(monkeypatch):
    """A GPU provider that onnxruntime can save the graph of, added to the table only."""
    monkeypatch.setitem(PROVIDERS, FANCY, Provider(FANCY, gpu=True, saves_graph=True))
    return FANCY


def engine(provider: str) -> OrtEngine:
    params = OrtEngineParams.model_validate({"backend": "onnxruntime", "input": "src", "provider": provider})
    return OrtEngine(params, Path("."), Path("."))


def test_a_provider_added_to_the_table_is_one_the_engine_step_optimizes_for(fancy):
    step = engine(fancy)
    assert step.runs_on() == {"backend": "onnxruntime", "provider": fancy}
    assert providers_for(fancy) == [fancy, "CPUExecutionProvider"]
    assert step.unavailable(HOST) == f"needs the onnxruntime build with the {fancy}"
    assert step.unavailable(Fingerprint({**HOST.as_dict(), "ort_providers.available": f"{fancy},CPUExecutionProvider"})) is None


def deployed_kind(folder: Path, upstream: OrtEngine | None = None, engine_json: Path | None = None) -> str:
    """Triton's instance kind for the model.onnx in ``folder``, as the deploy step lays it out."""
    step = Deploy(DeployParams.model_validate({"input": "x", "model_name": "tiny"}), folder, folder)
    step.bind({"input": upstream} if upstream else {})
    out = folder / "out"
    out.mkdir()
    files = {"model.onnx": folder / "model.onnx", **({"engine.json": engine_json} if engine_json else {})}
    ctx = StepContext(step_id="net:serve", base_dir=folder, project_root=folder, out_dir=out,
                      inputs={"input": Artifact("net:ort", folder, files, files["model.onnx"])}, host=Fingerprint())
    step.run(ctx)
    return str(ctx.metrics["kind"])


def test_a_provider_added_to_the_table_is_served_on_the_gpu(fancy, tmp_path):
    tiny_onnx(tmp_path / "model.onnx")
    assert deployed_kind(tmp_path, engine(fancy)) == "KIND_GPU"


@pytest.mark.parametrize(("provider", "kind"), [("TensorrtExecutionProvider", "KIND_GPU"),
                                              ("CUDAExecutionProvider", "KIND_GPU"),
                                              ("CPUExecutionProvider", "KIND_CPU")])
def test_a_model_that_its_engine_json_says_runs_on_a_gpu_provider_is_served_on_the_gpu(tmp_path, provider, kind):
    """What a select chose says its provider in engine.json alone: a TensorRT-provider model
    is placed on the GPU as a CUDA one is."""
    tiny_onnx(tmp_path / "model.onnx")
    write_manifest(tmp_path, {"backend": "onnxruntime", "provider": provider})
    assert deployed_kind(tmp_path, engine_json=tmp_path / "engine.json") == kind


def test_a_provider_that_compiles_the_graph_is_refused_by_the_engine_step_saying_why():
    compiling = [name for name, p in PROVIDERS.items() if not p.saves_graph]
    assert "TensorrtExecutionProvider" in compiling
    for name in compiling:
        with pytest.raises(ValueError, match="compiles the graph into nodes onnxruntime cannot save"):
            engine(name)
    with pytest.raises(ValueError, match="unknown execution provider 'CudaExecutionProvider'; did you mean "
                                         "'CUDAExecutionProvider'"):
        engine("CudaExecutionProvider")


def test_the_nvidia_providers_run_on_gpu_0_and_tensorrt_hands_its_leftovers_to_cuda():
    assert [name for name, p in PROVIDERS.items() if p.nvidia] == ["CUDAExecutionProvider", "TensorrtExecutionProvider"]
    assert providers_for("TensorrtExecutionProvider") == [
        ("TensorrtExecutionProvider", {"device_id": 0}), ("CUDAExecutionProvider", {"device_id": 0}),
        "CPUExecutionProvider"]
    cuda = {"backend": "onnxruntime", "provider": "CUDAExecutionProvider"}
    assert BACKEND.host_fields(cuda) == ("gpu.0.name", "gpu.0.compute_capability")


@pytest.mark.parametrize("module", ["optbuild/backends/onnxruntime/__init__.py", "optbuild/backends/onnxruntime/loader.py",
                                    "optbuild/backends/onnxruntime/probe.py", "optbuild/backends/onnxruntime/runner.py",
                                    "optbuild/steps/engine_ort.py", "optbuild/steps/deploy.py"])
def test_no_module_but_the_table_spells_a_provider_it_decides_by(module):
    """Docstrings, messages and the like may name providers; a string compared with, or
    listed in a tuple, would be knowledge kept outside the table."""
    tree = ast.parse((REPO / module).read_text())
    names = set(providers.PROVIDERS)
    decided = [(node.lineno, constant.value) for node in ast.walk(tree) if isinstance(node, (ast.Compare, ast.Tuple))
               for constant in ast.walk(node) if isinstance(constant, ast.Constant) and constant.value in names]
    assert decided == []
