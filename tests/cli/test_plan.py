"""`optbuild plan` tells what `optbuild build` then does: steps this host cannot run are
unavailable, not would-build, and the counts match, save where plan cannot know (a step
that stops the build, an upstream rebuild that reproduces its output), which it says."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from plugins.projects import KINDS, REPO, UNICORN, ProjectDir

HEAVY = ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "onnxsim", "onnxslim")

# src -> horn (this host cannot run it) -> after_horn; src -> mid -> out
RECIPE = """\
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.horn]
kind = "needs"
input = "src"

[steps.after_horn]
kind = "join"
input = "horn"

[steps.mid]
kind = "join"
input = "src"
suffix = "-mid"

[steps.out]
kind = "join"
input = "mid"
suffix = "-out"
"""


def _project(root) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("needs.py", UNICORN)
    proj.write("optbuild.toml", KINDS)
    proj.write("recipes/r.toml", RECIPE)
    return proj


def _counts(run) -> dict[str, int]:
    (done,) = [e for e in run.events if e.get("event") == "done"]
    return done["counts"]


def _notes(run) -> list[str]:
    return [e["message"] for e in run.events if e.get("event") == "note"]


def test_plan_shows_an_unavailable_step_behind_a_would_build_one(tmp_path):
    proj = _project(tmp_path / "proj")
    plan = proj.cli("plan", "--skip-unavailable", "--json")
    assert plan.returncode == 0, plan.stderr
    assert plan.steps("unavailable") == ["r:horn"]
    assert plan.steps("skipped") == ["r:after_horn"]
    assert plan.steps("would-build") == ["r:mid", "r:out", "r:src"]
    horn = next(e for e in plan.events if e.get("step") == "r:horn")
    assert horn["error"] == "r:horn cannot run here: needs a unicorn (none here)"
    build = proj.cli("build", "--skip-unavailable", "--json")
    assert build.returncode == 0, build.stderr
    planned = _counts(plan)
    assert {"built" if status == "would-build" else status: n for status, n in planned.items()} == _counts(build)


def test_plan_in_plain_text_on_stdout(tmp_path):
    """The plan is the command's answer: `optbuild plan | grep would-build` finds its lines."""
    proj = _project(tmp_path / "proj")
    run = proj.cli("plan", "--skip-unavailable")
    assert "  unavailable r:horn\n" in run.stdout and "  skipped  r:after_horn\n" in run.stdout
    assert ("1 step cannot run here:\n  needs a unicorn (none here)\n    1 step: r:horn\n"
            "1 step skipped:\n  upstream r:horn unavailable: r:after_horn\n") in run.stdout
    assert sorted(line.split()[1] for line in run.stdout.splitlines() if line.startswith("  would-build ")) == [
        "r:mid", "r:out", "r:src"]
    assert run.stdout.rstrip().splitlines()[-1].startswith("ok: 3 would-build, 1 unavailable, 1 skipped")
    assert "would-build" not in run.stderr and "note:" not in run.stderr  # skipped by choice: nothing stops it


def test_plan_says_when_a_step_would_stop_the_build(tmp_path):
    """Without -k or --skip-unavailable the build stops at horn; which of the steps then
    ready were started depends on timing, so plan shows every step and says so."""
    proj = _project(tmp_path / "proj")
    plan = proj.cli("plan", "--json")
    assert plan.returncode == 1
    assert plan.steps("would-build") == ["r:mid", "r:out", "r:src"]  # not "skipped: build stopped"
    assert _notes(plan) == [("r:horn cannot run here: without --skip-unavailable or -k, the build stops "
                             "there and skips the steps not started by then")]
    plain = proj.cli("plan")
    assert "note: r:horn cannot run here: without" in plain.stderr  # a diagnostic: on stderr
    assert "note:" not in plain.stdout and "FAILED: 3 would-build" in plain.stdout
    assert _notes(proj.cli("plan", "--skip-unavailable", "--json")) == []
    proj.write("optbuild.toml", KINDS + "\n[build]\nkeep_going = true\n")
    assert _notes(proj.cli("plan", "--json")) == []


def test_plan_says_steps_may_be_cached_when_their_upstream_rebuilds_the_same(tmp_path):
    proj = _project(tmp_path / "proj")
    proj.write("recipes/r.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\nupper = true\n\n'
                                 '[steps.mid]\nkind = "join"\ninput = "src"\nsuffix = "-mid"\n\n'
                                 '[steps.out]\nkind = "join"\ninput = "mid"\nsuffix = "-out"\n')
    assert proj.cli("build").returncode == 0
    proj.write("data/input.txt", "HeLLo")  # a new input; its upper-cased output is the same
    plan = proj.cli("plan", "--json")
    assert plan.steps("would-build") == ["r:mid", "r:out", "r:src"]
    assert _notes(plan) == [("2 steps come after steps that will build: their keys are known only then, "
                             "and any whose inputs come out unchanged will be cached, not built")]
    build = proj.cli("build", "--json")
    assert build.steps("built") == ["r:src"] and build.steps("cached") == ["r:mid", "r:out"]
    assert _notes(proj.cli("plan", "--json")) == []  # nothing will build: nothing to guess


def test_plan_of_gpu_steps_on_a_host_without_a_gpu_imports_no_runtime(tmp_path):
    """NVML already says there is no GPU: deciding that the example project's CUDA engine
    steps cannot run here must not import onnxruntime (a second of a plan under load)."""
    from optbuild.common.fingerprint import Fingerprint

    if Fingerprint().get("gpu.count"):
        pytest.skip("this host has an NVIDIA GPU: its providers are probed, as they should be")
    shutil.copy(REPO / "optbuild.toml", tmp_path)
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; from optbuild.cli import main; rc = main(['plan']);"
            f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "cannot run here:\n  needs a CUDA GPU" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == "[]"
