"""Inter-process file locks (``flock``): the one helper the cache and ``optbuild.lock`` use.

The kernel drops a lock when its holder dies, so a killed builder never leaves one held.
Locks are not reentrant: a second lock of the same file in one process waits.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(path: Path, *, shared: bool = False, read_only: bool = False,
           mode: int = 0o644) -> Iterator[None]:
    """Hold ``flock`` on the file ``path`` (made if missing), exclusive or ``shared``.

    With ``read_only`` (a cache that cannot be written) the file is only opened if it
    exists (flock works on a read-only descriptor); if it does not, this goes on unlocked:
    the caller writes nothing a lock would protect, and nobody who could write made the
    file yet. Otherwise a lock file that cannot be made raises OSError. ``mode``: the
    permissions of a lock file made here (before the umask).
    """
    try:
        fd = os.open(path, os.O_RDONLY) if read_only else os.open(path, os.O_RDWR | os.O_CREAT, mode)
    except OSError:
        if not read_only:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            # explicit: a forked child sharing the descriptor must not keep the lock
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
