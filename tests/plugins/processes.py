"""Processes in tests (a pytest plugin): their state read from /proc, and the build servers
(optbuild.cli.buildserver) a test starts, each ended after it; none outlives the session."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and ")")."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (S sleeping, T stopped, Z zombie...); "X" if gone."""
    try:
        return _stat(pid)[0]
    except FileNotFoundError:
        return "X"


def parents(pids: list[int]) -> list[int]:
    """The parents of ``pids``, each once."""
    return sorted({int(_stat(pid)[1]) for pid in pids})


@contextlib.contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc``, killed (if it still runs) and waited for on the way out, whatever the block did."""
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def alive(pid: int) -> bool:
    """Running, neither gone nor a zombie waiting to be reaped."""
    return process_state(pid) not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def wait_state(pids: list[int], wanted: str, timeout: float = 10) -> bool:
    """Whether every one of ``pids`` reached the state ``wanted`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(process_state(p) == wanted for p in pids):
            return True
        time.sleep(0.05)
    return False


def server_processes(root: Path, *, below: bool = False) -> list[int]:
    """The build servers of the project at ``root`` (``below``: of any project under it),
    found by their command line: one may be starting, or ending, and not answer."""
    wanted = os.path.realpath(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"optbuild.cli.buildserver" in a for a in args) and any(
                a == wanted or (below and a.startswith(wanted + b"/")) for a in args):
            found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def end(pids: list[int]) -> list[int]:
    """SIGTERM every 2 s (a server stops as when idle; one still cleaning up a cancelled build
    ignores it until that is done; a stopped one is continued to act on it), then SIGKILL
    for those still there after 20 s (their fork servers die with them); the pids that
    needed it."""
    deadline = time.monotonic() + 20
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGCONT)
        wait_gone(left, 2)
    stuck = [pid for pid in pids if alive(pid)]
    for pid in stuck:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stuck


@pytest.fixture
def servers():
    """Project roots whose servers the test may start: each ended after it."""
    roots: list[Path] = []
    yield roots
    stuck = [root for root in roots if end(server_processes(root))]
    assert not stuck, f"build servers that did not stop: {stuck}"


@pytest.fixture(scope="session", autouse=True)
def no_build_server_outlives_the_tests(tmp_path_factory):
    """A server started where a test did not ask for one (conftest turns them off) would
    wait 15 minutes for its next build: found, ended, and reported."""
    yield
    if sys.platform.startswith("linux"):
        left = server_processes(tmp_path_factory.getbasetemp(), below=True)
        end(left)
        assert not left, f"build servers left running by the tests: pids {left}"
