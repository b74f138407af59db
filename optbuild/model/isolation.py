"""Work that may crash a native library, run in a forked child and tried again on a crash.

Why: a bug in a native library kills the process it happens in. onnxruntime crashes (SIGSEGV)
on a float16 ViT at graph optimization level ORT_ENABLE_ALL, its default, and runs it at a
lower level (issue 24); in the step's own process that crash ends the step, with nothing to
try. Run in a forked child, it ends the child only: the caller learns which attempt crashed,
of which signal, at which stage the child last reported, and may try again otherwise (verify,
benchmark and select: at the next lower level, optbuild.model.runmodels).

Cost: one ``fork`` per attempt, none more when nothing crashes; the work's value comes back
pickled through a pipe, bounded (``max_bytes``), so return figures rather than tensors where
they are large. Fork before the work opens what may crash (an onnxruntime session): the
child must start clean. What the work opens, it opens on ``opened_stack()``: closed as usual
where the work runs in-process, and in the child left for its exit to free, so that a crash
in a runtime's teardown (OpenVINO's destructor, once) cannot cost figures already measured.
The child writes to the same stdout and stderr as its parent (a step's log); a Python
exception in it keeps its type and message (its traceback, causes included, goes to stderr)
and is raised again in the parent, never tried again; the child dies with its parent (Linux:
PR_SET_PDEATHSIG; elsewhere it polls), so a cancelled step leaves no orphan running.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

from optbuild.common.errors import traceback_with_causes
from optbuild.common.forked import CRASH_SIGNALS, run_and_exit

A = TypeVar("A")  # an attempt: what the work is given (the levels to open models at)
R = TypeVar("R")

MAX_BYTES = 256 << 20  # the most a value (pickled) may take
_STAGE, _VALUE, _ERROR = b"s", b"v", b"e"
_HEADER = struct.Struct("<cQ")  # frame: kind, payload length
_FAILED = 70  # the child's exit status when it could not even report


Stage = Callable[[Any], None]  # the work calls it with what it does next ("loading the candidate")

_in_child = False  # set in the forked child (``_report``), which ends with os._exit
_left_to_exit: list[contextlib.ExitStack] = []  # in the child: held, so nothing they hold is freed before it ends


@dataclass(frozen=True)
class Crash(Generic[A]):
    """An attempt whose child died of a native crash signal."""

    attempt: A
    signal: str  # "SIGSEGV"
    stage: Any  # the last stage the child reported; None if none


class ChildDied(RuntimeError):
    """The child ended without a value for a reason no attempt changes: a signal that is not
    a crash (SIGKILL: the OOM killer), an exit without a value, a value past the bound."""


class Crashed(ChildDied):
    """The child crashed at an attempt that is not retried (the last, or one the caller does
    not retry); ``crashes`` holds every attempt's crash, in order."""

    def __init__(self, message: str, crashes: list[Crash[Any]]):
        super().__init__(message)
        self.crashes = crashes


class IsolatedError(RuntimeError):
    """An exception of the child that could not travel as itself (it does not pickle): its
    type's name and its message."""


@dataclass
class Outcome(Generic[A, R]):
    """The value of the attempt that ran to its end, that attempt, and the crashes before it."""

    value: R
    attempt: A
    crashes: list[Crash[A]] = field(default_factory=list)


@contextlib.contextmanager
def opened_stack() -> Iterator[contextlib.ExitStack]:
    """The ExitStack the work enters what it opens on (native runtimes): closed on leaving
    where the work runs in this process; in the isolated child never closed and never freed
    (the child ends with ``os._exit`` once its value is sent), so a crash in a runtime's
    teardown cannot take the value with it."""
    stack = contextlib.ExitStack()
    if _in_child:
        _left_to_exit.append(stack)
        yield stack
        return
    with stack:
        yield stack


def never(crash: Crash[Any]) -> None:
    """Retry nothing."""


def along(attempts: Sequence[A]) -> Callable[[Crash[A]], A | None]:
    """A retry that takes the attempt after the one that crashed in ``attempts``."""
    def retry(crash: Crash[A]) -> A | None:
        at = list(attempts).index(crash.attempt)
        return attempts[at + 1] if at + 1 < len(attempts) else None

    return retry


