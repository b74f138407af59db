"""Errors that reach the user as a message, never as a traceback."""

from __future__ import annotations

import errno
import os
import resource
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard


class OptbuildError(Exception):
    """Base of every error the CLI prints as a plain message with a non-zero exit."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none): libraries'
    multi-line errors, tracebacks included, shortened for a one-line message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def root_cause(exc: BaseException) -> str:
    """'; caused by Type: first line' of the innermost error behind ``exc`` (its ``__cause__``,
    else an unsuppressed ``__context__``), or "": a library that wraps an import error in its
    own ("Could not import module 'BertModel'") hides what to fix in the one line a user reads."""
    inner, seen = exc, {id(exc)}
    while (nxt := inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)) is not None:
        if id(nxt) in seen:
            break
        inner, seen = nxt, seen | {id(nxt)}
    return "" if inner is exc else f"; caused by {type(inner).__name__}: {first_line(inner)}"


def traceback_with_causes(exc: BaseException) -> str:
    """``exc``'s traceback after those of every exception it was raised from or while
    handling, also a context that ``raise StepError(...) from None`` hid: that keeps the
    console message short, but the user's code (a model callable, a data file) and the cause
    of its error (an import failing inside a library) are only in that context."""
    report = traceback.TracebackException.from_exception(exc)
    link: traceback.TracebackException | None = report
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__suppress_context__ = False
        link = link.__cause__ or link.__context__
    return "".join(report.format())


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the project, located as precisely as we can."""

    message: str
    file: Path | None = None
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = str(self.file)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class ProjectError(OptbuildError):
    """The project does not validate; nothing is built. Holds every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class StepError(OptbuildError):
    """A step failed for a reason it can explain (bad model, bad data, tool error)."""


class StepUnavailable(OptbuildError):
    """A step cannot run on this host; the message names what it needs."""


class CacheError(OptbuildError):
    """The cache is unusable (not a corrupt entry: those are misses)."""


class DiskFullError(OptbuildError):
    """A write failed for lack of space (or the file-size limit); the message names the disk."""


# ENOSPC: the file system is full; EDQUOT: the user's quota is; EFBIG: the file-size limit
# (ulimit -f) or the file system's largest file was reached. All mean "make room, retry".
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_disk_full(exc: BaseException) -> TypeGuard[OSError]:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


@contextmanager
def full_disk_named(where: Path | str | None = None) -> Iterator[None]:
    """A full disk met inside raised as DiskFullError, its message naming the file (or the
    folder ``where`` it was written in) and the disk (``describe_os_error``); any other
    OSError as it was."""
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise DiskFullError(describe_os_error(exc, where)) from None


def describe_os_error(exc: OSError, where: Path | str | None = None) -> str:
    """One line naming the file (or, when the error does not say, the folder ``where`` it was
    written in) and, for a full disk, which file system and how much it has left, so the
    user knows what to clean up instead of reading a traceback."""
    if exc.filename is not None:
        target: Path | None = Path(os.fsdecode(exc.filename))
        place = f" writing {target}"
    else:
        target = Path(where) if where is not None else None
        place = f" writing in {target}" if target is not None else ""
    if exc.errno == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        why = (f"the file-size limit (ulimit -f) is {limit} bytes" if limit != resource.RLIM_INFINITY
               else "larger than its file system allows")
        return f"file too large{place} ({why})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        disk = f" ({_disk_of(target)})" if target is not None else ""
        return f"{what}{place}{disk}"
    return f"{exc.strerror or first_line(exc)}{place}"


def _disk_of(path: Path) -> str:
    """'file system of MOUNTPOINT, N bytes free' for the file system holding ``path``."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    mount = path
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return f"file system of {mount}"
    from optbuild.common.units import human_size

    return f"file system of {mount}, {human_size(st.f_bavail * st.f_frsize)} free"
