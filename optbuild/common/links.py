"""A file placed under a second name without copying its bytes where the file system allows:
a hard link, else a copy (another file system, a link limit, links forbidden)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def link_or_copy(source: Path, dest: Path) -> None:
    """``dest`` becomes ``source``'s bytes: a hard link (the same inode, so read-only sources
    stay read-only through it), else a copy."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)
