"""The content store: immutable blobs under ``cas/``, named by their BLAKE3-256 digest.

A blob is published whole (written under tmp/, fsynced, renamed), read-only, with its stat
signature recorded, so that a blob edited through a hard link is re-read, found corrupt and
deleted before it is served. Only a blob whose bytes do not match its digest is corrupt.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

from optbuild.common.digest import FileHasher, digest_bytes, hash_file
from optbuild.common.errors import CacheError
from optbuild.store.entry import OutputFile, check_digest, is_digest
from optbuild.store.files import copy_hashing, remove, take
from optbuild.store.folder import CacheFolder
from optbuild.store.layout import blob_name


class ContentStore(CacheFolder):
    """The blobs of a cache folder (a ``layout.BlobStore``)."""

    def __init__(self, root: Path, hasher: FileHasher, *, read_only: bool = False):
        super().__init__(root, hasher, read_only=read_only)
        self._root_text = str(self.root)

    def blob_path(self, digest: str) -> Path:
        """Where a blob lives. Only a digest is accepted, so no name can point outside cas/."""
        check_digest(digest, "digest")
        return Path(f"{self._root_text}/{blob_name(digest)}")  # one parse, not three joins: a no-op asks often

    def put_file(self, path: Path, *, move: bool = False) -> OutputFile:
        """Store a file's bytes under their digest.

        With ``move`` the source is consumed: a plain file with no other hard link on this
        file system is renamed into the cache (no copy of a multi-GB engine); anything else
        is copied and then unlinked. A file with other links is copied because a blob must
        not share its inode with a file someone may still edit or chmod.
        """
        self._require_writable(f"store {path}")
        path = Path(path)
        digest, size = hash_file(path)
        dest = self.blob_path(digest)
        if not self.blob_ok(digest, size):
            with self._temp_file() as tmp:
                if not (move and take(path, tmp)):
                    copied = copy_hashing(path, tmp)
                    if copied != digest:  # never file bytes under a name that is not theirs
                        raise CacheError(f"{path} changed while it was being stored in the cache")
                self._publish(tmp, dest, digest)
        if move:
            path.unlink(missing_ok=True)
        return OutputFile(digest=digest, size=size)

    def put_bytes(self, data: bytes, what: str = "a step log") -> str:
        """Store ``data`` (``what``: a log, say, named where the cache is read-only) unless
        held already, and return its digest."""
        digest = digest_bytes(data)
        if not self.blob_ok(digest, len(data)):
            self._require_writable(f"store {what}")
            with self._temp_file() as tmp:
                tmp.write_bytes(data)
                self._publish(tmp, self.blob_path(digest), digest)
        return digest

    def read_blob(self, digest: str) -> bytes:
        """A blob's bytes, verified: they may be shown to a user or sent elsewhere."""
        try:
            data = self.blob_path(digest).read_bytes()
        except FileNotFoundError:
            raise CacheError(f"blob {digest} is not in the cache") from None
        if digest_bytes(data) != digest:
            self._drop_blob(digest)
            raise CacheError(f"blob {digest} was corrupt and has been removed from the cache")
        return data

    def blob_ok(self, digest: str, size: int | None = None) -> bool:
        """Present, of ``size`` bytes (if given) and verifying against its digest.

        Hashing goes through the hasher, so an unchanged blob is not read again. A corrupt
        blob is deleted (unless the store is read-only) so that the next put repopulates it.
        """
        problem, actual = self._blob_problem(digest)
        return problem is None and (size is None or actual == size)

    def _blob_problem(self, digest: str) -> tuple[str | None, int]:
        """(why the blob cannot be served, or None; its size). Only a blob whose bytes do
        not match its digest is corrupt, and only that is deleted."""
        path = self.blob_path(digest)
        try:
            actual = path.stat().st_size
            intact = self.hasher.digest(path) == digest
        except FileNotFoundError:
            return "missing", 0
        except OSError:  # unreadable, a folder...: as useless as a corrupt blob
            actual, intact = 0, False
        if intact:
            return None, actual
        if self.read_only:
            return "corrupt", actual
        self._drop_blob(digest)
        return "corrupt (removed)", actual

    def mark_used(self, digest: str) -> None:
        """Note that blob ``digest``, just verified, was used now (its mtime): what
        ``trim_blobs`` keeps longest. The stat cache is told, so that the touch costs no
        re-read."""
        path = self.blob_path(digest)
        with suppress(OSError):
            os.utime(path)
            self.hasher.record(path, digest)

    def _drop_blob(self, digest: str) -> None:
        path = self.blob_path(digest)
        self.hasher.forget(path)
        with suppress(OSError):  # if it cannot go, the next put replaces it anyway
            remove(path)

    def _scan_blobs(self) -> Iterator[tuple[str | None, Path, int]]:
        """(digest, path, size) of everything under cas/; digest None where no blob can be."""
        for path in (self.root / "cas").glob("*/*"):
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            digest = path.parent.name + path.name
            valid = len(path.parent.name) == 2 and is_digest(digest) and stat.S_ISREG(st.st_mode)
            yield (digest if valid else None), path, st.st_size

    def size_bytes(self) -> int:
        """Bytes of all blobs (entries and scratch space are not counted)."""
        return sum(size for _digest, _path, size in self._scan_blobs())
