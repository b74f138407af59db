"""The local cache: content-addressed blobs and action entries on disk.

    cas/<2 hex>/<30 hex>        immutable blobs, read-only
    ac/<2 hex>/<30 hex>.json    action entries (ActionEntry JSON); mtime = last use (LRU)
    tmp/<pid>-<random>/         scratch space of running builds
    locks/                      inter-process locks

Everything is written to tmp/, fsynced and renamed into place, so a reader never sees a
half-written blob or entry whatever is killed when. An entry is served only when every
blob it names is present and verifies; anything corrupt is deleted and counts as a miss.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from optbuild.digest import FileHasher, digest_bytes, hash_file
from optbuild.errors import CacheError
from optbuild.store.entry import ActionEntry, OutputFile, check_relative_path

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in "10 GiB", "500MB", "1.5G" or "1024"."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: '20 GiB', '500 MB', '1048576')")
    return int(float(match.group(1)) * _UNITS[unit])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class VerifyReport:
    entries: int
    blobs: int
    corrupt_blobs: list[str] = field(default_factory=list)
    corrupt_entries: list[str] = field(default_factory=list)
    dangling_entries: list[str] = field(default_factory=list)
    orphan_blobs: int = 0
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not (self.corrupt_blobs or self.corrupt_entries or self.dangling_entries)

    def __str__(self) -> str:
        lines = [f"checked {self.entries} entries and {self.blobs} blobs: "
                 + ("all intact" if self.ok else "PROBLEMS FOUND")]
        lines += [f"  corrupt blob {d}" for d in self.corrupt_blobs]
        lines += [f"  corrupt entry {k}" for k in self.corrupt_entries]
        lines += [f"  entry {k} names a missing or corrupt blob" for k in self.dangling_entries]
        if self.orphan_blobs:
            lines.append(f"  {self.orphan_blobs} blobs no entry names (removed by gc)")
        if self.repaired and not self.ok:
            lines.append("  repaired: the bad items were deleted; the next build rebuilds them")
        return "\n".join(lines)


@dataclass(frozen=True)
class GcReport:
    entries_evicted: int
    blobs_deleted: int
    bytes_freed: int
    bytes_now: int

    def __str__(self) -> str:
        return (f"evicted {self.entries_evicted} entries, deleted {self.blobs_deleted} blobs, "
                f"freed {self.bytes_freed} bytes; cache now holds {self.bytes_now} bytes")


class LocalStore:
    def __init__(self, root: Path, hasher: FileHasher):
        self.root = Path(root)
        self.hasher = hasher
        self.last_miss_reason: str | None = None
        for sub in ("cas", "ac", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # --- paths and scratch space -------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / "cas" / digest[:2] / digest[2:]

    def _entry_path(self, key: str) -> Path:
        return self.root / "ac" / key[:2] / f"{key[2:]}.json"

    def new_tmp_dir(self, prefix: str = "") -> Path:
        """A fresh scratch directory, named by pid so a dead builder's leftovers are found."""
        path = self.root / "tmp" / f"{os.getpid()}-{prefix}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def clean_stale_tmp(self) -> int:
        """Remove scratch directories of builders that are no longer running."""
        removed = 0
        for path in (self.root / "tmp").iterdir():
            pid = path.name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                _rmtree(path)
                removed += 1
        return removed

    def _install(self, tmp_file: Path, dest: Path) -> None:
        """fsync ``tmp_file`` and rename it to ``dest`` (atomic on one file system)."""
        fd = os.open(tmp_file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp_file, dest)
        _fsync_dir(dest.parent)

    # --- blobs -------------------------------------------------------------------------
    def put_file(self, path: Path, *, move: bool = False) -> OutputFile:
        """Store the bytes of ``path``; with ``move`` the file itself is taken (same fs)."""
        digest, size = hash_file(path)
        dest = self.blob_path(digest)
        if dest.exists() and self.blob_ok(digest, size):
            if move:
                path.unlink()
            return OutputFile(digest=digest, size=size)
        tmp = self.root / "tmp" / f"{os.getpid()}-blob-{uuid.uuid4().hex}"
        if move:
            os.replace(path, tmp)
        else:
            shutil.copyfile(path, tmp)
        if hash_file(tmp)[0] != digest:  # changed under us: never store a wrong name
            tmp.unlink()
            raise CacheError(f"{path} changed while it was being stored")
        tmp.chmod(0o444)
        self._install(tmp, dest)
        return OutputFile(digest=digest, size=size)

    def put_bytes(self, data: bytes) -> str:
        digest = digest_bytes(data)
        dest = self.blob_path(digest)
        if dest.exists() and self.blob_ok(digest, len(data)):
            return digest
        tmp = self.root / "tmp" / f"{os.getpid()}-blob-{uuid.uuid4().hex}"
        tmp.write_bytes(data)
        tmp.chmod(0o444)
        self._install(tmp, dest)
        return digest

    def read_blob(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    def blob_ok(self, digest: str, size: int | None = None) -> bool:
        """Present and intact. A corrupt blob is deleted so that it repopulates."""
        path = self.blob_path(digest)
        try:
            if size is not None and path.stat().st_size != size:
                self._drop_blob(path)
                return False
            if self.hasher.digest(path) == digest:
                return True
        except FileNotFoundError:
            return False
        self._drop_blob(path)
        return False

    def _drop_blob(self, path: Path) -> None:
        self.hasher.forget(path)
        try:
            path.unlink()
        except FileNotFoundError:
            pass

    # --- action entries ----------------------------------------------------------------
    def get_action(self, key: str) -> ActionEntry | None:
        """The entry for ``key`` if it and every blob it names are intact; else None."""
        self.last_miss_reason = None
        path = self._entry_path(key)
        try:
            entry = ActionEntry.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, ValidationError):
            self.last_miss_reason = "its cache entry was corrupt (removed)"
            path.unlink(missing_ok=True)
            return None
        if entry.key != key:
            self.last_miss_reason = "its cache entry was filed under the wrong key (removed)"
            path.unlink(missing_ok=True)
            return None
        names = {o.digest: name for name, o in entry.outputs.items()}
        sizes = {o.digest: o.size for o in entry.outputs.values()}
        for digest in entry.blob_digests():
            if not self.blob_ok(digest, sizes.get(digest)):
                what = names.get(digest, "the log")
                self.last_miss_reason = f"cached blob of {what} was missing or corrupt"
                return None
        try:
            os.utime(path)
        except OSError:
            pass
        return entry

    def put_action(self, entry: ActionEntry) -> None:
        for digest in entry.blob_digests():
            if not self.blob_path(digest).exists():
                raise CacheError(f"entry {entry.key} names blob {digest}, which is not stored")
        tmp = self.root / "tmp" / f"{os.getpid()}-entry-{uuid.uuid4().hex}"
        tmp.write_text(entry.model_dump_json())
        self._install(tmp, self._entry_path(entry.key))

    def iter_entries(self) -> Iterator[tuple[str, ActionEntry | None]]:
        for path in sorted((self.root / "ac").glob("*/*.json")):
            key = path.parent.name + path.name[: -len(".json")]
            try:
                yield key, ActionEntry.model_validate_json(path.read_bytes())
            except (OSError, ValueError, ValidationError):
                yield key, None

    # --- locks -------------------------------------------------------------------------
    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Exclusive inter-process lock on ``name`` (a key, or any short token)."""
        with open(self.root / "locks" / f"{name}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def shared_gc_lock(self) -> Iterator[None]:
        """Held shared by writers, exclusively by gc: gc never sees a half-stored build."""
        with open(self.root / "locks" / "gc.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # --- materialization ---------------------------------------------------------------
    def materialize(self, entry: ActionEntry, dest: Path) -> None:
        """Make ``dest`` hold exactly the entry's outputs (read-only), swapped in whole."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = dest.parent / f".{dest.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            for name, output in entry.outputs.items():
                check_relative_path(name)
                target = (staging / name).resolve()
                if not target.is_relative_to(staging.resolve()):
                    raise CacheError(f"output {name!r} escapes its folder")
                target.parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(self.blob_path(output.digest), target)
            old = None
            if dest.exists() or dest.is_symlink():
                old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
                os.replace(dest, old)
            os.replace(staging, dest)
            if old is not None:
                _rmtree(old)
        except BaseException:
            _rmtree(staging)
            raise

    def is_materialized(self, entry: ActionEntry, dest: Path) -> bool:
        """Cheap check: exactly the entry's files, each the blob itself or equal to it."""
        try:
            present = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if not p.is_dir()}
        except OSError:
            return False
        if present != set(entry.outputs):
            return False
        for name, output in entry.outputs.items():
            path = dest / name
            try:
                st, blob = path.lstat(), self.blob_path(output.digest).stat()
            except FileNotFoundError:
                return False
            if (st.st_dev, st.st_ino) == (blob.st_dev, blob.st_ino):
                continue
            if st.st_size != output.size or self.hasher.digest(path) != output.digest:
                return False
        return True

    # --- maintenance -------------------------------------------------------------------
    def _blob_files(self) -> Iterator[Path]:
        return (p for p in (self.root / "cas").glob("*/*") if p.is_file())

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._blob_files())

    def verify(self, repair: bool = False) -> VerifyReport:
        """Re-read every blob (no stat cache) and every entry."""
        corrupt_blobs, good = [], set()
        blobs = 0
        for path in self._blob_files():
            blobs += 1
            digest = path.parent.name + path.name
            if hash_file(path)[0] == digest:
                good.add(digest)
            else:
                corrupt_blobs.append(digest)
                if repair:
                    self._drop_blob(path)
        corrupt_entries, dangling, named = [], [], set()
        entries = 0
        for key, entry in self.iter_entries():
            entries += 1
            if entry is None or entry.key != key:
                corrupt_entries.append(key)
            elif not entry.blob_digests() <= good:
                dangling.append(key)
            else:
                named |= entry.blob_digests()
                continue
            if repair:
                self._entry_path(key).unlink(missing_ok=True)
        return VerifyReport(entries, blobs, corrupt_blobs, corrupt_entries, dangling,
                            orphan_blobs=len(good - named), repaired=repair)

    def gc(self, max_bytes: int, keep: set[str] | frozenset[str] = frozenset()) -> GcReport:
        """Evict least-recently-used entries (not in ``keep``) until blobs fit ``max_bytes``."""
        with open(self.root / "locks" / "gc.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            entries = []
            for key, entry in self.iter_entries():
                path = self._entry_path(key)
                if entry is None:
                    path.unlink(missing_ok=True)
                    continue
                entries.append((path.stat().st_mtime, key, entry))
            entries.sort()
            sizes = {p.parent.name + p.name: p.stat().st_size for p in self._blob_files()}
            before = sum(sizes.values())

            def referenced(live: list) -> set[str]:
                return set().union(*(e.blob_digests() for _, _, e in live)) if live else set()

            live = list(entries)
            evicted = 0
            for item in entries:
                if sum(sizes.get(d, 0) for d in referenced(live)) <= max_bytes:
                    break
                if item[1] in keep:
                    continue
                live.remove(item)
                self._entry_path(item[1]).unlink(missing_ok=True)
                evicted += 1
            keep_blobs = referenced(live)
            deleted = 0
            for digest in sizes:
                if digest not in keep_blobs:
                    self._drop_blob(self.blob_path(digest))
                    deleted += 1
            self.clean_stale_tmp()
            after = sum(size for d, size in sizes.items() if d in keep_blobs)
            return GcReport(evicted, deleted, before - after, after)


def _link_or_copy(source: Path, target: Path) -> None:
    """Hard link (free, shares the read-only inode); copy across file systems."""
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(source, target)
        target.chmod(0o444)


def _rmtree(path: Path) -> None:
    """Remove a tree that may hold read-only files and folders."""
    if not (path.exists() or path.is_symlink()):
        return

    def make_writable(func, name, _exc):  # noqa: ANN001 (shutil's callback signature)
        os.chmod(os.path.dirname(name), 0o755)
        if os.path.isdir(name):
            os.chmod(name, 0o755)
        func(name)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)
