"""kind = "benchmark": a model's latency and throughput on this host, its files handed on
unchanged (the main output is the model), the verify step's figures summarised."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from optbuild.common.digest import ALGORITHM, hash_file
from optbuild.common.fingerprint import Fingerprint

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from plugins.models import make_mlp
from plugins.projects import ProjectDir
from plugins.serving import tokens_model

from optbuild import api
from optbuild.backends import registry
from optbuild.builder.report import Reporter
from optbuild.project.recipe import load_project
from optbuild.steps.benchmark import Benchmark, BenchmarkParams

RECIPE = """\
[steps.model]
kind = "onnx"
path = "../mlp.onnx"

[steps.ref]
kind = "onnx"
path = "../mlp.onnx"

[steps.verify]
kind = "verify"
reference = "ref"
candidate = "model"
max_abs = 0.0
samples = 2

[steps.bench]
kind = "benchmark"
input = "model"
check = "verify"
runs = RUNS
warmup = 1
threads = 1
"""


def _project(root: Path, runs: int = 3, recipe: str = RECIPE) -> ProjectDir:
    proj = ProjectDir(root)
    root.mkdir()
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[build]\njobs = 1\n')
    make_mlp(root / "mlp.onnx")
    proj.write("recipes/r.toml", recipe.replace("RUNS", str(runs)))
    return proj


def _digest(path: Path) -> str:
    return f"{ALGORITHM}:{hash_file(path)[0]}"


def test_a_built_benchmark_measures_and_hands_on_the_model(tmp_path):
    proj = _project(tmp_path / "proj")
    result = proj.build()
    assert result.ok, {sid: o.error for sid, o in result.outcomes.items()}
    outcome = result.outcomes["r:bench"]
    assert outcome.entry.primary == "model.onnx"  # the model, not the report
    folder = proj.root / "build/r/bench"
    model = proj.root / "build/r/model/model.onnx"
    assert sorted(p.name for p in folder.iterdir()) == ["benchmark.json", "model.onnx"]
    assert _digest(folder / "model.onnx") == _digest(model) == f"{ALGORITHM}:{outcome.entry.outputs['model.onnx'].digest}"
    report = json.loads((folder / "benchmark.json").read_text())
    assert report["format"] == "optbuild.benchmark" and report["version"] == 4
    assert report["model"] == {"file": "model.onnx", "digest": _digest(model)}
    assert report["runtime"].startswith("onnxruntime ") and report["batch"] == 1
    # measured in a child of the step's process, at onnxruntime's default level, nothing crashing
    assert report["level"] == "all" and report["runtime"].endswith(", optimization level all")
    assert report["notes"] == []
    checked = json.loads((proj.root / "build/r/verify/report.json").read_text())
    assert checked["levels"] == {"reference": "all", "candidate": "all"} and checked["version"] == 7
    assert "on onnxruntime " in (proj.root / "build/r/verify/report.txt").read_text()
    assert ", optimization level all, candidate" in (proj.root / "build/r/verify/report.txt").read_text()
    assert (report["runs"], report["warmup"], report["threads"]) == (3, 1, 1)
    assert 0 < report["p50_ms"] <= report["p90_ms"] <= report["p99_ms"] and report["mean_ms"] > 0
    # what was measured: the shapes (a symbolic batch of dynamic_size = 1), the load, the spread
    assert report["inputs"] == {"x": {"shape": [1, 4], "dtype": "float32"}}
    assert set(report["load"]) == {"load_average", "cpu_count", "others_cpu"} and report["load"]["cpu_count"] == os.cpu_count()
    assert 0 <= report["load"]["others_cpu"] <= 1  # what other processes took of the CPUs while it timed
    assert report["min_ms"] <= report["p50_ms"] <= report["max_ms"] and report["std_ms"] >= 0
    assert report["throughput_per_s"] == pytest.approx(1000 / report["mean_ms"], rel=1e-3)
    assert report["size_bytes"] == model.stat().st_size
    assert report["verify"]["passed"] is True and report["verify"]["max_abs"] == 0.0
    assert report["verify"]["cosine"] == pytest.approx(1.0) and set(report["verify"]) == {
        "passed", "cosine", "max_abs", "top1", "cosine_at"}
    assert report["verify"]["cosine_at"] == "y"  # the output (or part of one) of the worst cosine
    metrics = outcome.entry.metrics
    assert metrics["p50_ms"] == report["p50_ms"] and metrics["size_bytes"] == report["size_bytes"]
    assert metrics["throughput_per_s"] > 0 and metrics["passed"] is True and "p90_ms" in metrics
    assert metrics["threads"] == 1  # the threads it ran on, as benchmark.json says

    again = proj.build()  # the same key: from the cache
    assert again.steps("cached") and "r:bench" in again.steps("cached")


def test_without_check_verify_is_null_without_threads_all_cores_and_runs_change_the_key(tmp_path):
    recipe = RECIPE.replace('check = "verify"\n', "").replace("threads = 1\n", "")
    proj = _project(tmp_path / "proj", runs=2, recipe=recipe)
    ws = api.open_workspace(proj.root)
    try:
        first = api.build(ws, reporter=Reporter())
    finally:
        ws.close()
    assert first.ok
    report = json.loads(proj.read("build/r/bench/benchmark.json"))
    assert report["verify"] is None and report["runs"] == 2
    assert "passed" not in first.outcomes["r:bench"].entry.metrics
    # threads not set: the runtime's default, all cores, recorded as such (benchmark.json: null)
    assert report["threads"] is None and first.outcomes["r:bench"].entry.metrics["threads"] == "all"
    proj.write("recipes/r.toml", proj.read("recipes/r.toml").replace("runs = 2", "runs = 4"))
    second = proj.build()
    assert second.outcomes["r:bench"].key != first.outcomes["r:bench"].key
    assert "r:bench" in second.steps("built") and "r:model" in second.steps("cached")
    assert json.loads(proj.read("build/r/bench/benchmark.json"))["runs"] == 4


def test_a_check_of_another_model_is_refused(tmp_path):
    proj = _project(tmp_path / "proj")
    make_mlp(proj.root / "other.onnx", scale=1.01)
    proj.write("recipes/r.toml", proj.read("recipes/r.toml")
               .replace('candidate = "model"', 'candidate = "other"')
               .replace("max_abs = 0.0", "max_abs = 10.0")
               + '\n[steps.other]\nkind = "onnx"\npath = "../other.onnx"\n')
    result = proj.build()
    assert not result.ok
    assert "check: r:verify verified another model" in result.outcomes["r:bench"].error


def test_validation_errors_name_file_line_and_field(tmp_path):
    proj = _project(tmp_path / "proj", runs=0)
    problems = proj.problems()
    line = proj.read("recipes/r.toml").splitlines().index("runs = 0") + 1
    assert any(p.startswith(f"{proj.root / 'recipes/r.toml'}:{line}: steps.bench.runs") and "greater than or equal to 1"
               in p for p in problems), problems


@pytest.mark.parametrize("params, words", [
    ({"runs": 0}, "greater than or equal to 1"),
    ({"warmup": -1}, "greater than or equal to 0"),
    ({"threads": 0}, "greater than or equal to 1"),
    ({"check": "m"}, "check and input name the same step"),
    ({"repeats": 3}, "Extra inputs are not permitted"),
])
def test_params_are_validated(params, words):
    with pytest.raises(ValidationError, match=words):
        BenchmarkParams.model_validate({"input": "m", **params})


def test_tools_host_fields_and_primary_come_from_the_backend(tmp_path):
    proj = _project(tmp_path / "proj")
    project = load_project(proj.root)
    step = project.steps["r:bench"].step
    assert isinstance(step, Benchmark)
    onnxruntime = registry.onnx_backend()
    assert step.tool_names() == onnxruntime.distributions()
    host = Fingerprint({"cpu.arch": "x86_64", "cpu.flags": "avx2,fma", "cpu.model": "Some CPU", "cpu.count": 8})
    assert step.host_key(host) == {"cpu.arch": "x86_64", "cpu.flags": "avx2,fma", "cpu.model": "Some CPU",
                                   "cpu.count": 8}
    assert step.primary_output == "model.onnx" and step.runs_on() == {"backend": "onnxruntime"}
    assert step.unavailable(host) is None


def test_an_engine_input_keys_the_gpu_and_is_unavailable_without_one(tmp_path):
    from optbuild.steps.engine_trt import TensorRTEngine

    trt = TensorRTEngine(TensorRTEngine.Params.model_validate({"backend": "tensorrt", "input": "m"}),
                         tmp_path, tmp_path)
    step = Benchmark(BenchmarkParams(input="engine"), tmp_path, tmp_path)
    step.bind({"input": trt})
    assert step.primary_output == trt.primary_output == "model.engine"
    assert step.runs_on() == trt.runs_on()
    backend, manifest = registry.for_step(trt)
    assert step.tool_names() == backend.distributions()
    host = Fingerprint({"gpu.count": 0, "gpu.error": "no NVIDIA GPU (test)", "cpu.arch": "x86_64",
                        "cpu.flags": "avx2", "cpu.model": "Some CPU", "cpu.count": 8})
    key = step.host_key(host)
    assert set(backend.host_fields(manifest)) <= set(key) and "gpu.0.name" in key and "cpu.model" not in key
    assert "needs an NVIDIA GPU" in step.unavailable(host)


def test_benchmark_verify_and_select_together_never_choose_the_candidate_that_failed(tmp_path):
    """The real chain: two models (one off by 5 %), each verified (fail = false records
    instead of stopping) and benchmarked; select drops the failed one whatever its speed."""
    recipe = RECIPE.replace("RUNS", "3") + """
