"""Work run in a forked child (optbuild.model.isolation): real processes, real crashes. A
native crash (here ctypes reading address 0: SIGSEGV) ends the child only and is tried again
at the next attempt; a Python exception is raised again as it was, never retried; the child
does not outlive a parent that is killed (a cancelled step)."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import pytest

from optbuild.model.isolation import (
    ChildDied,
    Crash,
    Crashed,
    IsolatedError,
    along,
    opened_stack,
    run_isolated,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
LEVELS = ["all", "extended", "basic", "disable"]


def segfault() -> None:
    faulthandler.disable()  # pytest's would print the stack to the terminal, past its capture
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def test_a_crash_at_the_first_attempt_is_retried_at_the_next(tmp_path):
    def work(level: str, stage) -> tuple[int, str]:
        stage(f"loading at {level}")
        if level == "all":
            segfault()
        return os.getpid(), level

    got = run_isolated(work, "all", retry=along(LEVELS))
    assert got.value[1] == "extended" and got.attempt == "extended"
    assert got.value[0] != os.getpid()  # it ran in a child
    assert got.crashes == [Crash("all", "SIGSEGV", "loading at all")]


def test_nothing_crashing_runs_once_and_returns_the_value():
    got = run_isolated(lambda attempt, stage: {"figures": [1.5, 2.0], "attempt": attempt}, "all",
                       retry=along(LEVELS))
    assert got.value == {"figures": [1.5, 2.0], "attempt": "all"} and got.crashes == []


def test_a_crash_at_every_attempt_names_each_one_tried():
    def work(level: str, stage) -> None:
        stage("running the candidate")
        segfault()

    with pytest.raises(Crashed) as info:
        run_isolated(work, "all", retry=along(LEVELS), describe=lambda level: f"level {level}", what="the check")
    message = str(info.value)
    assert message.startswith("the check crashed (SIGSEGV)")
    for level in LEVELS:
        assert f"level {level}: SIGSEGV while running the candidate" in message
    assert [c.attempt for c in info.value.crashes] == LEVELS


class CrashingAtClose:
    """A runtime whose teardown crashes (as OpenVINO's destructor once did), after its figures."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        segfault()

    def __del__(self) -> None:
        segfault()


def test_a_runtime_whose_teardown_crashes_costs_the_isolated_work_nothing_once_measured():
    def work(attempt: str, stage) -> dict:
        with opened_stack() as stack:
            stack.enter_context(CrashingAtClose())
            stage("running the candidate")
            figures = {"p50_ms": 1.25}
        return figures  # the runtime is neither closed nor freed: the child's exit frees it

    got = run_isolated(work, "all")
    assert got.value == {"p50_ms": 1.25} and got.crashes == []


def test_in_this_process_what_the_work_opened_is_closed_on_leaving():
    closed = []
    with opened_stack() as stack:
        stack.callback(closed.append, "the runtime")
    assert closed == ["the runtime"]


def test_a_crash_without_a_retry_is_not_tried_again():
    with pytest.raises(Crashed) as info:
        run_isolated(lambda attempt, stage: segfault(), "all")
    assert [c.attempt for c in info.value.crashes] == ["all"]


def test_a_python_exception_is_raised_again_as_it_was_and_not_retried(tmp_path):
    tried = tmp_path / "tried"

    def work(level: str, stage) -> None:
        with tried.open("a") as out:
            out.write(level + "\n")
        raise ValueError(f"bad sample 3 at {level}")

    with pytest.raises(ValueError, match="^bad sample 3 at all$"):
        run_isolated(work, "all", retry=along(LEVELS))
    assert tried.read_text() == "all\n"


def test_an_exception_that_does_not_pickle_keeps_its_type_name_and_message():
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a} and {b}")

    def work(attempt, stage) -> None:
        raise Odd("this", "that")

    with pytest.raises(IsolatedError, match="^Odd: this and that$"):
        run_isolated(work, None)


def test_the_childs_traceback_with_its_cause_goes_to_stderr(capfd):
    def work(attempt, stage) -> None:
        try:
            {}["the hidden cause"]
        except KeyError:
            raise RuntimeError("the visible error") from None

    with pytest.raises(RuntimeError):
        run_isolated(work, None)
    err = capfd.readouterr().err
    assert "the hidden cause" in err and "the visible error" in err


def test_another_death_is_not_retried(tmp_path):
    def killed(attempt, stage) -> None:
        stage("reading")
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(ChildDied, match=r"died \(SIGKILL\) while reading") as info:
        run_isolated(killed, "all", retry=along(LEVELS))
    assert not isinstance(info.value, Crashed)
    with pytest.raises(ChildDied, match=r"exit code 3, no value"):
        run_isolated(lambda attempt, stage: os._exit(3), "all", retry=along(LEVELS))


def test_a_value_past_the_bound_is_refused():
    with pytest.raises(ChildDied, match="more than the 1000 bound"):
        run_isolated(lambda attempt, stage: b"x" * 5000, None, max_bytes=1000)


CHILD = """
import os, sys, time
from optbuild.model.isolation import run_isolated

def work(attempt, stage):
    with open(sys.argv[1] + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(120)

run_isolated(work, None)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def test_the_child_does_not_outlive_a_killed_parent(tmp_path):
    pid_file = tmp_path / "grandchild"
    parent = subprocess.Popen([sys.executable, "-c", CHILD, str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert parent.poll() is None and time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        assert _alive(grandchild)
        parent.kill()  # as a cancelled build kills the step's process
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the child outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
