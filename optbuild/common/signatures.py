"""Stat signatures: what a file looked like (mtime, ctime, size, inode) when something was read
from it, and whether that is too recent to vouch for what was read (git's racy-clean problem).
The no-op fast path, the fork servers and the build server decide with them whether what they
loaded is still what is on disk.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

RACY_NS = 2_000_000_000  # a file changed within this of a moment may change again unseen


def changed_within(sig: Sequence[int] | str, ref_ns: int, margin_ns: int | None = None) -> bool:
    """Whether a file of signature ``sig`` was modified less than ``margin_ns`` (RACY_NS)
    before ``ref_ns`` (or after): too recent for its signature to vouch for what was read then."""
    margin = RACY_NS if margin_ns is None else margin_ns
    return not isinstance(sig, str) and max(sig[0], sig[1]) >= ref_ns - margin  # "absent": never changed


def signature(path: str) -> list[int] | str:
    """A file's stat signature (mtime, ctime, size, inode), or "absent"."""
    try:
        return of_stat(os.stat(path))
    except (FileNotFoundError, NotADirectoryError):
        return "absent"


def of_stat(st: os.stat_result) -> list[int]:
    """The signature of what ``os.stat`` gave (for a caller that needs the rest of it too)."""
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino]


def file_system_clock(folder: str) -> tuple[int, int] | None:
    """(device, now) as the file system holding ``folder`` stamps times: the mtime of a file
    made there unnamed (O_TMPFILE: nothing appears in the folder, nothing is left behind). A
    change there after this call is stamped at or after it, so a file whose times are before
    it cannot change again unseen: git's racy rule, on the file system's own clock and
    granularity, which a margin on the host's clock (RACY_NS) only guesses at. None where the
    file system makes no such file (NFS, say): then the margin it is."""
    unnamed = getattr(os, "O_TMPFILE", None)  # Linux only
    if unnamed is None:
        return None
    try:
        fd = os.open(folder, unnamed | os.O_WRONLY, 0o600)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_mtime_ns
    finally:
        os.close(fd)


def module_files(*, stdlib: bool = False) -> list[str]:
    """The files of the modules loaded now; the standard library's only with ``stdlib``."""
    prefix = os.path.dirname(os.__file__) + os.sep
    files = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path):
            continue
        if not stdlib and path.startswith(prefix) and "-packages" not in path[len(prefix):]:
            continue
        files.append(path)
    return files