[steps.off]
kind = "onnx"
path = "../off.onnx"

[steps.verify_off]
kind = "verify"
reference = "ref"
candidate = "off"
max_abs = 0.0
samples = 2
fail = false

[steps.bench_off]
kind = "benchmark"
input = "off"
check = "verify_off"
runs = 3
warmup = 1
threads = 1

[steps.best]
kind = "select"
candidates = ["bench_off", "bench"]
objective = "size_bytes"
"""
    proj = _project(tmp_path / "proj", recipe=recipe)
    make_mlp(proj.root / "off.onnx", scale=1.05)
    result = proj.build()
    assert result.ok, {sid: o.error for sid, o in result.outcomes.items() if o.error}
    report = json.loads(proj.read("build/r/best/selection.json"))
    assert report["chosen"] == "r:bench"
    assert report["candidates"][0]["rejected"] == ["its verify step failed"]
    assert _digest(proj.root / "build/r/best/model.onnx") == _digest(proj.root / "mlp.onnx")


# --- shapes that serve -------------------------------------------------------------------
TOKENS = """\
DECLARATION
[steps.model]
kind = "onnx"
path = "../tokens.onnx"

[steps.bench]
kind = "benchmark"
input = "model"
runs = 2
warmup = 0
PARAMS
"""


def _tokens_project(root: Path, declaration: str = "", params: str = "") -> ProjectDir:
    proj = _project(root, recipe=TOKENS.replace("DECLARATION", declaration).replace("PARAMS", params))
    tokens_model(root / "tokens.onnx")
    return proj


def test_an_open_sequence_dim_left_at_1_fails_naming_the_input_dim_and_the_declaration(tmp_path):
    result = _tokens_project(tmp_path / "proj").build()
    error = result.outcomes["r:bench"].error
    assert not result.ok and "input 'tokens' dim 1 ('seq') of the input r:model" in error, error
    assert "dynamic_size = 1" in error
    assert "[inputs.tokens] shape = [1, SEQ]" in error and "inputs = { tokens = { shape = [1, SEQ] } }" in error
    assert not (tmp_path / "proj/build/r/bench/benchmark.json").exists()


@pytest.mark.parametrize(("declaration", "params", "shape"), [
    ("[inputs.tokens]\nshape = [1, 64]\n", "", [1, 64]),                  # the recipe's declaration
    ("[inputs.tokens]\nshape = [1, [16, 32, 128]]\n", "", [1, 32]),       # a range: its opt
    ("", "inputs = { tokens = { shape = [1, 1] } }", [1, 1]),               # 1 declared: one decoding step
    ("", "dynamic_size = 8", [8, 8]),                                      # a size chosen for every open dim
])
def test_a_declared_or_chosen_size_is_measured_and_recorded(tmp_path, declaration, params, shape):
    proj = _tokens_project(tmp_path / "proj", declaration, params)
    result = proj.build()
    assert result.ok, result.outcomes["r:bench"].error
    report = json.loads(proj.read("build/r/bench/benchmark.json"))
    assert report["inputs"] == {"tokens": {"shape": shape, "dtype": "int64"}}
    assert report["batch"] == shape[0]


def test_an_input_sized_by_another_inputs_declaration_is_declared(tmp_path):
    """mask shares tokens' dims by name: declaring tokens sizes mask too, as the model needs."""
    proj = _tokens_project(tmp_path / "proj", "[inputs.tokens]\nshape = [1, 24]\n")
    tokens_model(proj.root / "tokens.onnx", mask=True)
    result = proj.build()
    assert result.ok, result.outcomes["r:bench"].error
    report = json.loads(proj.read("build/r/bench/benchmark.json"))
    assert report["inputs"] == {"tokens": {"shape": [1, 24], "dtype": "int64"},
                                "mask": {"shape": [1, 24], "dtype": "int64"}}
