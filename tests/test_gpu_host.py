"""A GPU host as issue 23 asks of it: what it fetches, and what the examples do on its GPU.

* A fetch-only build on the GPU host from a remote filled by a build elsewhere: every
  hardware-bound step restored, none built; a GPU of the same model with another serial
  has the same keys, a GPU of another model not. The test runs twice: for the H100
  recorded in tests/fixtures/fingerprints/h100.json (in CPU CI: its GPU-keyed steps are
  the test kind ``bound`` of tests/distributed/hostkinds.py, keyed by one field as an engine
  is), and for this host's GPU (marked gpu: the real onnxruntime CUDA engine, its verify
  and benchmark join them).
* The example recipes built on this host's GPU (marked gpu): the CUDA variants verified and
  benchmarked on CUDA, and each ``best`` choosing among the CPU and GPU variants.

Without an NVIDIA GPU and onnxruntime-gpu the gpu tests skip, saying what they need.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from plugins.gpu import GPU_KEYED, H100, cuda_here, cuda_steps
from plugins.projects import REPO, ProjectDir
from plugins.remote import Remote, outputs

from optbuild.builder import lockfile
from optbuild.common.fingerprint import Fingerprint

OTHER_SERIAL = "GPU-5f1e2d3c-0000-4000-8000-123456789abc"
OTHER_MODEL = {"gpu.0.name": "NVIDIA A100-SXM4-80GB", "gpu.0.compute_capability": "8.0"}


@dataclass
class GpuHost:
    """The GPU host the builds are for: ``build_as`` is what builds are given (None: probe
    this host, as `optbuild build` does), ``fields`` what it holds."""

    build_as: Fingerprint | None
    fields: dict
    real: bool

    def like(self, **changes: object) -> Fingerprint:
        """A host as this one, with ``changes`` (field -> value)."""
        return Fingerprint({**self.fields, **changes})


@pytest.fixture(params=[pytest.param("recorded", id="h100-recorded"),
                        pytest.param("real", id="this-gpu", marks=pytest.mark.gpu)])
def gpu_host(request: pytest.FixtureRequest) -> GpuHost:
    if request.param == "recorded":
        host = Fingerprint.load(H100)
        return GpuHost(host, host.as_dict(), real=False)
    return GpuHost(None, cuda_here().as_dict(), real=True)


# --- a fetch-only build on the GPU host ----------------------------------------------------
CONFIG = """\
[project]
recipes = ["recipes/*.toml"]

[kinds]
text = "kinds.py:Text"
bound = "hostkinds.py:Bound"

[build]
jobs = 2
"""

RECIPE = GPU_KEYED + """
# the host's CPU: an onnxruntime model optimized for it, measured on it
[steps.model]
kind = "onnx"
path = "../models/convnet.onnx"

[steps.engine_cpu]
kind = "engine"
backend = "onnxruntime"
input = "model"
level = "extended"

