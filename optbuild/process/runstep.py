"""The one place where a step runs and its outputs are filed, wherever it builds.

The local builder (``optbuild.builder.local``) and a Dask node (``optbuild.distributed.task``)
both call ``run_step``: the step's spec is written in a scratch folder, a child process of
the pool runs it (``optbuild.process.child``), and its result, log and outputs are read back
there. ``file_outputs`` then moves what the step wrote into a store, under the same rules
wherever it ran: an output is a file's bytes; a step that wrote none, missed its main output
or left a symbolic link (a pointer out of the build, not content) fails. Where the entry is
then kept (the local cache, a remote one) is the caller's business.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.common.errors import DISK_FULL_ERRNOS, StepError, describe_os_error
from optbuild.common.forked import CRASH_SIGNALS
from optbuild.process.action import Action
from optbuild.process.pool import ProcessPool, StepProcess
from optbuild.process.spec import ArtifactSpec, ChildResult, ChildResultError, ChildSpec
from optbuild.store.entry import ActionEntry, OutputFile
from optbuild.store.local import LocalStore


class Cancelled(Exception):
    """The build was cancelled before or while the step ran; nothing of it was kept."""


@dataclass(frozen=True)
class StepRun:
    """One run of a step: its action, and where this host has what the step reads."""

    step_id: str
    implementation: str  # the kind's class: "module:Class" or "/path/file.py:Class"
    action: Action  # what is run is what was keyed
    base_dir: Path  # the recipe's folder
    project_root: Path
    inputs: dict[str, ArtifactSpec]  # by the parameter that names the upstream step
    primary: str | None  # the main output's name
    preload: tuple[str, ...] = ()  # modules its fork server imports first
    shares_process: bool = False  # may run in a worker that ran steps of its kind before (Step.shares_process)
    state_dir: Path | None = None  # kept across builds (calibration data caches, say)

    @property
    def kind(self) -> str:
        return self.action.kind

    @property
    def params(self) -> dict[str, Any]:
        return self.action.run_params({name: artifact.step for name, artifact in self.inputs.items()})


@dataclass(frozen=True)
class Ran:
    """A step that ran and succeeded: its outputs are in ``out_dir``, not yet filed."""

    out_dir: Path
    log: bytes
    metrics: dict[str, Any]
    duration_s: float


class StepFailed(Exception):
    """The step ran and failed: its result (its own message, whether it was expected,
    whether the same inputs would fail again) and its log."""

    def __init__(self, result: ChildResult, log: bytes):
        super().__init__(result.error or "step failed")
        self.result = result
        self.log = log


class Running:
    """The step processes running now, so that an interrupt kills them at once instead of
    waiting for each thread's next look at the cancel flag."""

    def __init__(self) -> None:
        self._procs: set[StepProcess] = set()
        self._lock = threading.Lock()

    def add(self, proc: StepProcess) -> None:
        with self._lock:
            self._procs.add(proc)

    def discard(self, proc: StepProcess) -> None:
        with self._lock:
            self._procs.discard(proc)

    def kill_all(self) -> None:
        with self._lock:
            for proc in self._procs:
                proc.kill()


# what a step's scratch folder holds: its spec, log, result, progress and outputs
SPEC, LOG, RESULT, PROGRESS, OUT = "spec.json", "step.log", "result.json", "progress", "out"


def run_step(run: StepRun, scratch: Path, pool: ProcessPool, cancel: threading.Event, *,
             running: Running | None = None, cwd: Path | None = None,
             on_progress: Callable[[str], None] | None = None) -> Ran:
    """Run ``run`` in a child process of ``pool``, in the folder ``scratch`` (its spec, log,
    result and outputs go there): an empty one, or one that ``reset_scratch`` readied.
    StepFailed when the step failed or its process died; Cancelled when ``cancel`` was set
    (the process is killed). ``on_progress`` is handed each new message the step gives
    while it runs (``StepContext.progress``)."""
    out_dir = scratch / OUT
    out_dir.mkdir(exist_ok=True)
    spec_path, log_path, result_path = scratch / SPEC, scratch / LOG, scratch / RESULT
    watch = None if on_progress is None else ProgressWatch(scratch / PROGRESS, on_progress)
    spec = ChildSpec(implementation=run.implementation, step_id=run.step_id, params=run.params,
                      base_dir=str(run.base_dir), project_root=str(run.project_root), inputs=run.inputs,
                      out_dir=str(out_dir), result=str(result_path), parent_pid=os.getpid(),
                      state_dir=None if run.state_dir is None else str(run.state_dir), missing=run.action.missing,
                      progress=None if watch is None else str(watch.path))
    spec_path.write_text(spec.to_json())
    started = time.perf_counter()
    returncode = _wait(pool.start(spec_path, log_path, run.implementation, run.preload, cancel, cwd=cwd,
                                  shares=run.shares_process),
                       cancel, running, watch)
    duration = time.perf_counter() - started
    result = read_result(result_path, returncode, scratch)
    pool.learn(run.implementation, result.imported)
    log = log_path.read_bytes()
    if not result.ok:
        raise StepFailed(result, log)
    return Ran(out_dir, log, result.metrics, duration)


