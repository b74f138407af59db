"""optbuild bench: real builds of the transformer example, real onnxruntime and PyTorch runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest
from plugins.projects import REPO, ProjectDir

pytestmark = pytest.mark.slow

FAST = ("--runs", "5", "--warmup", "1", "--threads", "1")


def _example(root) -> ProjectDir:
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    return ProjectDir(root)


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> ProjectDir:
    return _example(tmp_path_factory.mktemp("bench"))


@pytest.fixture(scope="module")
def benched(examples) -> dict:
    """`optbuild bench transformer --json` on an unbuilt copy: it builds, then measures."""
    run = examples.cli("bench", "transformer", *FAST, "--json")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    return json.loads(run.stdout)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _umask_mode() -> int:
    """What open() gives a new file under this process's umask (0o644 under 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _rows(result: dict) -> dict[tuple[str, str], dict]:
    return {(row["runtime"], row["step"].split(":", 1)[1]): row for row in result["rows"]}


def test_bench_builds_then_measures_every_model_of_the_recipe(examples, benched):
    (result,) = benched["recipes"]
    assert result["recipe"] == "transformer"
    rows = _rows(result)
    expected = {
        ("torch", "export"): "PyTorch eager",
        ("onnxruntime", "simplify"): "ORT fp32",
        ("onnxruntime", "engine_ort"): "ORT-optimized fp32",
        ("onnxruntime", "quantize_dynamic"): "ORT dynamic INT8",
        ("onnxruntime", "quantize_int8"): "ORT static INT8",
    }
    for key, label in expected.items():
        assert key in rows, f"no row for {key}: {sorted(rows)}"
        assert rows[key]["label"] == label
    for row in result["rows"]:
        latency = row["latency_ms"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"], row
        assert row["throughput"] > 0 and row["batch"] == 1
        assert row["speedup"] > 0
    # the TensorRT-RTX engines and the non-model steps are skipped, with a note
    assert not any(step.startswith("rtx[") for _, step in rows)
    assert any("TensorRT-RTX" in note and "rtx[fp32]" in note for note in result["notes"])
    assert result["baseline"] == {"step": "transformer:simplify", "runtime": "onnxruntime"}
    assert result["settings"]["threads"] == 1 and result["settings"]["runs"] == 5
    # each row says what ran it (the backend's runner, with its version); the host lists them
    assert rows[("onnxruntime", "simplify")]["runner"].startswith("onnxruntime ")
    assert result["host"]["runtimes"] == [rows[("onnxruntime", "simplify")]["runner"]]
    # PyTorch and the exported model see the same inputs: token ids of the declared shape
    assert rows[("torch", "export")]["inputs"] == rows[("onnxruntime", "export")]["inputs"] \
        == {"tokens": {"shape": [1, 32], "dtype": "int64"}}


def test_verify_figures_sit_beside_the_int8_rows(benched):
    rows = _rows(benched["recipes"][0])
    for step, verify in (("quantize_int8", "verify[int8]"), ("quantize_dynamic", "verify[dynamic]")):
        (figures,) = rows[("onnxruntime", step)]["verify"]
        assert figures["step"] == f"transformer:{verify}"
        assert figures["reference"] == "transformer:simplify"
        assert 0.99 <= figures["cosine"] <= 1.0 and 0 <= figures["max_abs"] <= 0.03
        assert figures["passed"] is True and figures["samples"] == 64
    assert rows[("onnxruntime", "simplify")]["verify"] == []


def test_bench_json_is_written_beside_the_artifacts(examples, benched):
    written = json.loads((examples.root / "build/transformer/bench.json").read_text())
    assert _mode(examples.root / "build/transformer/bench.json") == _umask_mode()
    (printed,) = benched["recipes"]
    assert written["rows"] == printed["rows"] and written["version"] == 2
    assert written["rows"][0]["artifact"] == "recipes/models/transformer.py"
    assert (examples.root / written["rows"][1]["artifact"]).is_file()


def test_plain_table_with_no_build_once_built(examples, benched):
    run = examples.cli("bench", "transformer", "--no-build", *FAST)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("transformer: batch 1, 1 thread, 5 timed runs after 1 warm-up")
    header = lines[1].split()
    assert header[:5] == ["model", "step", "size", "p50", "ms"]
    assert re.search(r" \d+\.\d (KiB|MiB) ", row := next(line for line in lines if "ORT fp32" in line)), row
    table = "\n".join(lines)
    for label in ("PyTorch eager", "ORT fp32", "ORT-optimized fp32", "ORT dynamic INT8", "ORT static INT8"):
        assert label in table
    static = next(line for line in lines if " quantize_int8 " in line)
    assert "verify[int8]" in static and "0.99" in static
    assert "written: " in table and "bench.json" in table


def test_progress_goes_to_stderr_a_line_per_model_as_it_is_measured(examples, benched):
    run = examples.cli("bench", "transformer", "--no-build", "--json", *FAST)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["recipes"][0]["recipe"] == "transformer"  # stdout: the results only
    lines = run.stderr.splitlines()
    assert "bench transformer: 8 models, 1 warm-up + 5 timed runs each, batch 1, threads 1" in lines
    for name in ("transformer:export (torch)", "transformer:export (onnxruntime)",
                 "transformer:quantize_int8 (onnxruntime)"):
        load, warmup = lines.index(f"  load     {name}"), lines.index(f"  warm-up  {name}")
        measured = next(i for i, line in enumerate(lines) if line.startswith(f"  measured {name}  p50 "))
        assert load < warmup < lines.index("  timing   8 models: 5 runs each, interleaved in 5 rounds") < measured


def test_a_step_target_and_the_plot(examples, benched):
    pytest.importorskip("matplotlib")
    from optbuild import api
    from optbuild.app.bench import BenchOptions, bench
    from optbuild.cli.bench.present import write_plots

    ws = api.open_workspace(examples.root)
    try:
        (result,) = bench(ws, ["transformer:quantize_int8"], BenchOptions(runs=3, warmup=0, threads=1, build=False))
    finally:
        ws.close()
    write_plots([result])  # what `optbuild bench --plot` adds
    assert [(row.runtime, row.step) for row in result.rows] == [("onnxruntime", "transformer:quantize_int8")]
    assert result.rows[0].verify[0]["step"] == "transformer:verify[int8]"
    assert result.plot_file == examples.root / "build/transformer/bench.png"
    assert result.plot_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _mode(result.plot_file) == _umask_mode(), "not mkstemp's 0600: the team shares the report"


def test_no_build_on_an_unbuilt_project_fails_clearly(tmp_path):
    fresh = _example(tmp_path)
    run = fresh.cli("bench", "transformer", "--no-build", *FAST)
    assert run.returncode == 2
    assert "error: --no-build:" in run.stderr and "transformer:export  (never built)" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (fresh.root / "build/transformer/bench.json").exists()


@pytest.mark.parametrize(("target", "message"), [
    ("transformr", "error: unknown target 'transformr'; did you mean 'transformer'?"),
    ("transformer:simplfy", "error: unknown target 'transformer:simplfy'; did you mean 'transformer:simplify'?"),
    ("transformer:rtx[int8]", "error: transformer:rtx[int8] is a TensorRT-RTX engine (model.engine)"),
    # the one target grammar (StepGraph.target): a matrix step names its instances, as in build and plan
    ("transformer:rtx", "error: transformer:rtx[fp32] is a TensorRT-RTX engine (model.engine)"),
    ("transformer:calibrate", "error: transformer:calibrate is a calibrate step"),
])
def test_targets_that_cannot_be_benched_are_clear_errors(examples, target, message):
    run = examples.cli("bench", target)
    assert run.returncode == 2, run.stdout
    assert message in run.stderr and "Traceback" not in run.stderr


def test_bench_imports_nothing_heavy_until_it_measures(examples):
    code = ("import sys; from optbuild.cli import main; rc = main(['bench', 'transformr']);"
            "heavy = [m for m in ('torch', 'onnx', 'onnxruntime', 'numpy', 'matplotlib') if m in sys.modules];"
            "print(heavy); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=examples.root, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_bench_asks_a_kind_what_it_is_instead_of_spelling_its_name():
    """A project's own kind that carries a model, checks one, builds an engine or decides its
    precision is benched as a built-in one is: bench reads the kind's traits (Step.carries_model,
    checks_model, builds_engine, precision, and an export's load_module), never a kind's name."""
    import ast

    from optbuild.steps.registry import BUILTIN

    names = set(BUILTIN) | {name.split("/")[0] for name in BUILTIN}
    compared = [(path.name, node.lineno, constant.value)  # kind == "export", kind in ("benchmark", ...)
                for path in sorted((REPO / "optbuild" / "app" / "bench").glob("*.py"))
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Compare)
                for constant in ast.walk(node) if isinstance(constant, ast.Constant) and constant.value in names]
    assert compared == []