def run_isolated(work: Callable[[A, Stage], R], first: A, *, retry: Callable[[Crash[A]], A | None] = never,
                 describe: Callable[[A], str] = repr, what: str = "the isolated work",
                 max_bytes: int = MAX_BYTES) -> Outcome[A, R]:
    """``work(attempt, stage)`` run in a forked child, from ``first``: its value, or its
    exception raised again here. When the child dies of a crash signal, ``retry(crash)`` gives
    the next attempt (None: Crashed, naming each attempt by ``describe``). Another death:
    ChildDied. Where there is no fork (Windows), ``work`` runs here, once."""
    if not hasattr(os, "fork"):
        return Outcome(work(first, lambda _stage: None), first)
    crashes: list[Crash[A]] = []
    attempt = first
    while True:
        done, value, death, stage = _attempt(work, attempt, max_bytes)
        if done:
            return Outcome(value, attempt, crashes)
        if death in CRASH_SIGNALS.values():
            crashes.append(Crash(attempt, death, stage))
            following = retry(crashes[-1])
            if following is not None:
                attempt = following
                continue
            tried = "; ".join(f"{describe(c.attempt)}: {c.signal}" + (f" while {c.stage}" if c.stage else "")
                              for c in crashes)
            raise Crashed(f"{what} crashed ({death}), a crash inside a native library; tried {tried}", crashes)
        where = f" while {stage}" if stage is not None else ""
        raise ChildDied(f"{what} died ({death}){where}")


def _attempt(work: Callable[[A, Stage], R], attempt: A, max_bytes: int) -> tuple[bool, Any, str, Any]:
    """One child: (True, value, "", stage) once it reported its value; (False, None, how it
    died, last stage) when it died without one. Its exception is raised here."""
    for stream in (sys.stdout, sys.stderr):  # nothing buffered twice
        with contextlib.suppress(Exception):
            stream.flush()
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: it never returns
        os.close(read_fd)
        _child(work, attempt, write_fd, parent, max_bytes)
    os.close(write_fd)
    reaped = False
    try:
        stage, final = _read(read_fd, max_bytes)
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        os.close(read_fd)
        if not reaped:  # interrupted, or the value too big: the child must not outlive this
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if final is not None:
        kind, payload = final
        if kind == _VALUE:
            return True, payload, "", stage
        raise payload
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return False, None, CRASH_SIGNALS.get(number) or _signal_name(number), stage
    return False, None, f"exit code {os.WEXITSTATUS(status)}, no value", stage


def _read(fd: int, max_bytes: int) -> tuple[Any, tuple[bytes, Any] | None]:
    """The frames of the child until its value or error, or its end: the last stage and that
    final frame (None when the pipe closed first). ChildDied for a frame past ``max_bytes``."""
    stage: Any = None
    while True:
        header = _read_exactly(fd, _HEADER.size)
        if header is None:
            return stage, None
        kind, size = _HEADER.unpack(header)
        if size > max_bytes:
            raise ChildDied(f"the isolated work's value takes {size} bytes, more than the {max_bytes} bound")
        payload = _read_exactly(fd, size)
        if payload is None:
            return stage, None
        value = pickle.loads(payload)
        if kind == _STAGE:
            stage = value
        else:
            return stage, (kind, value)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _child(work: Callable[[A, Stage], R], attempt: A, fd: int, parent: int, max_bytes: int) -> NoReturn:
    run_and_exit(lambda: _report(work, attempt, fd, parent, max_bytes), failed=_FAILED)


def _report(work: Callable[[A, Stage], R], attempt: A, fd: int, parent: int, max_bytes: int) -> None:
    """In the child: ``work`` run, its stages, then its value or its exception, framed on ``fd``."""
    global _in_child
    _in_child = True
    _die_with(parent)

    def send(kind: bytes, value: Any) -> None:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > max_bytes:
            raise ChildDied(f"the isolated work's value takes {len(payload)} bytes, more than the "
                            f"{max_bytes} bound: return figures, not tensors")
        frame = memoryview(_HEADER.pack(kind, len(payload)) + payload)
        while frame:
            frame = frame[os.write(fd, frame):]

    try:
        value = work(attempt, lambda stage: send(_STAGE, stage))
        send(_VALUE, value)
    except BaseException as exc:  # every exception goes back to the parent
        _print_traceback(exc)
        send(_ERROR, _portable(exc))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (its type and message), else an IsolatedError saying both."""
    with contextlib.suppress(Exception):
        back = pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    return IsolatedError(f"{type(exc).__name__}: {exc}")


def _print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback with every exception it came from to stderr: pickling keeps neither."""
    with contextlib.suppress(Exception):
        print("in the isolated child:\n" + traceback_with_causes(exc), end="", file=sys.stderr, flush=True)

def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` dies (a cancelled step is killed so): Linux's
    PR_SET_PDEATHSIG, else a thread that polls the parent. A parent already gone: exit now."""
    armed = False
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            armed = ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) == 0  # PR_SET_PDEATHSIG
    if not armed:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True, name="die-with-parent").start()
    if os.getppid() != parent:
        os._exit(_FAILED)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
