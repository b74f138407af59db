"""The cache folder under the local store's parts: its subfolders, whether it may be
written, scratch space, atomic publishing and the flock locks of ``locks/``."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from optbuild.common import processstate
from optbuild.common.atomic import fsync_path
from optbuild.common.digest import FileHasher
from optbuild.common.errors import CacheError
from optbuild.common.flock import locked
from optbuild.store.files import owned_name, remove
from optbuild.store.marker import make_folder

_LOCK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
GC_LOCK = "@gc.lock"  # '@' is not allowed in lock names: no key can collide with it
_SUBDIRS = ("cas", "ac", "tmp", "locks")
_warned_read_only: set[Path] = processstate.fresh_set()  # read-only caches already reported


class CacheFolder:
    """A cache folder shared by concurrent builders on this host (safe across processes)."""

    def __init__(self, root: Path, hasher: FileHasher, *, read_only: bool = False):
        self.root = Path(root)
        self.hasher = hasher
        try:
            make_folder(self.root, "cache")  # marked, so that `clean --cache` knows it as optbuild's
            for sub in _SUBDIRS:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot use the cache folder {self.root}: {exc.strerror}") from None
        unwritable = next((self.root / sub for sub in _SUBDIRS if not os.access(self.root / sub, os.W_OK)), None)
        self.writable = unwritable is None  # False: nothing can be stored, whoever asks
        self.read_only = read_only or not self.writable
        if unwritable is not None and self.root not in _warned_read_only:
            _warned_read_only.add(self.root)
            print(f"optbuild: warning: the cache {self.root} is read-only here ({unwritable} cannot be "
                  "written): cached results are served, but nothing new is stored in it", file=sys.stderr)

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            why = "it is read-only here" if not self.writable else "this is a dry run"
            raise CacheError(f"cannot {what} in the cache {self.root}: {why}")

    # --- scratch space and publishing ----------------------------------------------------
    def _tmp_name(self, label: str) -> Path:
        return self.root / "tmp" / owned_name(re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:64])

    def new_tmp_dir(self, prefix: str = "") -> Path:
        """A fresh scratch folder (same file system as cas/, so outputs move in by rename).

        Its name carries our pid and host, so ``clean_stale_tmp`` can tell when it is
        abandoned; the caller removes it when done.
        """
        self._require_writable("make scratch space")
        path = self._tmp_name(prefix)
        path.mkdir()
        return path

    @contextmanager
    def _temp_file(self) -> Iterator[Path]:
        """A path under tmp/ that is removed afterwards unless it was published."""
        tmp = self._tmp_name("file")
        try:
            yield tmp
        finally:
            remove(tmp)

    def _publish(self, tmp: Path, dest: Path, digest: str | None = None) -> None:
        """Make a finished temp file visible at ``dest``: read-only, renamed whole, a blob's
        bytes on disk first.

        A blob's bytes are fsynced before the rename, so that a crash never leaves ``dest``
        with other bytes than these: they are trusted afterwards by their stat signature. An
        entry's are not: it is read and validated whole each time it is used (its key, every
        field, its blobs), so one a crash left torn is a miss that rebuilds, and its fsync
        (half a cold build's, which waits on each) bought nothing. The rename itself is not
        synced: one that a crash loses leaves no entry, or an entry whose blob is missing,
        and either is a miss that rebuilds. Syncing the folder too cost a second fsync per
        file for nothing a crash could make wrong.

        A blob's signature is recorded with its ``digest``, so a later edit of the blob
        (through a hard link) changes the signature and makes the next check re-read it.
        """
        os.chmod(tmp, 0o444)
        if digest is not None:
            fsync_path(tmp)
        if not dest.parent.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        if digest is not None:
            self.hasher.record(dest, digest)

    # --- locks ---------------------------------------------------------------------------
    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive inter-process lock, so that concurrent builders of one key build it once.

        ``key`` may be any name of letters, digits, '_', '.' and '-' (not starting with '.'
        or '-'). The kernel drops the lock when its holder dies, so a killed builder never
        leaves it held. Not reentrant: a second ``lock(key)`` in the same process waits.
        """
        if not _LOCK_NAME.fullmatch(key):
            raise ValueError(f"not a lock name: {key!r}")
        with self._flock(f"{key}.lock"):
            yield

    def _flock(self, filename: str, *, shared: bool = False,
               waiting: Callable[[list[int]], None] | None = None) -> AbstractContextManager[None]:
        """``flock`` on a lock file under locks/; a read-only store locks only files that
        exist and otherwise goes on unlocked (see ``common.flock.locked``)."""
        return locked(f"{self.root}/locks/{filename}", shared=shared, read_only=self.read_only, waiting=waiting)
