"""kind = "verify" with a TensorRT / TensorRT-RTX engine as the candidate; [build] skip_unavailable.

On a host without a GPU: what such a step needs (``unavailable``), what of the GPU its key
holds (all learnt from the engine step the candidate names), the checks that come before any
GPU work (samples that fit the engine's profiles), and that the example project still builds green, listing these
steps as unavailable. The ``gpu`` test runs a real engine candidate against onnxruntime.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from plugins.projects import REPO, ProjectDir
from plugins.trt import HAS_RTX, MATMUL_PROFILE, make_ctx, matmul_relu

from optbuild.backends.onnxruntime import distribution as ort_distribution
from optbuild.builder.keys import key_params
from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint
from optbuild.project.recipe import load_project
from optbuild.steps.base import Artifact, Step, StepContext
from optbuild.steps.verify import Verify, VerifyParams

HAS_CUDA_PYTHON = importlib.util.find_spec("cuda") is not None

NO_GPU = Fingerprint({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVIDIA driver not loaded)",
                      "cpu.arch": "x86_64", "cpu.flags": "avx2,fma"})


def gpu_host(name: str, cc: str) -> Fingerprint:
    return Fingerprint({"gpu.count": 1, "gpu.0.name": name, "gpu.0.compute_capability": cc,
                        "cpu.arch": "x86_64", "cpu.flags": "avx2,fma"})


RTX_3090, RTX_A6000 = gpu_host("NVIDIA GeForce RTX 3090", "8.6"), gpu_host("NVIDIA RTX A6000", "8.6")
RTX_4090, RTX_5090 = gpu_host("NVIDIA GeForce RTX 4090", "8.9"), gpu_host("NVIDIA GeForce RTX 5090", "12.0")
H100 = gpu_host("NVIDIA H100 80GB HBM3", "9.0")


def engine_step(backend: str = "tensorrt-rtx", **params) -> Step:
    from optbuild.steps.engine_trt import TensorRTEngine, TensorRTRTXEngine

    cls = TensorRTRTXEngine if backend == "tensorrt-rtx" else TensorRTEngine
    return cls(cls.Params.model_validate({"backend": backend, "input": "simplify", **params}), Path("."), Path("."))


def verify_step(tmp_path: Path = Path("."), candidate_step: Step | None = None, **params) -> Verify:
    """A verify step as the project loader leaves it: bound to the candidate step it names."""
    params = {"reference": "simplify", "candidate": "rtx_fp32", "max_abs": 0.01, **params}
    step = Verify(VerifyParams.model_validate(params), tmp_path, tmp_path)
    if candidate_step is not None:
        step.bind({"candidate": candidate_step})
    return step


def rtx_verify(tmp_path: Path = Path("."), targets: list[str] | None = None, **params) -> Verify:
    return verify_step(tmp_path, engine_step(**({"targets": targets} if targets else {})), **params)


# --- what the step needs, and what of the host its key holds -------------------------------------------
def test_unavailable_on_this_host_names_the_gpu_it_needs():
    here = Fingerprint()
    if here.get("gpu.count"):
        pytest.skip("this host has an NVIDIA GPU")
    message = rtx_verify(targets=["sm86", "sm89"]).unavailable(here)
    error = here.get("gpu.error")
    assert message.startswith("needs an NVIDIA GPU to run the TensorRT-RTX engine (here: ")
    assert error.removeprefix("no NVIDIA GPU (").removesuffix(")") in message
    assert verify_step().unavailable(here) is None  # an onnxruntime candidate runs anywhere


def test_unavailable_names_gpu_targets_and_packages():
    assert rtx_verify().unavailable(NO_GPU).startswith(
        "needs an NVIDIA GPU to run the TensorRT-RTX engine (here: NVIDIA driver not loaded)")
    step = rtx_verify(targets=["sm86", "sm89"])
    assert step.unavailable(RTX_5090).startswith(
        "needs a GPU the TensorRT-RTX engine runs on: gpu.0 (NVIDIA GeForce RTX 5090, compute capability "
        "12.0) is not among the targets sm86, sm89")
    assert "default targets runs on" in rtx_verify().unavailable(H100)  # no RTX GPU
    if HAS_RTX and HAS_CUDA_PYTHON:
        assert step.unavailable(RTX_4090) is None
        assert rtx_verify().unavailable(RTX_5090) is None  # sm120 is among the default targets
    else:
        assert "pip install 'optbuild[rtx]'" in step.unavailable(RTX_4090)
    trt = verify_step(candidate_step=engine_step("tensorrt"))
    assert "to run the TensorRT engine (here: NVIDIA driver not loaded)" in trt.unavailable(NO_GPU)
    if importlib.util.find_spec("tensorrt") is None:
        assert trt.unavailable(H100) == ("needs TensorRT's Python module 'tensorrt' (pip install "
                                         "'optbuild[gpu]')")
    for host in (NO_GPU, H100, RTX_4090):
        assert verify_step().unavailable(host) is None


def test_host_key_holds_the_gpu_fields_that_change_the_verdict():
    cpu = {"cpu.arch": "x86_64", "cpu.flags": "avx2,fma"}
    ort = verify_step()
    assert ort.host_key(RTX_3090) == ort.host_key(NO_GPU) == cpu  # as before: the CPU only
    trt = verify_step(candidate_step=engine_step("tensorrt"))
    assert trt.host_key(RTX_3090) == {**cpu, "gpu.0.compute_capability": "8.6"}
    assert trt.host_key(RTX_3090) == trt.host_key(RTX_A6000)  # same kernels on the same architecture
    assert trt.host_key(RTX_3090) != trt.host_key(RTX_4090)
    rtx = rtx_verify()
    assert rtx.host_key(RTX_3090) == {**cpu, "gpu.0.compute_capability": "8.6",
                                      "gpu.0.name": "NVIDIA GeForce RTX 3090"}
    assert rtx.host_key(RTX_3090) != rtx.host_key(RTX_A6000)  # specialized at load for each GPU
    assert rtx.host_key(RTX_3090) != rtx.host_key(RTX_4090)


def test_steps_without_an_engine_keep_their_key_material():
    # cnn:verify[int8] as recipes/cnn.toml and its template write it: its key was made from exactly this dump
    step = verify_step(candidate="quantize_int8", data="models/calib.py:images", max_abs=0.2,
                       data_args={"count": 64, "seed": 1}, min_cosine=0.99, min_top1=0.95)
    assert key_params(step.params) == {
        "reference": "simplify", "candidate": "quantize_int8", "data": "models/calib.py:images",
        "data_args": {"count": 64, "seed": 1}, "samples": None, "seed": 0, "dynamic_size": 1,
        "int_range": [0, 8], "outputs": [], "max_abs": 0.2, "max_rel": None, "min_cosine": 0.99,
        "min_top1": 0.95, "top1_outputs": []}, "a parameter added later (inputs) enters keys only when set"
    assert step.tool_names() == (ort_distribution(), "numpy")
    engine = rtx_verify(targets=["8.9", "sm_86"], candidate="quantize_int8", data="models/calib.py:images",
                        max_abs=0.2, data_args={"count": 64, "seed": 1}, min_cosine=0.99, min_top1=0.95)
    assert engine.params == step.params  # what the engine step says is not written in the verify step
    assert engine.sides["candidate"][1]["targets"] == ["sm86", "sm89"]
    assert engine.tool_names()[:2] == (ort_distribution(), "numpy")
    assert engine.tool_names()[2].startswith("tensorrt-rtx")


def test_the_project_loader_binds_verify_steps_to_their_candidates(tmp_path):
    (tmp_path / "optbuild.toml").write_text("")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "m.toml").write_text(NEEDS_RECIPE)
    matmul_relu(tmp_path / "recipes" / "m.onnx")
    project = load_project(tmp_path)
    on_engine, on_model = project.steps["m:check_engine"].step, project.steps["m:check_model"].step
    backend, manifest = on_engine.sides["candidate"]
    assert backend.name == "tensorrt-rtx" and manifest["targets"] == ["sm89"]
    assert on_engine.unavailable(RTX_3090).startswith("needs a GPU the TensorRT-RTX engine runs on: gpu.0 "
                                                      "(NVIDIA GeForce RTX 3090, compute capability 8.6) is "
                                                      "not among the targets sm89")
    assert on_model.sides["candidate"][0].name == "onnxruntime"
    assert on_model.unavailable(NO_GPU).startswith("needs an NVIDIA GPU to run the TensorRT-RTX engine")


NEEDS_RECIPE = """
[steps.model]
kind = "onnx"
path = "m.onnx"

