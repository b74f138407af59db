"""Content digests (xxh3-128) with a persistent stat cache.

A file whose (device, inode, size, mtime_ns, ctime_ns) match a recorded entry is not
read again, as in ninja, git, Bazel and DVC. A file modified less than ``RACY_SECONDS``
before it was hashed is not recorded: a write in the same timestamp tick could go unseen
(ccache's guard; DVC lacks it and pays in wrong answers).
"""

from __future__ import annotations

import mmap
import os
import sqlite3
import threading
import time
from pathlib import Path

import xxhash

ALGORITHM = "xxh3_128"
RACY_SECONDS = 2.0
_CHUNK = 8 << 20
_MMAP_MIN = 1 << 20


def digest_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def hash_file(path: Path) -> tuple[str, int]:
    """Read ``path`` and return (digest, bytes read). mmap avoids a copy on large files."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size >= _MMAP_MIN:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return xxhash.xxh3_128_hexdigest(m), size
        h = xxhash.xxh3_128()
        buf = bytearray(min(_CHUNK, max(size, 1)))
        view = memoryview(buf)
        read = 0
        while n := f.readinto(buf):
            h.update(view[:n])
            read += n
        return h.hexdigest(), read


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileHasher:
    """Digests files, remembering them by stat signature in an sqlite database.

    Safe for concurrent processes (sqlite WAL) and threads; a database that cannot be
    opened or written only costs re-reading files, never a wrong digest.
    """

    def __init__(self, db_path: Path | None):
        self.bytes_read = 0
        self.files_hashed = 0
        self._db: sqlite3.Connection | None = None
        self._db_path = db_path
        self._pending: list[tuple] = []
        self._lock = threading.RLock()

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is None and self._db_path is not None:
            try:
                self._db_path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self._db_path, timeout=30, isolation_level=None,
                                     check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS stat (path TEXT PRIMARY KEY, dev INT, ino INT,"
                    " size INT, mtime INT, ctime INT, digest TEXT)"
                )
                self._db = db
            except sqlite3.Error:
                self._db_path = None
        return self._db

    def digest(self, path: Path) -> str:
        """Digest of the file at ``path`` (FileNotFoundError if missing)."""
        path = Path(path)
        st = os.stat(path)
        sig = _signature(st)
        key = str(path.absolute())
        with self._lock:
            db = self._connect()
            if db is not None:
                row = db.execute(
                    "SELECT dev, ino, size, mtime, ctime, digest FROM stat WHERE path=?", (key,)
                ).fetchone()
                if row is not None and tuple(row[:5]) == sig:
                    return row[5]
        digest, read = hash_file(path)
        # Record only if the file did not change while we read it and is not too fresh.
        after = os.stat(path)
        with self._lock:
            self.bytes_read += read
            self.files_hashed += 1
            if _signature(after) == sig and time.time() - st.st_mtime_ns / 1e9 > RACY_SECONDS:
                self._pending.append((key, *sig, digest))
                if len(self._pending) >= 256:
                    self.flush()
        return digest

    def forget(self, path: Path) -> None:
        """Drop the recorded digest of ``path`` (after finding it corrupt, say)."""
        key = str(Path(path).absolute())
        with self._lock:
            self._pending = [p for p in self._pending if p[0] != key]
            db = self._connect()
            if db is not None:
                try:
                    db.execute("DELETE FROM stat WHERE path=?", (key,))
                except sqlite3.Error:
                    pass

    def flush(self) -> None:
        """Write recorded signatures; called at the end of a run (and every 256 files)."""
        with self._lock:
            db = self._connect() if self._pending else None
            if db is not None:
                try:
                    db.executemany("INSERT OR REPLACE INTO stat VALUES (?,?,?,?,?,?,?)", self._pending)
                except sqlite3.Error:
                    pass
            self._pending.clear()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
