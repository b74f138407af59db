"""The command line: subcommands, output formats and the light start-up path."""

from __future__ import annotations

import json
import subprocess
import sys


def test_build_then_noop_build_via_cli(project):
    first = project.cli("build", "--json")
    assert first.returncode == 0, first.stderr
    assert first.steps("built") == ["chain:mid", "chain:out", "chain:side", "chain:src"]
    second = project.cli("build", "--json")
    assert second.steps("built") == [] and len(second.steps("cached")) == 4
    assert json.loads((project.root / "optbuild.lock").read_text())["steps"]["chain:out"]["key"]


def test_plain_output_is_readable(project):
    run = project.cli("build")
    assert "built    chain:src" in run.stderr and "ok: 4 built" in run.stderr


def test_plan_does_not_build(project):
    run = project.cli("plan", "--json")
    assert run.returncode == 0
    assert run.steps("would-build") == ["chain:mid", "chain:out", "chain:side", "chain:src"]
    assert not (project.root / "build").exists()


def test_graph_formats(project):
    dot = project.cli("graph").stdout
    assert dot.startswith("digraph optbuild") and '"chain:src" -> "chain:mid";' in dot
    mermaid = project.cli("graph", "--format", "mermaid", "chain:out").stdout
    assert mermaid.startswith("flowchart LR") and "chain:side" not in mermaid


def test_explain_shows_ingredients_and_provenance(project):
    project.cli("build")
    info = json.loads(project.cli("explain", "chain:mid", "--json").stdout)
    assert info["status"] == "cached"
    assert info["ingredients"]["params"]["suffix"] == "-mid"
    assert info["ingredients"]["tools"]["pydantic"]
    assert info["ingredients"]["host"] == {"os.name": "Linux"}
    assert info["provenance"]["outputs"]["data.txt"]["size"] == len("hello-mid")
    text = project.cli("explain", "chain:mid").stdout
    assert "suffix" in text and "built:" in text


def test_unknown_target_is_a_clear_error(project):
    run = project.cli("build", "chain:outt")
    assert run.returncode == 2 and "unknown target 'chain:outt'; did you mean 'chain:out'?" in run.stderr


def test_cache_ls_verify_gc_and_clean(project):
    project.cli("build")
    listing = project.cli("cache", "ls").stdout
    assert "chain:out" in listing
    assert project.cli("cache", "verify").returncode == 0
    gc = project.cli("cache", "gc", "--max-size", "0", "--include-locked", "--grace-minutes", "0")
    assert gc.returncode == 0
    assert "chain:out" not in project.cli("cache", "ls").stdout
    assert project.cli("clean").returncode == 0
    assert not (project.root / "build").exists()


def test_gc_keeps_what_the_lock_file_names(project):
    project.cli("build")
    project.cli("cache", "gc", "--max-size", "0")
    assert project.cli("build", "--json").steps("built") == []


def test_noop_build_imports_no_heavy_library(project):
    project.cli("build")
    code = (
        "import sys; from optbuild.cli import main; rc = main(['build']);"
        "heavy = [m for m in ('torch', 'onnx', 'onnxruntime', 'tensorrt', 'tensorrt_rtx', 'networkx', 'onnxsim')"
        " if m in sys.modules]; print(heavy); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=project.root, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_fingerprint_prints_and_records_this_host(project, tmp_path):
    from optbuild.common.fingerprint import Fingerprint

    fields = json.loads(project.cli("fingerprint", "--json").stdout)
    assert fields["os.name"] == "Linux" and "gpu.count" in fields
    assert project.cli("fingerprint", "-o", str(tmp_path / "host.json")).returncode == 0
    recorded = Fingerprint.load(tmp_path / "host.json")
    assert recorded.get("cpu.arch") == fields["cpu.arch"]
