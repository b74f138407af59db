"""Content digests (BLAKE3-256) with a persistent stat cache.

Every digest that names content or an action is BLAKE3-256: cache blobs, the file digests
in keys, action keys, and whatever a remote cache or a signature vouches for. A
non-cryptographic hash (xxh3) lets anyone who can write a file or a remote blob make a
twin with the same digest in seconds, and the cache would serve it as the original.

A file whose (device, inode, size, mtime_ns, ctime_ns) match a recorded entry is not
read again, as in ninja, git, Bazel and DVC. A file modified less than ``RACY_SECONDS``
before it was hashed is not recorded: a write in the same timestamp tick could go unseen
(ccache's guard; DVC lacks it and pays in wrong answers).
"""

from __future__ import annotations

import mmap
import os
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import TypeGuard

import blake3

ALGORITHM = "blake3-256"
DIGEST_HEX = 64
DIGEST_RE = re.compile(rf"[0-9a-f]{{{DIGEST_HEX}}}")
RACY_SECONDS = 2.0
_CHUNK = 8 << 20
_MMAP_MIN = 1 << 20
# The table's name carries the digest function, so digests of another one are never read.
_TABLE = "stat_" + re.sub(r"\W", "_", ALGORITHM)


def is_digest(value: object) -> bool:
    """Whether ``value`` is a digest as this module writes them (64 lowercase hex)."""
    return isinstance(value, str) and DIGEST_RE.fullmatch(value) is not None


def new_hasher() -> blake3.blake3:
    """An incremental hasher (``update`` / ``hexdigest``) of the digest function."""
    return blake3.blake3()