def reset_scratch(scratch: Path) -> bool:
    """Ready ``scratch``, where a step ran to its end and its outputs were filed, for the
    next step, so that a build does not make and delete two folders and three files per
    step (on ext4 without a journal each new inode is checked against every recently
    deleted one). Its spec, log and result are rewritten in place by the next step: the
    result is truncated by the step's process before the step runs, and read only when that
    process exited with 0, which it does only once it wrote it whole. False when the step
    left anything else there (a private copy of its input, an output not filed): the folder
    is then removed whole."""
    try:
        with os.scandir(scratch / OUT) as left:
            if next(left, None) is not None:
                return False
        names = set(os.listdir(scratch))
        if not names <= {SPEC, LOG, RESULT, PROGRESS, OUT}:
            return False
        if PROGRESS in names:
            os.unlink(scratch / PROGRESS)
    except OSError:
        return False
    return True


class ProgressWatch:
    """What a running step last said it is doing: the file ``StepContext.progress`` replaces,
    looked at (one stat) at each poll of the process; each new message goes to ``report``."""

    MAX_CHARS = 200

    def __init__(self, path: Path, report: Callable[[str], None]) -> None:
        self.path = path
        self.report = report
        self._seen: tuple[int, int] | None = None

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_mtime_ns) == self._seen:  # replaced whole: a new inode each time
                return
            self._seen = (st.st_ino, st.st_mtime_ns)
            lines = self.path.read_text(errors="replace").strip().splitlines()
        except OSError:  # none yet
            return
        if lines:
            self.report(lines[0][:self.MAX_CHARS])


def _wait(proc: StepProcess | None, cancel: threading.Event, running: Running | None,
          watch: ProgressWatch | None = None) -> int:
    """The process's exit code; Cancelled (the process killed) once ``cancel`` is set."""
    if proc is None:
        raise Cancelled
    if running is not None:
        running.add(proc)
    try:
        while (returncode := proc.poll(0.05)) is None:
            if watch is not None:
                watch.poll()
            if cancel.is_set():
                proc.kill()
                proc.poll(None)
                raise Cancelled
    finally:
        if running is not None:
            running.discard(proc)
    if cancel.is_set():  # it ended as the build was cancelled: killed by it, most likely
        raise Cancelled
    return returncode


# signals of a native crash (a library's bug, not the step's code), and what to try
_CRASHES: dict[int, str] = {sig: f": {name}, a crash inside a native library (the log holds the Python stack where it "
                 "happened); onnxruntime that crashes at one graph optimization level may not at a lower "
                 "one: verify, benchmark and select try a model at lower levels themselves, and an onnxruntime "
                 "engine step at level = \"basic\" gives a model that they open at that level"
            for sig, name in CRASH_SIGNALS.items()}


def read_result(path: Path, returncode: int, scratch: Path) -> ChildResult:
    """What the process that exited with ``returncode`` reports in ``path`` (written in
    place by that process, which truncates it before its step runs: whole when it exited
    with 0). One that died, or left something that is not a result, gives a failed result
    saying so, never an exception."""
    if returncode in DISK_FULL_ERRNOS:  # no room for its result (see optbuild.process.child)
        full = OSError(returncode, os.strerror(returncode))
        return ChildResult(ok=False, error=describe_os_error(full, scratch), expected=True)
    if returncode != 0 or not _written(path):
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        crash = _CRASHES.get(-returncode, "")
        return ChildResult(ok=False, error=f"step process died ({how}){crash}")
    try:
        return ChildResult.from_json(path.read_bytes())
    except ChildResultError as exc:
        return ChildResult(ok=False, error=f"step process left an unreadable result ({exc})")


def _written(path: Path) -> bool:
    try:
        return os.stat(path).st_size > 0
    except FileNotFoundError:
        return False


def file_outputs(run: StepRun, ran: Ran, store: LocalStore, *, built_on: str | None = None) -> ActionEntry:
    """Move the step's outputs and log into ``store`` (blobs); the entry that names them,
    not yet stored. StepError when the outputs break the rules."""
    outputs = _store_outputs(ran.out_dir, run.primary, run.step_id, store)
    return ActionEntry(key=run.action.key, step=run.step_id, kind=run.kind, outputs=outputs, primary=run.primary,
                       ingredients=run.action.material(), log=store.put_bytes(ran.log), metrics=ran.metrics,
                       duration_s=ran.duration_s, created_at=time.time(), built_on=built_on or socket.gethostname())


def _store_outputs(out_dir: Path, primary: str | None, step_id: str, store: LocalStore) -> dict[str, OutputFile]:
    """Move every file under ``out_dir`` into ``store``; relative name -> its record."""
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() or p.is_symlink())
    if not files:
        raise StepError(f"{step_id} produced no output")
    if primary is not None and not (out_dir / primary).is_file():
        raise StepError(f"{step_id} did not write its main output {primary}")
    outputs = {}
    for path in files:
        if path.is_symlink():
            raise StepError(f"{step_id} wrote a symbolic link ({path.name}); outputs must be files")
        outputs[path.relative_to(out_dir).as_posix()] = store.put_file(path, move=True)
    return outputs
