"""File operations the local cache's parts share: names that say which process owns a
scratch item (so a dead one's can be found), removal of whole trees, hashing copies."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import stat
import uuid
from pathlib import Path

from optbuild.common.digest import hash_file, new_hasher

HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"
_CHUNK = 8 << 20


def owned_name(label: str) -> str:
    """A fresh file name that says which process (pid and host) owns it."""
    return f"{os.getpid()}@{HOST}@{label}-{uuid.uuid4().hex[:12]}"


def owner_dead(name: str) -> bool:
    """Whether ``name`` (from ``owned_name``) belongs to a process of this host that is gone."""
    pid, _, rest = name.partition("@")
    host, _, _ = rest.partition("@")
    if not pid.isdigit() or int(pid) <= 0 or host != HOST:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def take(source: Path, tmp: Path) -> bool:
    """Rename ``source`` to ``tmp`` if it is a plain file with one link on the same file system."""
    st = os.lstat(source)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return False
    try:
        os.rename(source, tmp)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return False
        raise
    return True


def copy_hashing(source: Path, target: Path) -> str:
    """Copy ``source`` to a new file ``target``; the digest of exactly the bytes copied."""
    h = new_hasher()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(source, "rb") as src, open(target, "xb") as dst:
        while n := src.readinto(buf):
            h.update(view[:n])
            dst.write(view[:n])
    return h.hexdigest()


def rehash(path: Path) -> str | None:
    """Digest read from disk (no stat cache); None when the file cannot be read."""
    try:
        return hash_file(path)[0]
    except OSError:
        return None


def remove(path: Path) -> None:
    """Delete a file or a tree (read-only folders included); already gone is fine. A file,
    or a temp file already published (gone), costs one call: a build removes a few a step."""
    try:
        os.unlink(path)
        return
    except FileNotFoundError:
        return
    except (IsADirectoryError, PermissionError):  # Linux says EISDIR for a folder, others EPERM
        if os.path.islink(path) or not os.path.isdir(path):
            raise
    try:
        os.chmod(path, 0o700)
        for dirpath, dirnames, _files in os.walk(path):
            for name in dirnames:
                if not os.path.islink(os.path.join(dirpath, name)):
                    os.chmod(os.path.join(dirpath, name), 0o700)
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
