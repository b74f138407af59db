"""A step that failed in its own code fails the same way on the same key: it is remembered,
reported without running again until its key changes or --retry-failed, and a step can be
parked with enabled = false."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from plugins.projects import CliRun, ProjectDir

FAILING = """
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.bad]
kind = "join"
input = "src"
sleep = 0.01
fail = true

[steps.after]
kind = "join"
input = "bad"

[steps.side]
kind = "join"
input = "src"
suffix = "-side"
"""


@pytest.fixture
def failing(project: ProjectDir) -> ProjectDir:
    project.write("recipes/f.toml", FAILING)
    return project


def build(project: ProjectDir, marker: Path, *args: str):
    """``optbuild build f -k --json``; ``marker`` appears when a sleeping step starts."""
    marker.unlink(missing_ok=True)
    env = {**os.environ, "OPTBUILD_TEST_STARTED": str(marker)}
    proc = project.popen("build", "f", "-k", "--json", *args, env=env)
    stdout, stderr = proc.communicate(timeout=120)
    return CliRun(proc.returncode, stdout, stderr)


def test_a_failure_is_remembered_and_not_run_again(failing, tmp_path):
    marker = tmp_path / "started"
    first = build(failing, marker)
    assert first.returncode == 1 and marker.exists()
    assert first.steps("failed") == ["f:bad"]
    second = build(failing, marker)
    assert second.returncode == 1
    assert not marker.exists(), "the failing step ran again"
    (event,) = [e for e in second.events if e.get("step") == "f:bad" and e["status"] == "failed"]
    assert event["error"].startswith("asked to fail")
    assert "remembered: it failed this way on" in event["error"] and "--retry-failed" in event["error"]
    assert event["reasons"] == ["failed before with this key"]
    assert second.steps("cached") == ["f:side", "f:src"]
    assert second.steps("skipped") == ["f:after"]
    assert (failing.root / "build/.logs/f/bad.log").read_text().count("asked to fail") >= 1


def test_plan_shows_the_remembered_failure_with_its_message(failing, tmp_path):
    build(failing, tmp_path / "started")
    plan = failing.cli("plan", "f", "--json")
    (event,) = [e for e in plan.events if e.get("step") == "f:bad"]
    assert event["status"] == "failed" and event["error"].startswith("asked to fail")


def test_retry_failed_runs_it_and_a_changed_key_runs_it(failing, tmp_path):
    marker = tmp_path / "started"
    build(failing, marker)
    retried = build(failing, marker, "--retry-failed")
    assert marker.exists() and retried.steps("failed") == ["f:bad"]
    failing.write("recipes/f.toml", FAILING.replace("sleep = 0.01\nfail = true", "sleep = 0.01"))
    fixed = build(failing, marker)
    assert marker.exists() and fixed.returncode == 0
    assert fixed.steps("built") == ["f:after", "f:bad"]


def test_gc_forgets_failures_older_than_a_week_and_they_run_again(failing, tmp_path):
    marker = tmp_path / "started"
    build(failing, marker)
    (record,) = (failing.root / "cache" / "failed").iterdir()
    week_and_a_day = time.time() - 8 * 24 * 3600
    gc = failing.cli("cache", "gc")
    assert gc.returncode == 0 and "forgot" not in gc.stdout  # a recent one stays
    os.utime(record, (week_and_a_day, week_and_a_day))
    gc = failing.cli("cache", "gc")
    assert gc.returncode == 0, gc.stderr
    assert "forgot 1 remembered failure older than a week" in gc.stdout
    assert not record.exists()
    again = build(failing, marker)
    assert marker.exists() and again.steps("failed") == ["f:bad"]  # ran, not recalled


def test_a_crash_is_not_remembered(project, tmp_path):
    """A killed worker may not repeat (memory, a signal): the next build tries again."""
    project.write("recipes/c.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n'
                                    '[steps.boom]\nkind = "crash"\ninput = "src"\n')
    for _ in range(2):
        run = project.cli("build", "c", "--json")
        (event,) = [e for e in run.events if e.get("step") == "c:boom" and e["status"] == "failed"]
        assert "step process died" in event["error"]


def test_a_parked_step_and_its_dependents_are_skipped_and_the_build_is_ok(failing, tmp_path):
    failing.write("recipes/f.toml", FAILING.replace("[steps.bad]\n", "[steps.bad]\nenabled = false\n"))
    run = build(failing, tmp_path / "started")
    assert run.returncode == 0, run.stderr
    skipped = {e["step"]: e["reasons"] for e in run.events if e.get("status") == "skipped"}
    assert skipped == {"f:bad": ["disabled (enabled = false in f.toml)"],
                       "f:after": ["upstream f:bad is disabled"]}
    assert run.steps("built") == ["f:side", "f:src"]


def test_enabled_must_be_a_boolean(failing):
    failing.write("recipes/f.toml", FAILING.replace("[steps.bad]\n", '[steps.bad]\nenabled = "no"\n'))
    run = failing.cli("plan", "f")
    assert run.returncode == 2
    assert "f.toml:7: steps.bad.enabled: expected true or false, got 'no'" in run.stderr
