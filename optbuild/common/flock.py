"""Inter-process file locks (``flock``): the one helper the cache and ``optbuild.lock`` use.

The kernel drops a lock when its holder dies, so a killed builder never leaves one held.
Locks are not reentrant: a second lock of the same file in one process waits.

Lock files are made with the umask's permissions (0666 before it), so that a cache shared
by a group (umask 002) can be locked by every member; one that this user cannot open is an
error naming the file and what to do, not a bare PermissionError.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from optbuild.common.errors import OptbuildError


class LockError(OptbuildError):
    """A lock file this user may not open; the message names it and how to share it."""


@contextmanager
def locked(path: str | Path, *, shared: bool = False, read_only: bool = False, mode: int = 0o666,
           waiting: Callable[[list[int]], None] | None = None) -> Iterator[None]:
    """Hold ``flock`` on the file ``path`` (made if missing), exclusive or ``shared``.

    With ``read_only`` (a cache that cannot be written) the file is only opened if it
    exists (flock works on a read-only descriptor); if it does not, this goes on unlocked:
    the caller writes nothing a lock would protect, and nobody who could write made the
    file yet. Otherwise a lock file that cannot be made raises OSError (LockError when
    permission is denied). ``mode``: the permissions of a lock file made here, before the umask.
    ``waiting``: called before this waits for others holding the lock, with their pids (as
    far as /proc/locks tells them), so that the caller can say why it waits.
    """
    try:
        fd = os.open(path, os.O_RDONLY) if read_only else os.open(path, os.O_RDWR | os.O_CREAT, mode)
    except OSError as exc:
        if read_only:
            yield
            return
        if isinstance(exc, PermissionError):
            raise LockError(_denied(Path(path))) from None
        raise
    try:
        _take(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, path, waiting)
        try:
            yield
        finally:
            # explicit: a forked child sharing the descriptor must not keep the lock
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _take(fd: int, operation: int, path: str | Path, waiting: Callable[[list[int]], None] | None) -> None:
    """``flock`` ``fd``; when it would wait and ``waiting`` is given, say so first."""
    if waiting is not None:
        if try_lock(fd, shared=operation == fcntl.LOCK_SH):
            return
        waiting(holders(path))
    fcntl.flock(fd, operation)


def try_lock(fd: int, *, shared: bool = False) -> bool:
    """``flock`` the open file ``fd`` without waiting: whether it is now held (False: another
    holds it). For a lock held as long as a process runs (the build server's), which
    ``locked``'s block cannot express."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holders(path: str | Path) -> list[int]:
    """The pids holding ``flock`` on ``path`` (Linux: /proc/locks; empty where it cannot tell)."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as table:
            lines = table.read().splitlines()
    except OSError:
        return []
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = set()
    for line in lines:
        fields = line.split()
        if "->" not in fields and len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where:
            pids.add(int(fields[4]))
    return sorted(pid for pid in pids if pid > 0)


def _denied(path: Path) -> str:
    """Why ``path`` could not be opened for locking, and how to share it."""
    try:
        st = os.stat(path)
    except OSError:
        return (f"cannot make the lock file {path}: permission denied (its folder {path.parent} is not "
                "writable by this user)")
    return (f"cannot lock {path}: permission denied (mode {st.st_mode & 0o777:o}, owner uid {st.st_uid}, "
            f"group gid {st.st_gid}): a cache shared by a group needs group-writable lock files; have "
            f"their owner run `chmod g+w {path.parent}/*`, and build with umask 002")
