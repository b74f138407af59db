"""Files replaced whole: a reader (or a crash) sees the old bytes or the new, never a mix."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: Any) -> None:
    """Write ``data`` (bytes or a buffer) to ``path``: temp file in the same folder, fsync,
    os.replace. The temp file is removed on any failure.

    The file gets 0666 less the umask, as ``open()`` would give it (mkstemp's 0600 would
    hide a lock file or a report from the rest of a team sharing the checkout).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_path(path: Path) -> None:
    """fsync a file or a folder by its path (a folder: so that an entry made in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
