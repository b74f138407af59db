"""Forked children: how one ends (never returning into, nor unwinding through, its parent's
code), and which deaths are a native library's crash."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

# the signals of a native crash (a library's bug, which another attempt may avoid), by name
CRASH_SIGNALS: dict[int, str] = {signal.SIGSEGV: "SIGSEGV", signal.SIGBUS: "SIGBUS", signal.SIGILL: "SIGILL",
                 signal.SIGFPE: "SIGFPE"}


def run_and_exit(body: Callable[[], object], failed: int) -> NoReturn:
    """Run ``body`` in a forked child, then end the process with ``os._exit``: status 0 when
    it returned, ``failed`` when it raised (its traceback on stderr), stdout and stderr
    flushed either way. An exception left to propagate would run the parent's code on in the
    child (a second fork server, a second pytest)."""
    code = failed
    try:
        body()
        code = 0
    except BaseException:  # the child must end here, whatever was raised
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)