[steps.bench_cpu]
kind = "benchmark"
input = "engine_cpu"
runs = 5
warmup = 1
"""

# on a real GPU: the model on onnxruntime CUDA, verified against the CPU and measured
ON_CUDA = cuda_steps(runs=20, warmup=3)


def gpu_project(root: Path, host: GpuHost, remote: Remote, model: Path) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    shutil.copy(REPO / "tests/distributed/hostkinds.py", proj.root / "hostkinds.py")
    (proj.root / "models").mkdir()
    shutil.copy(model, proj.root / "models" / "convnet.onnx")
    proj.write("optbuild.toml", CONFIG + "\n" + remote.section())
    recipe = RECIPE.format(name=host.fields["gpu.0.name"], capability=host.fields["gpu.0.compute_capability"])
    proj.write("recipes/r.toml", recipe + (ON_CUDA if host.real else ""))
    return proj


def started(result) -> list[str]:
    return sorted(e["step"] for e in result.reporter.events
                  if e.get("event") == "step" and e["status"] in ("running", "built"))


def test_a_fetch_only_build_on_the_gpu_host_restores_every_hardware_bound_step(tmp_path, gpu_host, file_remote):
    pytest.importorskip("onnxruntime")
    from plugins.models import make_convnet

    model = make_convnet(tmp_path / "convnet.onnx")
    elsewhere = gpu_project(tmp_path / "elsewhere", gpu_host, file_remote, model)
    gpu = gpu_project(tmp_path / "gpu-host", gpu_host, file_remote, model)

    # a build elsewhere, for this GPU host, fills the remote (write-through)
    filled = elsewhere.build(host=gpu_host.build_as)
    assert filled.ok, filled.reporter.events
    everything = sorted(filled.outcomes)
    assert sorted(filled.steps("built")) == everything
    built = lockfile.read(elsewhere.root / "optbuild.lock")
    hardware = {sid: record["host"] for sid, record in built.items() if record["host"]}
    by_gpu = {sid for sid, fields in hardware.items() if any(f.startswith("gpu.") for f in fields)}
    expected = {"r:for_model", "r:for_capability"} | ({"r:verify_cuda", "r:bench_cuda"} if gpu_host.real else set())
    assert by_gpu == expected, hardware
    assert {"r:engine_cpu", "r:bench_cpu"} <= hardware.keys() - by_gpu  # the CPU's, keyed by it
    for sid in by_gpu:  # the GPU's model (or compute capability), never its serial
        fields = hardware[sid]
        assert "gpu.0.uuid" not in fields, (sid, fields)
        assert fields.get("gpu.0.name", gpu_host.fields["gpu.0.name"]) == gpu_host.fields["gpu.0.name"]
        assert fields.get("gpu.0.compute_capability", gpu_host.fields["gpu.0.compute_capability"]) \
            == gpu_host.fields["gpu.0.compute_capability"]

    # the GPU host, with an empty cache, fetches it all and builds nothing
    fetched = gpu.build(host=gpu_host.build_as, fetch_only=True)
    assert fetched.ok, fetched.reporter.events
    assert sorted(fetched.steps("restored")) == everything and started(fetched) == []
    assert {sid: r["key"] for sid, r in lockfile.read(gpu.root / "optbuild.lock").items()} \
        == {sid: r["key"] for sid, r in built.items()}
    assert outputs(gpu) == outputs(elsewhere)
    if gpu_host.real:  # what was restored was measured on this GPU, on CUDA
        bench = json.loads(gpu.read("build/r/bench_cuda/benchmark.json"))
        assert "(CUDA" in bench["runtime"] and gpu_host.fields["gpu.0.name"] in bench["runtime"], bench["runtime"]

    # another GPU of the same model (another serial): the same keys, all cached
    same_model = gpu.build(host=gpu_host.like(**{"gpu.0.uuid": OTHER_SERIAL}), dry_run=True)
    assert sorted(same_model.steps("cached")) == everything
    # a GPU of another model: exactly the GPU-keyed steps are not in any cache
    other_model = gpu.build(host=gpu_host.like(**OTHER_MODEL), dry_run=True)
    assert sorted(other_model.steps("cached")) == sorted(set(everything) - by_gpu)
    assert not set(other_model.steps("restored")) & by_gpu


# --- the examples on this host's GPU --------------------------------------------------------
MODELS = ("cnn", "transformer", "encoder")
PRECISIONS = ("fp32", "fp16")
CUDA_STEPS = {f"{model}:{step}[{precision}]" for model in MODELS for precision in PRECISIONS
              for step in ("engine_cuda", "verify_cuda", "bench_cuda")}


@dataclass
class Examples:
    project: ProjectDir
    run: object  # the build's CliRun
    host: Fingerprint

    def json(self, relative: str) -> dict:
        return json.loads(self.project.read(relative))


@pytest.fixture(scope="module")
def examples_on_gpu(tmp_path_factory: pytest.TempPathFactory) -> Examples:
    host = cuda_here()
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("examples")
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    project = ProjectDir(root)
    return Examples(project, project.cli("build", "--json", timeout=900), host)


@pytest.mark.gpu
@pytest.mark.slow
def test_the_examples_cuda_variants_are_verified_and_benchmarked_on_the_gpu(examples_on_gpu):
    ex = examples_on_gpu
    assert ex.run.returncode == 0, ex.run.stderr[-3000:]
    assert CUDA_STEPS <= set(ex.run.steps("built")), sorted(CUDA_STEPS - set(ex.run.steps("built")))
    gpu = ex.host.get("gpu.0.name")
    lock = lockfile.read(ex.project.root / "optbuild.lock")
    for model in MODELS:
        for precision in PRECISIONS:
            report = ex.json(f"build/{model}/verify_cuda[{precision}]/report.json")
            assert report["passed"], (model, precision, report)
            assert report["runtime"]["reference"].endswith("(CPU)"), report["runtime"]
            assert "(CUDA" in report["runtime"]["candidate"] and gpu in report["runtime"]["candidate"], report["runtime"]
            bench = ex.json(f"build/{model}/bench_cuda[{precision}]/benchmark.json")
            assert bench["runtime"].startswith("onnxruntime ") and "(CUDA" in bench["runtime"], bench["runtime"]
            assert gpu in bench["runtime"] and bench["p50_ms"] > 0
            keyed = lock[f"{model}:bench_cuda[{precision}]"]["host"]
            assert keyed["gpu.0.name"] == gpu and "gpu.0.uuid" not in keyed, keyed


@pytest.mark.gpu
@pytest.mark.slow
def test_best_chooses_among_the_cpu_and_gpu_variants_that_ran_here(examples_on_gpu):
    ex = examples_on_gpu
    assert ex.run.returncode == 0, ex.run.stderr[-3000:]
    assert {f"{model}:best" for model in MODELS} <= set(ex.run.steps("built"))
    for model in MODELS:
        selection = ex.json(f"build/{model}/best/selection.json")
        candidates = {c["step"]: c for c in selection["candidates"]}
        cuda = {f"{model}:bench_cuda[{precision}]" for precision in PRECISIONS}
        assert cuda | {f"{model}:bench_fp32"} <= candidates.keys()
        for step in cuda:  # measured together with the others, on CUDA
            together = candidates[step]["together"]
            assert together and "(CUDA" in together["runtime"] and together["p50_ms"] > 0, candidates[step]
        assert "(CPU)" in candidates[f"{model}:bench_fp32"]["together"]["runtime"]
        assert candidates[selection["chosen"]]["why"].startswith("chosen")
        for step, candidate in candidates.items():  # each one ran, or is listed with why not
            assert candidate["why"] or candidate["rejected"], (step, candidate)
        text = ex.project.read(f"build/{model}/best/selection.txt")
        assert all(step in text for step in cuda)
