"""The log of a failed step, kept in build/.logs/<recipe>/<step>.log, says why it failed: the
traceback and all the tool printed, warned or logged. It goes once the step succeeds, or
once the project no longer has the step; nothing else there is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugins.projects import CONFIG, PIPELINE, ProjectDir

CHATTY_KINDS = '''
import logging
import os
import warnings

from optbuild.common.errors import StepError
from optbuild.steps.base import Step, StepParams, StepRef


class ChattyParams(StepParams):
    input: StepRef
    crash: bool = False


class Chatty(Step):
    """Writes as tools do (print, a C library's stderr, a warning, logging), then fails
    with a StepError or, with crash, dies as a native library would."""

    Params = ChattyParams

    def run(self, ctx):
        print("tool: printed on stdout")
        os.write(2, b"tool: written by C code on fd 2\\n")
        warnings.warn("tool: a warning", UserWarning)
        logging.getLogger("sometool").info("tool: an INFO record")
        if self.params.crash:
            os.abort()
        raise StepError("chatty gave up")
'''


def chatty_project(root: Path, crash: bool, monkeypatch: pytest.MonkeyPatch) -> ProjectDir:
    """A recipe noisy: src -> talk (a Chatty step). Workers start as in a plain shell: with
    Python's default buffering of stdout, where a crash loses what was not flushed."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    proj = ProjectDir.with_test_kinds(root)
    proj.write("chatty.py", CHATTY_KINDS)
    proj.write("optbuild.toml", CONFIG.replace("[kinds]\n", '[kinds]\nchatty = "chatty.py:Chatty"\n'))
    proj.write("recipes/noisy.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n'
               f'[steps.talk]\nkind = "chatty"\ninput = "src"\ncrash = {str(crash).lower()}\n')
    return proj


def failing(project: ProjectDir, step: str) -> None:
    """Make chain:<step> fail (a StepError, an expected failure)."""
    text = project.read("recipes/chain.toml")
    project.write("recipes/chain.toml", text.replace(f"[steps.{step}]\n", f"[steps.{step}]\nfail = true\n"))


def test_an_expected_failure_keeps_its_traceback_in_the_log_and_a_short_console_message(project):
    failing(project, "mid")
    run = project.cli("build")
    assert run.returncode == 1
    log = project.read("build/.logs/chain/mid.log")
    assert "Traceback (most recent call last)" in log
    assert 'raise StepError("asked to fail")' in log and "StepError: asked to fail" in log
    assert "asked to fail" in run.stderr and "build/.logs/chain/mid.log" in run.stderr
    assert "--- log tail ---" not in run.stderr and "Traceback" not in run.stderr


def test_what_a_tool_prints_warns_and_logs_reaches_the_log_in_order(tmp_path, monkeypatch):
    proj = chatty_project(tmp_path / "proj", False, monkeypatch)
    result = proj.build()
    assert result.outcomes["noisy:talk"].status == "failed"
    log = proj.read("build/.logs/noisy/talk.log")
    lines = ["tool: printed on stdout", "tool: written by C code on fd 2", "UserWarning: tool: a warning",
             "INFO sometool: tool: an INFO record", "Traceback (most recent call last)",
             "StepError: chatty gave up"]
    for line in lines:
        assert line in log, (line, log)
    assert [log.index(line) for line in lines] == sorted(log.index(line) for line in lines), log


def test_a_native_crash_leaves_what_was_printed_and_the_python_stack_in_the_log(tmp_path, monkeypatch):
    proj = chatty_project(tmp_path / "proj", True, monkeypatch)
    result = proj.build()
    assert "step process died (signal 6)" in result.outcomes["noisy:talk"].error
    log = proj.read("build/.logs/noisy/talk.log")
    assert "tool: printed on stdout" in log  # not lost in a buffer when the process died
    assert "INFO sometool: tool: an INFO record" in log
    assert "Fatal Python error: Aborted" in log
    assert 'chatty.py", line' in log and "in run" in log  # where it crashed


def test_a_log_goes_once_its_step_builds_or_is_cached_again_but_not_on_a_plan(project):
    assert project.build().ok
    failing(project, "mid")
    failing(project, "side")
    assert not project.build(keep_going=True).ok
    logs = project.root / "build/.logs/chain"
    assert sorted(p.name for p in logs.iterdir()) == ["mid.log", "side.log"]
    project.write("recipes/chain.toml", PIPELINE)  # both back to what the cache holds
    assert project.cli("plan").returncode == 0
    assert sorted(p.name for p in logs.iterdir()) == ["mid.log", "side.log"]  # a plan writes nothing
    result = project.build(["chain:mid"])
    assert result.steps("cached") == ["chain:src", "chain:mid"]
    assert sorted(p.name for p in logs.iterdir()) == ["side.log"]  # side was not selected: kept
    project.write("recipes/chain.toml", PIPELINE.replace('"-side"', '"-side2"'))
    assert project.build().steps("built") == ["chain:side"]
    assert not logs.exists()


def test_only_logs_of_steps_the_project_no_longer_has_are_removed_and_nothing_else(project, tmp_path):
    """Only a log optbuild recorded writing goes: a file named like the log of a step the
    project no longer has, put there by hand, stays (store.written)."""
    failing(project, "mid")
    project.write("recipes/oldrecipe.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
                  '[steps.export]\nkind = "join"\ninput = "src"\nfail = true\n')
    assert not project.build(keep_going=True).ok
    (project.root / "recipes/oldrecipe.toml").unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.log").write_text("not optbuild's")
    logs = project.root / "build/.logs"
    gone = [logs / "oldrecipe/export.log"]
    kept = [logs / "chain/notes.txt", logs / "chain/removed.log", logs / "chain/mid.log", logs / "stray.log",
            project.root / "build/other.log"]
    for path in kept:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("old")
    assert all(path.exists() for path in gone)
    (logs / "linked").symlink_to(outside)  # a folder link: not followed
    (logs / "chain/linked.log").symlink_to(outside / "keep.log")  # a file link: not touched
    result = project.build(["chain:side"])
    assert result.ok and "chain:mid" not in result.outcomes
    assert not any(path.exists() for path in gone) and not (logs / "oldrecipe").exists()
    assert all(path.exists() for path in kept)
    assert (logs / "chain/linked.log").is_symlink() and (outside / "keep.log").read_text() == "not optbuild's"