[steps.rtx]
kind = "engine"
backend = "tensorrt-rtx"
input = "model"
targets = ["sm89"]

[steps.check_engine]
kind = "verify"
reference = "model"
candidate = "rtx"
max_abs = 0.01

[steps.check_model]
kind = "verify"
reference = "rtx"
candidate = "model"
max_abs = 0.01
"""


# --- before any GPU work: a real TensorRT-RTX engine, run on a host without a GPU -----------------------
@pytest.fixture(scope="module")
def rtx_engine(tmp_path_factory) -> tuple[Path, Artifact]:
    """The MatMul+Relu model and its TensorRT-RTX engine (batch 1..8, targets sm86 sm89)."""
    if not HAS_RTX:
        pytest.skip("tensorrt-rtx is not installed (pip install 'optbuild[rtx]')")
    from optbuild.steps.engine_trt import TensorRTRTXEngine

    tmp = tmp_path_factory.mktemp("rtx-engine")
    model = matmul_relu(tmp / "m.onnx")
    params = {"backend": "tensorrt-rtx", "input": "model", "profiles": MATMUL_PROFILE, "targets": ["sm86", "sm89"]}
    ctx = make_ctx(tmp, model, host=NO_GPU)
    TensorRTRTXEngine(TensorRTRTXEngine.Params.model_validate(params), tmp, tmp).run(ctx)
    files = {p.name: p for p in ctx.out_dir.iterdir()}
    return model, Artifact(step="t:rtx", dir=ctx.out_dir, files=files, primary=files["model.engine"])


def run_verify(tmp_path: Path, reference: Path, candidate: Artifact, host: Fingerprint = NO_GPU, **params):
    step = Verify(VerifyParams.model_validate({"reference": "ref", "candidate": "cand", "max_abs": 1e-3, **params}),
                  tmp_path, tmp_path)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    inputs = {"reference": Artifact(step="t:ref", dir=reference.parent, files={reference.name: reference},
                                    primary=reference), "candidate": candidate}
    step.run(StepContext(step_id="t:verify", base_dir=tmp_path, project_root=tmp_path, out_dir=out,
                         inputs=inputs, host=host))


def test_samples_outside_the_engine_profile_are_named(tmp_path, rtx_engine):
    model, engine = rtx_engine
    np.savez(tmp_path / "big.npz", x=np.zeros((2, 12, 16), np.float32))  # 2 samples of batch 12
    with pytest.raises(StepError) as info:
        run_verify(tmp_path, model, engine, data="big.npz")
    assert str(info.value).startswith(
        "sample 0 of big.npz does not fit the candidate t:rtx: input 'x' has shape [12, 16], outside "
        "the engine's optimization profile (min [1, 16], max [8, 16])")
    with pytest.raises(StepError, match=r"sample 0 of random \(seed 0\) .*shape \[9, 16\]"):
        run_verify(tmp_path, model, engine, dynamic_size=9)


def test_an_engine_without_its_manifest_is_refused(tmp_path, rtx_engine):
    model, engine = rtx_engine
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(engine.primary, bare / "model.engine")
    alone = Artifact(step="t:bare", dir=bare, files={"model.engine": bare / "model.engine"},
                     primary=bare / "model.engine")
    with pytest.raises(StepError, match=r"the candidate t:bare gives model.engine with no engine.json beside it "
                                        r"to say which backend runs it"):
        run_verify(tmp_path, model, alone)


def test_a_host_that_cannot_run_the_engine_gets_a_message_not_a_crash(tmp_path, rtx_engine):
    model, engine = rtx_engine
    with pytest.raises(StepError, match=r"the candidate t:rtx cannot run on this host: needs an NVIDIA GPU to run "
                                        r"the TensorRT-RTX engine \(here: NVIDIA driver not loaded\)"):
        run_verify(tmp_path, model, engine)
    with pytest.raises(StepError, match=r"cannot run on this host: needs a GPU the TensorRT-RTX engine runs on: "
                                        r"gpu.0 \(NVIDIA H100 80GB HBM3.* not among "
                                        r"the targets sm86, sm89"):
        run_verify(tmp_path, model, engine, host=H100)


# --- [build] skip_unavailable ------------------------------------------------------------------------
NEEDS_KIND = '''
from optbuild.steps.base import Step, StepParams


class NeedsParams(StepParams):
    text: str = "x"


class Needs(Step):
    Params = NeedsParams
    primary_output = "data.txt"

    def unavailable(self, host):
        return "needs a unicorn (none here)"

    def run(self, ctx):
        (ctx.out_dir / "data.txt").write_text(self.params.text)
'''


@pytest.fixture
def unicorn_project(tmp_path: Path) -> ProjectDir:
    """One step this host can run (src) and one it cannot (horn)."""
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("needs.py", NEEDS_KIND)
    proj.write("recipes/r.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n'
                                 '[steps.horn]\nkind = "needs"\n')
    return proj


def config(skip: bool | None) -> str:
    build = "" if skip is None else f"\n[build]\nskip_unavailable = {str(skip).lower()}\n"
    return f'[kinds]\ntext = "kinds.py:Text"\nneeds = "needs.py:Needs"\n{build}'


def test_skip_unavailable_defaults_to_the_config_and_the_flags_override_it(unicorn_project):
    proj = unicorn_project
    proj.write("optbuild.toml", config(None))  # the default: false
    assert not proj.build().ok
    run = proj.cli("build", "--skip-unavailable")
    assert run.returncode == 0, run.stderr
    proj.write("optbuild.toml", config(True))
    result = proj.build()
    assert result.ok and result.steps("unavailable") == ["r:horn"]
    assert "r:horn cannot run here: needs a unicorn (none here)" in result.outcomes["r:horn"].error
    assert not proj.build(skip_unavailable=False).ok  # the API's argument beats the config
    run = proj.cli("build")
    assert run.returncode == 0, run.stderr
    assert "  unavailable r:horn\n" in run.stderr
    assert "1 step cannot run here:\n  needs a unicorn (none here)\n    1 step: r:horn\n" in run.stderr
    assert "ok: 1 cached, 1 unavailable" in run.stderr  # the summary counts them
    assert proj.cli("build", "--no-skip-unavailable").returncode == 1
    assert proj.cli("plan").returncode == 0
    assert proj.cli("plan", "--no-skip-unavailable").returncode == 1
    proj.write("optbuild.toml", config(False))
    assert proj.cli("plan", "--skip-unavailable").returncode == 0
    assert proj.cli("plan").returncode == 1


def test_the_repository_config_skips_unavailable_steps():
    import tomllib

    from optbuild.project.config import ProjectConfig

    with open(REPO / "optbuild.toml", "rb") as f:
        assert ProjectConfig.model_validate(tomllib.load(f)).build.skip_unavailable is True
    assert ProjectConfig().build.skip_unavailable is False  # the default stays strict


# --- the example project on a host without a GPU ------------------------------------------------------
@pytest.mark.slow
def test_example_engine_verify_steps_are_unavailable_and_the_build_is_green(tmp_path):
    if Fingerprint().get("gpu.count"):
        pytest.skip("this host has an NVIDIA GPU: the verify steps may run here")
    if not HAS_RTX:
        pytest.skip("tensorrt-rtx is not installed: the engines themselves are unavailable")
    root = tmp_path / "examples"
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copy(REPO / "recipes" / "transformer.toml", root / "recipes")
    shutil.copytree(REPO / "recipes" / "templates", root / "recipes" / "templates")
    shutil.copytree(REPO / "recipes" / "models", root / "recipes" / "models",
                    ignore=shutil.ignore_patterns("__pycache__"))
    examples = ProjectDir(root)
    verifies = [f"transformer:verify_rtx[{p}]" for p in ("fp32", "fp16", "int8")]
    first = examples.cli("build", "--json", "-j", "2", *verifies)
    assert first.returncode == 0, first.stderr + first.stdout
    assert first.steps("unavailable") == sorted(verifies)
    assert {"transformer:rtx[fp32]", "transformer:rtx[fp16]", "transformer:rtx[int8]"} <= set(first.steps("built"))
    errors = {e["step"]: e["error"] for e in first.events if e.get("status") == "unavailable"}
    for sid in verifies:
        assert errors[sid].startswith(f"{sid} cannot run here: needs an NVIDIA GPU to run the TensorRT-RTX "
                                      "engine (here: ")
    done = first.events[-1]
    assert done["ok"] is True and done["counts"]["unavailable"] == 3
    again = examples.cli("build", *verifies)  # plain output: each one listed, their reason once
    assert again.returncode == 0
    for sid in verifies:
        assert f"  unavailable {sid}\n" in again.stderr
    assert again.stderr.count("needs an NVIDIA GPU to run the TensorRT-RTX engine") == 1
    covered = next(line for line in again.stderr.splitlines() if line.startswith("    3 steps: "))
    assert sorted(covered.removeprefix("    3 steps: ").split(", ")) == sorted(verifies)
    assert "3 unavailable" in again.stderr.splitlines()[-1]
    assert examples.cli("build", "--no-skip-unavailable", *verifies).returncode == 1


# --- on a GPU host ----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_verify_runs_an_rtx_engine_candidate_against_onnxruntime(tmp_path):
    host = Fingerprint()
    if not host.get("gpu.count"):
        pytest.skip(f"needs an NVIDIA GPU: {host.get('gpu.error')}")
    if not HAS_RTX or not HAS_CUDA_PYTHON:
        pytest.skip("needs tensorrt-rtx and cuda-python (pip install 'optbuild[rtx]')")
    target = "sm" + host.get("gpu.0.compute_capability").replace(".", "")
    step = rtx_verify(tmp_path, targets=[target])
    if (missing := step.unavailable(host)) is not None:
        pytest.skip(missing)
    from optbuild.steps.engine_trt import TensorRTRTXEngine

    model = matmul_relu(tmp_path / "m.onnx")
    params = {"backend": "tensorrt-rtx", "input": "model", "profiles": MATMUL_PROFILE, "targets": [target]}
    ctx = make_ctx(tmp_path, model, host=host)
    TensorRTRTXEngine(TensorRTRTXEngine.Params.model_validate(params), tmp_path, tmp_path).run(ctx)
    files = {p.name: p for p in ctx.out_dir.iterdir()}
    engine = Artifact(step="t:rtx", dir=ctx.out_dir, files=files, primary=files["model.engine"])
    run_verify(tmp_path, model, engine, host=host, samples=6, dynamic_size=4, max_abs=None, max_rel=1e-2, min_cosine=0.9999)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["passed"] and report["candidate"]["file"] == "model.engine"
    assert report["runtime"]["candidate"].startswith("TensorRT-RTX ") and "gpu.0" in report["runtime"]["candidate"]
    assert report["outputs"]["y"]["shape"] == [4, 8] and report["latency_ms"]["candidate"] > 0
