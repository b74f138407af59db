"""Files replaced whole: a reader (or a crash) sees the old bytes or the new, never a mix."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: Any) -> None:
    """Write ``data`` (bytes or a buffer) to ``path``: temp file in the same folder, fsync,
    os.replace. The temp file is removed on any failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
