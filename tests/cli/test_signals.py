"""SIGTERM ends a build as Ctrl-C does, at once and cleanly; a worker that gets SIGTERM
itself ends at once; a reader that closes the pipe ends a command quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from plugins.processes import alive, reaped
from plugins.projects import CONFIG, ProjectDir

from optbuild.cli import main
from optbuild.common.digest import FileHasher
from optbuild.store.local import LocalStore

NAP_KINDS = '''
import os
import time
from pathlib import Path

from optbuild.steps.base import Step, StepParams, StepRef


class NapParams(StepParams):
    input: StepRef
    seconds: float = 60


class Nap(Step):
    """A long step caught half-way: writes part of its output, records its pid in a file
    named after it in $NAP_PIDS, then sleeps."""

    Params = NapParams
    primary_output = "data.txt"

    def run(self, ctx):
        (ctx.out_dir / "data.txt").write_text("half")
        (Path(os.environ["NAP_PIDS"]) / str(os.getpid())).touch()
        time.sleep(self.params.seconds)


class SharedNap(Nap):
    """A nap whose steps share a worker process (Step.shares_process)."""

    shares_process = True
'''

INTERRUPTED = "interrupted: the steps that had finished are kept"


def nap_project(root: Path, seconds: float, kind: str = "Nap") -> ProjectDir:
    """Recipe naps: src, then two naps side by side (jobs = 2)."""
    proj = ProjectDir.with_test_kinds(root)
    proj.write("nap.py", NAP_KINDS)
    proj.write("optbuild.toml", CONFIG.replace("[kinds]\n", f'[kinds]\nnap = "nap.py:{kind}"\n'))
    proj.write("recipes/naps.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
               + "".join(f'\n[steps.{n}]\nkind = "nap"\ninput = "src"\nseconds = {seconds + i}\n'
                         for i, n in enumerate("ab")))  # keys apart: one key builds once at a time
    return proj


def wait_for_pids(folder: Path, count: int, proc: subprocess.Popen | None = None) -> list[int]:
    """The pids of the first ``count`` naps, once they are all sleeping."""
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
        assert proc is None or proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pids = [int(p.name) for p in folder.iterdir()]
    assert len(pids) == count, "the naps did not start"
    return pids


def assert_left_clean(proj: ProjectDir) -> None:
    """Finished steps kept; nothing of the naps: no scratch folder, entry, output or failure
    log (they were cancelled, not failed)."""
    store = LocalStore(proj.root / "cache", FileHasher(None))
    assert [e.step for _, e in store.iter_entries()] == ["naps:src"]
    assert proj.read("build/naps/src/data.txt") == "hello"
    assert not any((proj.root / "cache/tmp").iterdir())
    assert not (proj.root / "build/naps/a").exists() and not (proj.root / "build/naps/b").exists()
    assert not (proj.root / "build/.logs").exists()


def assert_cancelled(stderr: str) -> None:
    """The running naps read as cancelled, as the user asked, not as failures."""
    assert "skipped  naps:a  (cancelled)" in stderr and "skipped  naps:b  (cancelled)" in stderr
    assert "failed" not in stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("signum", "status", "kind"), [(signal.SIGTERM, 143, "Nap"), (signal.SIGHUP, 129, "Nap"),
                                                        (signal.SIGTERM, 143, "SharedNap")],
                         ids=["SIGTERM", "SIGHUP (its terminal closed)", "SIGTERM, steps in shared workers"])
def test_sigterm_stops_the_build_at_once_kills_its_workers_and_leaves_nothing_half_done(tmp_path, signum, status,
                                                                                         kind):
    proj = nap_project(tmp_path / "proj", seconds=60, kind=kind)
    pids = tmp_path / "pids"
    pids.mkdir()
    with reaped(proj.popen("build", env={"NAP_PIDS": str(pids)})) as proc:
        workers = wait_for_pids(pids, 2, proc)
        sent = time.monotonic()
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 10
    assert proc.returncode == status, stderr
    assert INTERRUPTED in stderr and "Traceback" not in stderr
    assert_cancelled(stderr)
    assert not any(alive(pid) for pid in workers)
    assert_left_clean(proj)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_at_a_terminal_reaches_every_process_and_still_reads_as_a_cancel(tmp_path):
    """A terminal sends SIGINT to the whole foreground process group, the steps' processes
    included: they leave it to the builder, which cancels them, so no step reads as failed."""
    proj = nap_project(tmp_path / "proj", seconds=60)
    pids = tmp_path / "pids"
    pids.mkdir()
    build = subprocess.Popen([sys.executable, "-m", "optbuild.cli", "build"], cwd=proj.root, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "NAP_PIDS": str(pids)},
                             process_group=0)  # a job of its own, as a shell starts it
    with reaped(build) as proc:
        workers = wait_for_pids(pids, 2, proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert INTERRUPTED in stderr and "Traceback" not in stderr
    assert_cancelled(stderr)
    assert not any(alive(pid) for pid in workers)
    assert_left_clean(proj)


def test_sigterm_in_main_returns_143_and_puts_back_the_handler_it_found(tmp_path, monkeypatch, capsys):
    proj = nap_project(tmp_path / "proj", seconds=15)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("NAP_PIDS", str(pids))
    calls: list[int] = []

    def found(signum: int, frame: object) -> None:
        calls.append(signum)

    def terminate_once_napping() -> None:
        wait_for_pids(pids, 2)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, found)
    try:
        sender = threading.Thread(target=terminate_once_napping)
        sender.start()
        status = main(["-C", str(proj.root), "build"])
        sender.join(timeout=60)
        assert signal.getsignal(signal.SIGTERM) is found
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == 143 and calls == []
    assert INTERRUPTED in capsys.readouterr().err
    assert_left_clean(proj)


BUILD_IGNORING_SIGTERM = """
import signal, sys
from optbuild import api
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as under a supervisor that ignores it
ws = api.open_workspace()
result = api.build(ws)
print(result.outcomes["naps:a"].error)
sys.exit(0 if result.ok else 1)
"""


def test_a_worker_ends_at_once_on_sigterm_even_when_its_builder_ignores_it(tmp_path):
    proj = nap_project(tmp_path / "proj", seconds=60)
    proj.write("recipes/naps.toml", proj.read("recipes/naps.toml").split("\n[steps.b]")[0])
    pids = tmp_path / "pids"
    pids.mkdir()
    with reaped(subprocess.Popen([sys.executable, "-c", BUILD_IGNORING_SIGTERM], cwd=proj.root,
                                 env={**os.environ, "NAP_PIDS": str(pids)}, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)) as proc:
        [worker] = wait_for_pids(pids, 1, proc)
        os.kill(worker, signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode == 1, output
    assert "step process died (signal 15)" in output
    assert (proj.root / "build/.logs/naps/a.log").exists()


@pytest.mark.parametrize("args", [["kinds"], ["cache", "ls"]], ids=" ".join)
def test_a_closed_pipe_on_stdout_ends_the_command_quietly_with_141(project, args):
    assert project.build().ok  # cache ls has entries to list
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `| head -1` does once it has its line
    try:
        proc = subprocess.run([sys.executable, "-m", "optbuild", *args], cwd=project.root, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_a_build_whose_stdout_reader_left_ends_quietly_with_141(project):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "optbuild", "build", "--json"], cwd=project.root,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")
