"""Runs one step in its own process: ``python -m optbuild.process.child SPEC.json``, or in a child
forked by ``optbuild.process.forkserver``, which calls ``serve`` as this module's ``main`` does.

A crash in a native library (onnxsim, TensorRT) kills this process, not the build. The
spec and the result travel as JSON files (``optbuild.process.spec``: ChildSpec in,
ChildResult out); stdout and stderr go to the step's log, and
everything that explains a failure is written there: the traceback of any error (expected
or not), library logging, Python warnings, and on a native crash the Python stack.

The result file's space is reserved before the step runs, so a step that fills the disk
still reports why it failed. Where even the reservation (or a result too big for it) fails
for lack of space, the process exits with that errno as its status, and the builder names
the full disk.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from optbuild.common.errors import OptbuildError, describe_os_error, is_disk_full, traceback_with_causes
from optbuild.common.fingerprint import Fingerprint
from optbuild.process.spec import ChildResult, ChildSpec
from optbuild.steps.base import PRELOADABLE, Artifact, StepContext
from optbuild.steps.registry import step_class

RESULT_RESERVE = 64 << 10  # bytes; results are small JSON (an error message, metrics)


def die_with_parent(parent: int) -> None:
    """Linux: get SIGKILL when ``parent`` (the builder, or the zygote) dies, so no orphan keeps
    building."""
    if (prctl := _prctl()) is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


@functools.cache
def _prctl() -> Any:
    """libc's prctl (Linux), loaded once: by the zygote for every child it forks."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


def run(spec: ChildSpec) -> ChildResult:
    cls = step_class(spec.implementation)
    params = cls.Params.model_validate(spec.params)
    base_dir, root = Path(spec.base_dir), Path(spec.project_root)
    step = cls(params, base_dir, root)
    inputs = {
        name: Artifact(
            step=a.step,
            dir=Path(a.dir),
            files={k: Path(v) for k, v in a.files.items()},
            primary=Path(a.primary) if a.primary else None,
        )
        for name, a in spec.inputs.items()
    }
    ctx = StepContext(
        step_id=spec.step_id,
        base_dir=base_dir,
        project_root=root,
        out_dir=Path(spec.out_dir),
        inputs=inputs,
        host=Fingerprint(),
        state_dir=Path(spec.state_dir) if spec.state_dir else None,
        missing={name: dict(entry) for name, entry in spec.missing.items()},
        progress_file=Path(spec.progress) if spec.progress else None,
    )
    started = time.perf_counter()
    try:
        step.run(ctx)
    # "repeats": the same inputs fail the same way, so the builder may remember the failure;
    # not so for a full disk or exhausted memory, which depend on the moment
    except OptbuildError as exc:
        _log_failure(exc)
        return ChildResult(ok=False, error=str(exc), expected=True, repeats=True)
    except Exception as exc:  # a bug or a tool failure: the log tail goes to the console too
        if is_disk_full(exc):  # not a bug: say which disk to make room on
            error = describe_os_error(exc, ctx.out_dir)
            _log_failure(exc, error)
            return ChildResult(ok=False, error=error, expected=True)
        _log_failure(exc)
        return ChildResult(ok=False, error=f"{type(exc).__name__}: {exc}", repeats=not isinstance(exc, MemoryError))
    return ChildResult(ok=True, metrics=ctx.metrics, run_s=time.perf_counter() - started)


def _log_failure(exc: BaseException, error: str | None = None) -> None:
    """The traceback of ``exc`` with its causes, and ``error``, into the log: also for an
    expected error, whose console message is short, as it shows where a tool raised it. A
    log on a full disk must not keep the result from saying why the step failed."""
    with contextlib.suppress(OSError):
        print(traceback_with_causes(exc), end="", file=sys.stderr)
        if error:
            print(error, file=sys.stderr)


def _imported(before: set[str]) -> list[str]:
    """The heavy tools (``steps.base.PRELOADABLE``) this process imported since ``before``:
    the pool forks the kind's next steps from a server that has them."""
    had = {name.partition(".")[0] for name in before}
    return sorted({name.partition(".")[0] for name in set(sys.modules) - before} & PRELOADABLE - had)


def _disk_full_exit(exc: OSError) -> NoReturn:
    """No room for the result: exit with the errno, which the builder turns into a message."""
    if not is_disk_full(exc) or exc.errno is None:
        raise exc
    os._exit(exc.errno)


def capture_diagnostics() -> None:
    """Make what explains a failure reach the log: the Python stack on a native crash
    (faulthandler), and library logging from INFO up (unconfigured, logging drops INFO
    and prints warnings without saying which library wrote them)."""
    import faulthandler
    import logging

    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def serve(spec_path: str | Path, *, parent: int | None = None) -> None:
    """Run the step that ``spec_path`` describes and write its result; die with ``parent``
    (default: the builder the spec names)."""
    spec = ChildSpec.from_json(Path(spec_path).read_bytes())
    die_with_parent(spec.parent_pid if parent is None else parent)
    # written in place, not renamed in: the builder reads it only once this process exited
    # with status 0, which it does only after the result is whole
    result_file = open(spec.result, "wb")  # noqa: SIM115 (held open while the step runs)
    try:
        result_file.write(b" " * RESULT_RESERVE)  # JSON allows the padding left after the result
        result_file.flush()
    except OSError as exc:
        _disk_full_exit(exc)
    before = set(sys.modules)
    result = replace(run(spec), imported=_imported(before))
    try:
        result_file.seek(0)
        result_file.write(result.to_json().encode())
        result_file.close()
    except OSError as exc:
        _disk_full_exit(exc)


def main() -> None:
    # SIGTERM ends a worker at once, even one whose builder ignores SIGTERM (an ignored
    # signal is inherited; a handler is not); Ctrl-C, which a terminal sends to every process
    # of the build, is the builder's: it cancels the step (a step that died of it first would
    # read as failed)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    capture_diagnostics()
    serve(sys.argv[1])


if __name__ == "__main__":
    main()