def digest_bytes(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def hash_file(path: Path) -> tuple[str, int]:
    """Read ``path`` and return (digest, bytes read).

    Large files are hashed over mmap (no copy) on every core (BLAKE3 is a tree hash: 4.2
    GB/s on 2 cores here against 2.7 on one), but for ``_threads``; small ones in chunks on
    this thread.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size >= _MMAP_MIN:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return blake3.blake3(m, max_threads=_threads()).hexdigest(), size
        h = blake3.blake3()
        buf = bytearray(min(_CHUNK, max(size, 1)))
        view = memoryview(buf)
        read = 0
        while n := f.readinto(buf):
            h.update(view[:n])
            read += n
        return h.hexdigest(), read


# The process whose threaded hash made blake3's thread pool (rayon's, made once per process).
_POOL_MADE_IN: int | None = None


def _threads() -> int:
    """Every core, except in a process forked from one that made the thread pool: a fork
    copies the pool's bookkeeping but not its threads, and a threaded hash there waits forever
    for them (verify's isolated child hung so, forked from a step that had hashed)."""
    global _POOL_MADE_IN
    if _POOL_MADE_IN is not None and _POOL_MADE_IN != os.getpid():
        return 1
    _POOL_MADE_IN = os.getpid()
    return blake3.blake3.AUTO


def _damaged(exc: BaseException) -> TypeGuard[sqlite3.DatabaseError]:
    """A database whose file is not sound (corrupt page, not a database), as opposed to one
    that is busy, read-only or cannot be opened (OperationalError)."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileHasher:
    """Digests files, remembering them by stat signature in an sqlite database.

    Safe for concurrent processes (sqlite WAL) and threads. The database is only a cache:
    one that cannot be opened or written costs re-reading files, never a wrong digest, and
    one that is damaged (a bad page, garbage) is set aside and made anew, with one warning.
    """

    def __init__(self, db_path: Path | None):
        self.bytes_read = 0
        self.files_hashed = 0
        self._db: sqlite3.Connection | None = None
        self._db_path = db_path
        self._pending: dict[str, tuple] = {}  # path -> row, written every 256 and at the end
        # What this run hashed or recorded, by path: (signature, digest). Asked before the
        # database, so a blob this run stored or linked costs a stat to check, not a query.
        self._known: dict[str, tuple[tuple[int, ...], str]] = {}
        self._lock = threading.RLock()
        self._rebuilt = False
        # Every path asked about (absolute), for the no-op stamp (optbuild.common.noopstamp), which
        # records their stat signatures: what a build's keys and restores were read from.
        self.consulted: set[str] = set()
        # The digest each consulted file had as read (None: two in one run), by which the stamp
        # vouches for a file changed just before the build: its content, checked on each no-op.
        self.read: dict[str, str | None] = {}

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is None and self._db_path is not None:
            try:
                self._db = self._open(self._db_path)
            except (sqlite3.Error, OSError) as exc:
                if _damaged(exc):
                    self._recover(exc)
                else:  # unwritable folder, locked for too long...: hash without it
                    self._db_path = None
        return self._db

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (path TEXT PRIMARY KEY, dev INT, ino INT,"
                       " size INT, mtime INT, ctime INT, digest TEXT)")
            db.execute("DROP TABLE IF EXISTS stat")  # xxh3 digests of an older optbuild
            db.execute(f"SELECT count(*) FROM {_TABLE}").fetchone()  # reads every page of the table
        except BaseException:
            db.close()
            raise
        return db

    def _recover(self, exc: sqlite3.Error) -> None:
        """A damaged database: warn once, set it aside, start an empty one, go on.

        Called with the lock held. If even a fresh database fails, files are hashed
        without one for the rest of the run.
        """
        if self._db is not None:
            self._db.close()
            self._db = None
        path = self._db_path
        if path is None or self._rebuilt:
            self._db_path = None
            return
        self._rebuilt = True
        print(f"optbuild: warning: the stat cache {path} is damaged ({exc}); "
              "rebuilding it (files are hashed again once)", file=sys.stderr)
        for suffix in ("", "-wal", "-shm", "-journal"):
            side = path.with_name(path.name + suffix)
            try:
                os.replace(side, path.with_name(f"{path.name}{suffix}.damaged"))
            except FileNotFoundError:
                pass
            except OSError:
                self._db_path = None
                return
        try:
            self._db = self._open(path)
        except (sqlite3.Error, OSError):
            self._db_path = None

    def _query(self, sql: str, args: tuple) -> tuple | None:
        """One row of ``sql``, or None; database errors are recovered from, never raised."""
        db = self._connect()
        if db is None:
            return None
        try:
            return db.execute(sql, args).fetchone()
        except sqlite3.Error as exc:
            if _damaged(exc):
                self._recover(exc)
            return None  # busy for longer than the timeout, say: just hash

    def digest(self, path: Path) -> str:
        """Digest of the file at ``path`` (FileNotFoundError if missing)."""
        path = Path(path)
        key = str(path.absolute())
        self.consulted.add(key)
        st = os.stat(path)
        sig = _signature(st)
        with self._lock:
            if (known := self._known.get(key)) is not None and known[0] == sig:
                self._note_read(key, known[1])
                return known[1]
            row = self._query(f"SELECT dev, ino, size, mtime, ctime, digest FROM {_TABLE} WHERE path=?",
                              (key,))
            if row is not None and tuple(row[:5]) == sig and is_digest(row[5]):
                self._known[key] = (sig, row[5])
                self._note_read(key, row[5])
                return row[5]
        digest, read = hash_file(path)
        # Record only if the file did not change while we read it and is not too fresh.
        after = os.stat(path)
        with self._lock:
            self._note_read(key, digest if _signature(after) == sig else None)
            self.bytes_read += read
            self.files_hashed += 1
            if _signature(after) == sig and time.time() - st.st_mtime_ns / 1e9 > RACY_SECONDS:
                self._remember(key, sig, digest)
        return digest

    def _note_read(self, key: str, digest: str | None) -> None:
        """Note that ``key`` was read as ``digest`` (None: it changed while being read)."""
        self.read[key] = digest if self.read.get(key, digest) == digest else None

    def record(self, path: Path, digest: str) -> None:
        """Remember that ``path`` as it is now holds ``digest``, which the caller just wrote
        and verified (a new cache blob): ``digest`` does not record files younger than
        RACY_SECONDS, so without this every check in the next seconds would read it again.
        Written with the others every 256 and at the end (a run restoring thousands of small
        steps records a few files each: one transaction a file cost more than the restore),
        but for a large file, at once: another process's check of it is then a stat too."""
        key = str(Path(path).absolute())
        self.consulted.add(key)
        st = os.stat(path)
        with self._lock:
            self._remember(key, _signature(st), digest)
            if st.st_size >= _MMAP_MIN:
                self.flush()

    def _remember(self, key: str, sig: tuple[int, ...], digest: str) -> None:
        """Record ``key``'s ``sig`` and ``digest``, for this run at once (``_known``) and in the
        database with the next batch. Called with the lock held."""
        self._known[key] = (sig, digest)
        self._pending[key] = (key, *sig, digest)
        if len(self._pending) >= 256:
            self.flush()

    def forget(self, path: Path) -> None:
        """Drop the recorded digest of ``path`` (after finding it corrupt, say)."""
        key = str(Path(path).absolute())
        with self._lock:
            self._known.pop(key, None)
            self._pending.pop(key, None)
            self._write(f"DELETE FROM {_TABLE} WHERE path=?", [(key,)])

    def flush(self) -> None:
        """Write recorded signatures; called at the end of a run (and every 256 files)."""
        with self._lock:
            if self._pending:
                self._write(f"INSERT OR REPLACE INTO {_TABLE} VALUES (?,?,?,?,?,?,?)", list(self._pending.values()))
            self._pending.clear()

    def _write(self, sql: str, rows: list[tuple]) -> None:
        db = self._connect()
        if db is None:
            return
        try:
            db.executemany(sql, rows)
        except sqlite3.Error as exc:
            if _damaged(exc):  # busy or read-only: the signatures are simply not recorded
                self._recover(exc)

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
