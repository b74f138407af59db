"""The local cache: content-addressed blobs and action entries on disk.

    cas/<2 hex>/<62 hex>        immutable blobs (BLAKE3-256), read-only (0444)
    ac/<2 hex>/<62 hex>.json    action entries (ActionEntry JSON); mtime = last use (LRU)
    tmp/<pid>@<host>@<label>-<random>   scratch of running builders, found by pid when stale
    locks/                      flock files: one per key, and the gc lock (the umask's permissions,
                                so a group sharing the cache can lock it: umask 002)
    .optbuild-folder            the marker of a cache folder optbuild made (``store.marker``)

Whatever is killed when, no half-written blob or entry is ever visible: everything is
written under tmp/, fsynced and renamed into place. An entry is served only when every blob
it names is present and verifies; anything corrupt is deleted and counts as a miss, so the
next build repopulates it instead of failing.

Restored outputs share bytes with the blobs (reflinks where the file system has them, else
hard links), so an edit through a hard link reaches the blob. Each blob's stat signature is
recorded when it is published; one whose signature changed is re-read before it is served,
linked or trusted as a step's input, so an edited blob is found and dropped, never served.

A store is read-only when its folders cannot be written (a read-only mount, another user's
cache) or when asked to be (``read_only_view``, for dry runs): it serves hits, takes locks
only where lock files exist, and never writes or deletes anything in the cache.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import os
import re
import shutil
import socket
import stat
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from optbuild.common import processstate
from optbuild.common.atomic import fsync_path
from optbuild.common.digest import FileHasher, digest_bytes, hash_file, new_hasher
from optbuild.common.errors import CacheError, first_line
from optbuild.store.entry import (
    ActionEntry,
    OutputFile,
    check_digest,
    check_relative_path,
    is_digest,
    read_entry,
)
from optbuild.store.failures import FailureStore
from optbuild.store.flock import locked
from optbuild.store.marker import make_folder

_LOCK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_GC_LOCK = "@gc.lock"  # '@' is not allowed in lock names: no key can collide with it
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"
_CHUNK = 8 << 20
_FICLONE = 0x40049409  # Linux ioctl: make a file share another's extents (btrfs, XFS, bcachefs)
_HIDDEN = re.compile(r"\..+\.(\d+@[^@]+@(?:new|old)-[0-9a-f]{12})")  # materialize's siblings
_SUBDIRS = ("cas", "ac", "tmp", "locks")
GC_GRACE_S = 600.0  # gc keeps entries used this recently: a running build may restore them next
# a hit refreshes an entry's last use only when it is older than this (within the grace above):
# a no-op of 10,000 steps writes no inode, and the entries' signatures stay those the
# no-op fast path recorded
REFRESH_NS = int(GC_GRACE_S / 2 * 1e9)
_warned_read_only: set[Path] = processstate.fresh_set()  # read-only caches already reported

@dataclass(frozen=True)
class VerifyReport:
    """What ``LocalStore.verify`` found; ``ok`` is False if anything was wrong (even if repaired)."""

    entries: int
    blobs: int
    corrupt_blobs: tuple[str, ...] = ()  # digests (or cas/ paths of files no blob can be)
    corrupt_entries: tuple[str, ...] = ()  # keys
    dangling_entries: tuple[str, ...] = ()  # keys of entries naming a missing or corrupt blob
    orphan_blobs: int = 0  # intact blobs no entry names: not an error, gc removes them
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
            lines.append(f"  {self.orphan_blobs} blobs that no entry names (gc removes them)")
        if self.repaired and not self.ok:
            lines.append("  repaired: the bad items were deleted; the next build rebuilds them")
        return "\n".join(lines)


@dataclass(frozen=True)
class Kept:
    """Entries gc left in place for one reason, and the bytes of the blobs they name (a blob
    shared with entries kept for another reason counts under each)."""

    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class GcReport:
    """What ``LocalStore.gc`` did, and why it kept what it kept, so that a gc that freed
    little can say which protection to lift; ``ok`` is False when kept entries alone
    exceed the bound."""

    entries_evicted: int
    blobs_deleted: int
    bytes_freed: int
    bytes_now: int
    max_bytes: int
    locked: Kept = Kept()  # in ``keep`` (the lock file's), which gc would otherwise have evicted
    recent: Kept = Kept()  # used within the grace period, which gc would otherwise have evicted
    within_limit: Kept = Kept()  # never reached: the cache fit the bound before their turn
    failures_forgotten: int = 0  # remembered failures older than failures.MAX_AGE_S

    @property
    def ok(self) -> bool:
        return self.bytes_now <= self.max_bytes


class BlobGone(CacheError):
    """A blob vanished (gc, a user) or proved corrupt while it was being restored: the
    entry is a miss, and the step rebuilds rather than fails."""


class LocalStore:
    """A cache folder shared by concurrent builders on this host (safe across processes)."""

    def __init__(self, root: Path, hasher: FileHasher, *, read_only: bool = False):
        self.root = Path(root)
        self._cas = self.root / "cas"
        self._gc_held = threading.local()  # how deep this thread holds shared_gc_lock
        self.hasher = hasher
        self.last_miss_reason: str | None = None  # why the last get_action missed, for users
        self._reflinks = True  # until the file system says it cannot clone
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

    def read_only_view(self) -> LocalStore:
        """The same cache, changing nothing: for dry runs, which must leave even corrupt items
        for a real build (or ``verify --repair``) to remove."""
        view = copy.copy(self)
        view.read_only = True
        view.last_miss_reason = None
        return view

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            why = "it is read-only here" if not self.writable else "this is a dry run"
            raise CacheError(f"cannot {what} in the cache {self.root}: {why}")

    # --- paths and scratch space -------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        """Where a blob lives. Only a digest is accepted, so no name can point outside cas/."""
        check_digest(digest, "digest")
        return Path(f"{self._cas}/{digest[:2]}/{digest[2:]}")  # one parse, not three joins: a no-op asks often

    def entry_path(self, key: str) -> Path:
        check_digest(key, "key")
        return self.root / "ac" / key[:2] / f"{key[2:]}.json"

    def _tmp_name(self, label: str) -> Path:
        return self.root / "tmp" / _owned_name(re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:64])

    def new_tmp_dir(self, prefix: str = "") -> Path:
        """A fresh scratch folder (same file system as cas/, so outputs move in by rename).

        Its name carries our pid and host, so ``clean_stale_tmp`` can tell when it is
        abandoned; the caller removes it when done.
        """
        self._require_writable("make scratch space")
        path = self._tmp_name(prefix)
        path.mkdir()
        return path

    def clean_stale_tmp(self) -> int:
        """Remove what builders killed on this host left in tmp/; returns how many items.

        Items of live processes, of other hosts (a shared file system) and with foreign
        names are left alone, and so is everything in a read-only store.
        """
        removed = 0
        if self.read_only:
            return removed
        for path in (self.root / "tmp").iterdir():
            if _owner_dead(path.name):
                _remove(path)
                removed += 1
        return removed

    @contextmanager
    def _temp_file(self) -> Iterator[Path]:
        """A path under tmp/ that is removed afterwards unless it was published."""
        tmp = self._tmp_name("file")
        try:
            yield tmp
        finally:
            _remove(tmp)

    def _publish(self, tmp: Path, dest: Path, digest: str | None = None) -> None:
        """Make a finished temp file visible at ``dest``: read-only, on disk, renamed whole.

        A blob's signature is recorded with its ``digest``, so a later edit of the blob
        (through a hard link) changes the signature and makes the next check re-read it.
        """
        os.chmod(tmp, 0o444)
        fsync_path(tmp)
        if not dest.parent.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            fsync_path(dest.parent.parent)
        os.replace(tmp, dest)
        fsync_path(dest.parent)
        if digest is not None:
            self.hasher.record(dest, digest)

    # --- blobs -------------------------------------------------------------------------
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
                if not (move and _take(path, tmp)):
                    copied = _copy_hashing(path, tmp)
                    if copied != digest:  # never file bytes under a name that is not theirs
                        raise CacheError(f"{path} changed while it was being stored in the cache")
                self._publish(tmp, dest, digest)
        if move:
            path.unlink(missing_ok=True)
        return OutputFile(digest=digest, size=size)

    def put_bytes(self, data: bytes) -> str:
        """Store ``data`` (a log, say) and return its digest."""
        self._require_writable("store a step log")
        digest = digest_bytes(data)
        if not self.blob_ok(digest, len(data)):
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

    def trim_blobs(self, max_bytes: int, min_age_s: float = GC_GRACE_S) -> int:
        """For a store of blobs only (a build node's, ``optbuild worker --cache``): delete the
        least recently used blobs (``mark_used``) until the rest fit ``max_bytes``, and the
        scratch space of dead processes. A blob used in the last ``min_age_s`` seconds stays,
        even past the bound: a task may be about to link it. Under the exclusive gc lock, as
        ``gc``; returns how many blobs went."""
        self._require_writable("trim the cache")
        recent = time.time_ns() - int(min_age_s * 1e9)
        deleted = 0
        with self._flock(_GC_LOCK):
            blobs = []  # and anything else under cas/ (digest None), which goes as a blob would
            for _digest, path, size in self._scan_blobs():
                with suppress(FileNotFoundError):
                    blobs.append((path.stat().st_mtime_ns, str(path), path, size))
            total = sum(size for *_, size in blobs)
            for mtime, _name, path, size in sorted(blobs, key=lambda blob: blob[:2]):
                if total <= max_bytes or mtime >= recent:
                    break
                self.hasher.forget(path)
                with suppress(OSError):
                    _remove(path)
                    total -= size
                    deleted += 1
            self.clean_stale_tmp()
        return deleted

    def _drop_blob(self, digest: str) -> None:
        path = self.blob_path(digest)
        self.hasher.forget(path)
        with suppress(OSError):  # if it cannot go, the next put replaces it anyway
            _remove(path)

    # --- action entries ----------------------------------------------------------------
    def get_action(self, key: str) -> ActionEntry | None:
        """The entry for ``key`` if it and every blob it names are intact, else None.

        A corrupt entry is a miss, never an error: it is deleted so the build repopulates
        it. ``last_miss_reason`` says why an existing entry was not served (None for a
        plain miss). A hit refreshes the entry's mtime, which gc reads as last use (when older
        than ``REFRESH_NS``). A
        read-only store deletes and refreshes nothing.
        """
        self.last_miss_reason = None
        path = self.entry_path(key)
        removed = "" if self.read_only else " and was removed"
        try:
            entry = read_entry(path, key)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.last_miss_reason = f"its cache entry was corrupt ({first_line(exc)}){removed}"
            self._drop_entry(path)
            return None
        names = {o.digest: n for n, o in sorted(entry.outputs.items(), reverse=True)}  # first name wins
        sizes = {o.digest: o.size for o in entry.outputs.values()}
        for digest in sorted(entry.blob_digests()):
            what = names.get(digest, "the step log")
            problem, actual = self._blob_problem(digest)
            if problem is not None:
                self.last_miss_reason = f"cached blob {digest[:8]}… of {what} is {problem}"
                return None
            if digest in sizes and actual != sizes[digest]:  # the blob is intact: the entry lies
                self.last_miss_reason = (f"its cache entry was wrong (it records {sizes[digest]} bytes for "
                                         f"{what}, whose intact blob holds {actual}){removed}")
                self._drop_entry(path)
                return None
        if not self.read_only:
            with suppress(OSError):
                if time.time_ns() - os.stat(path).st_mtime_ns > REFRESH_NS:
                    os.utime(path)
        return entry

    def _drop_entry(self, path: Path) -> None:
        if not self.read_only:
            with suppress(OSError):  # if it cannot go, it stays a miss
                path.unlink(missing_ok=True)

    def put_action(self, entry: ActionEntry) -> None:
        """Publish ``entry``; every blob it names must already be stored.

        Blobs first, then the entry, so a reader never meets an entry without its blobs.
        Hold ``shared_gc_lock`` from the first put to this one, or gc may take the blobs.
        """
        self._require_writable(f"store the entry of {entry.step}")
        for digest in sorted(entry.blob_digests()):
            if not self.blob_path(digest).is_file():
                raise CacheError(f"entry {entry.key} names blob {digest}, which is not stored")
        with self._temp_file() as tmp:
            tmp.write_text(entry.model_dump_json())
            self._publish(tmp, self.entry_path(entry.key))

    def iter_entries(self) -> Iterator[tuple[str, ActionEntry | None]]:
        """Every (key, entry) in the cache; entry is None when it is corrupt."""
        for key, _path, entry in self._scan_entries():
            yield key, entry

    def _scan_entries(self) -> Iterator[tuple[str, Path, ActionEntry | None]]:
        for path in sorted((self.root / "ac").glob("*/*.json")):
            key = path.parent.name + path.name[: -len(".json")]
            try:
                entry: ActionEntry | None = read_entry(path, key)
            except FileNotFoundError:  # deleted since the listing
                continue
            except (OSError, ValueError):
                entry = None
            yield key, path, entry

    # --- locks -------------------------------------------------------------------------
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

    @contextmanager
    def shared_gc_lock(self) -> Iterator[None]:
        """Held shared by builders while they store, exclusively by gc.

        So gc never deletes the blobs of an entry that is being written. Do not call gc
        while holding it (same process or not, gc waits for it). Re-entrant in a thread: a
        scheduler holds it over a burst of decisions, each of which takes it again for free.
        """
        if getattr(self._gc_held, "depth", 0):
            self._gc_held.depth += 1
            try:
                yield
            finally:
                self._gc_held.depth -= 1
            return
        with self._flock(_GC_LOCK, shared=True):
            self._gc_held.depth = 1
            try:
                yield
            finally:
                self._gc_held.depth = 0

    @contextmanager
    def lock_dest(self, dest: Path) -> Iterator[None]:
        """Held while ``dest`` is checked and restored, so concurrent restores do not race."""
        with self.lock("dest-" + digest_bytes(str(dest).encode())):
            yield

    def _flock(self, filename: str, *, shared: bool = False,
               waiting: Callable[[list[int]], None] | None = None) -> AbstractContextManager[None]:
        """``flock`` on a lock file under locks/; a read-only store locks only files that
        exist and otherwise goes on unlocked (see ``store.flock.locked``)."""
        return locked(self.root / "locks" / filename, shared=shared, read_only=self.read_only, waiting=waiting)

    # --- materialization ---------------------------------------------------------------
    def materialize(self, entry: ActionEntry, dest: Path) -> None:
        """Make the folder ``dest`` hold exactly the entry's outputs, read-only.

        Files are reflinks of the blobs where the file system can clone (free, and an edit
        stays in the copy), else hard links (free), else copies. Each blob is verified
        first (a stat when unchanged); one that is gone or corrupt raises BlobGone. The
        tree is built in a hidden sibling and swapped in, so ``dest`` is never half
        populated: a reader sees the old tree, nothing, or the new tree. Folders stay
        writable so that users can delete the tree.
        """
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.sweep_leftovers(dest.parent)
        hidden = f".{dest.name}."
        staging = dest.parent / (hidden + _owned_name("new"))
        old = dest.parent / (hidden + _owned_name("old"))
        staging.mkdir()
        try:
            self._populate(entry, staging)
            with suppress(FileNotFoundError):
                os.rename(dest, old)
            os.rename(staging, dest)
        finally:
            _remove(staging)
            _remove(old)

    def _populate(self, entry: ActionEntry, folder: Path) -> None:
        root = folder.resolve()
        parents = {p.as_posix() for name in entry.outputs for p in Path(name).parents}
        for name, output in sorted(entry.outputs.items()):
            try:
                check_relative_path(name)
            except ValueError as exc:
                raise CacheError(f"entry {entry.key}: {exc}") from None
            target = folder / name
            if name in parents or not target.parent.resolve().is_relative_to(root):
                raise CacheError(f"entry {entry.key}: output path {name!r} cannot be written")
            target.parent.mkdir(parents=True, exist_ok=True)
            source = self.blob_path(output.digest)
            problem, _size = self._blob_problem(output.digest)
            if problem == "missing":
                raise BlobGone(f"blob {output.digest} of {name} is not in the cache")
            if problem is not None:
                raise BlobGone(f"blob {output.digest} of {name} is {problem}")
            if self._reflinks and self._reflink(source, target):
                os.chmod(target, 0o444)
                self.hasher.record(target, output.digest)
                continue
            try:
                os.link(source, target)
            except FileNotFoundError:
                raise BlobGone(f"blob {output.digest} of {name} is not in the cache") from None
            except OSError:  # another file system, link limit, links forbidden: copy
                if _copy_hashing(source, target) != output.digest:
                    raise BlobGone(f"blob {output.digest} of {name} changed while it was copied") from None
                os.chmod(target, 0o444)
                self.hasher.record(target, output.digest)
            else:  # the link changed the blob's ctime: record it again, just verified
                with suppress(OSError):
                    self.hasher.record(source, output.digest)

    def _reflink(self, source: Path, target: Path) -> bool:
        """Clone ``source`` into a new file ``target`` (shared extents, copy on write);
        False, with nothing left at ``target``, where the file system cannot."""
        try:
            with open(source, "rb") as src, open(target, "xb") as dst:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            return True
        except OSError as exc:
            target.unlink(missing_ok=True)
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.EXDEV, errno.ENOSYS):
                self._reflinks = False  # this file system never will: stop asking
            return False

    def sweep_leftovers(self, folder: Path) -> None:
        """Remove the hidden trees that restores killed mid-swap left in ``folder``.

        Cheap (one listing), so it runs on every restore: a leftover is found even when
        its step's outputs never need restoring again.
        """
        with suppress(OSError):  # an unreadable or read-only folder: the restore itself says so
            for sibling in Path(folder).iterdir():
                match = _HIDDEN.fullmatch(sibling.name)
                if match and _owner_dead(match.group(1)):
                    _remove(sibling)

    def is_materialized(self, entry: ActionEntry, dest: Path) -> bool:
        """Whether ``dest`` already holds exactly the entry's outputs (cheap: no copy made).

        Every output is there as a regular file with the right size and digest, and
        nothing else is there. The digest is the stat cache's: of the blob when the file is
        its hard link (so an edit of the blob counts), else of the file itself.
        """
        dest = Path(dest)
        wanted_dirs = {p.as_posix() for name in entry.outputs for p in Path(name).parents} - {"."}
        try:
            if _listing(str(dest), wanted_dirs) != set(entry.outputs):
                return False
            return all(self._holds(dest / name, output) for name, output in entry.outputs.items())
        except OSError:
            return False

    def _holds(self, path: Path, output: OutputFile) -> bool:
        """Whether ``path`` is a regular file with ``output``'s bytes (a stat, when unchanged)."""
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != output.size:
            return False
        blob = self.blob_path(output.digest)
        with suppress(FileNotFoundError):
            linked = os.stat(blob)
            if (linked.st_dev, linked.st_ino) == (st.st_dev, st.st_ino):
                path = blob  # one inode: the blob's record is kept up to date
        return self.hasher.digest(path) == output.digest

    def changed_outputs(self, entry: ActionEntry, dest: Path) -> list[str]:
        """Names of the entry's outputs that ``dest`` no longer holds intact (a step that
        wrote into its input, say). A blob the change reached, through a hard link, is
        deleted, so that no later build is served it."""
        changed = []
        for name, output in sorted(entry.outputs.items()):
            try:
                if self._holds(Path(dest) / name, output):
                    continue
            except OSError:
                pass
            changed.append(name)
            self._blob_problem(output.digest)
        return changed

    # --- maintenance -------------------------------------------------------------------
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

    def verify(self, repair: bool = False) -> VerifyReport:
        """Re-read every blob and entry, bypassing the stat cache.

        This finds what ``blob_ok`` cannot: bytes that rotted on disk without a stat change.
        Entries are checked by the same rules as a remote's (``parse_entry``): one naming a
        path no file system can create is corrupt. With ``repair``, corrupt blobs, corrupt
        entries and entries naming a bad blob are deleted (the next build rebuilds them);
        orphan blobs are left to gc.
        """
        if repair:
            self._require_writable("repair what is corrupt")
        intact: dict[str, int] = {}  # digest -> size
        scanned: set[str | None] = set()
        corrupt_blobs: list[str] = []
        blobs = 0
        for digest, path, size in self._scan_blobs():
            blobs += 1
            scanned.add(digest)
            if digest is not None and _rehash(path) == digest:
                intact[digest] = size
                continue
            corrupt_blobs.append(digest or path.relative_to(self.root).as_posix())
            if repair:
                self.hasher.forget(path)
                with suppress(OSError):
                    _remove(path)
        corrupt_entries: list[str] = []
        dangling: list[str] = []
        named: set[str] = set()
        entries = 0
        for key, path, entry in self._scan_entries():
            entries += 1
            if entry is None:
                corrupt_entries.append(key)
            else:
                for digest in entry.blob_digests() - scanned:  # stored since the scan?
                    scanned.add(digest)
                    late = self.blob_path(digest)
                    if _rehash(late) == digest:
                        intact[digest] = late.stat().st_size
                sizes = {o.digest: o.size for o in entry.outputs.values()}
                if not all(d in intact for d in entry.blob_digests()):
                    dangling.append(key)
                elif any(sizes.get(d, intact[d]) != intact[d] for d in entry.blob_digests()):
                    corrupt_entries.append(key)  # its blobs are intact; its record of them is wrong
                else:
                    named |= entry.blob_digests()
                    continue
            if repair:
                path.unlink(missing_ok=True)
        return VerifyReport(entries, blobs, tuple(corrupt_blobs), tuple(corrupt_entries),
                            tuple(dangling), orphan_blobs=len(intact.keys() - named), repaired=repair)

    def gc(self, max_bytes: int, keep: AbstractSet[str] = frozenset(), min_age_s: float = GC_GRACE_S,
           waiting: Callable[[list[int]], None] | None = None) -> GcReport:
        """Evict least-recently-used entries until the blobs they name fit ``max_bytes``.

        Entries whose key is in ``keep`` (what the lock file references) or that were used
        (stored or hit) in the last ``min_age_s`` seconds are never evicted, even if the bound
        cannot be met: a running build may be about to restore them. Then every blob no
        remaining entry names, every corrupt entry and the scratch space of dead builders
        are deleted. Runs under the exclusive gc lock, so blobs of an entry being written
        or restored are safe; ``waiting`` is told, with their pids, when gc must wait for the
        builds holding it. The report counts what each protection kept (``keep`` first).
        """
        self._require_writable("collect garbage")
        recent = time.time_ns() - int(min_age_s * 1e9)
        with self._flock(_GC_LOCK, waiting=waiting):
            blobs = list(self._scan_blobs())
            sizes = {digest: size for digest, _path, size in blobs if digest is not None}
            before = sum(size for _digest, _path, size in blobs)
            evicted = 0
            live = []
            for key, path, entry in self._scan_entries():
                try:
                    mtime = path.stat().st_mtime_ns
                except FileNotFoundError:
                    continue
                if entry is None:
                    path.unlink(missing_ok=True)
                    evicted += 1
                else:
                    live.append((mtime, key, path, entry))
            refs = Counter(d for *_, entry in live for d in entry.blob_digests())
            now = sum(sizes.get(d, 0) for d in refs)
            kept: dict[str, list[ActionEntry]] = {"locked": [], "recent": [], "within_limit": []}
            for mtime, key, path, entry in sorted(live, key=lambda item: item[:2]):
                if now <= max_bytes:
                    kept["within_limit"].append(entry)
                elif key in keep:
                    kept["locked"].append(entry)
                elif mtime >= recent:
                    kept["recent"].append(entry)
                else:
                    path.unlink(missing_ok=True)
                    evicted += 1
                    for digest in entry.blob_digests():
                        refs[digest] -= 1
                        if refs[digest] == 0:
                            del refs[digest]
                            now -= sizes.get(digest, 0)
            deleted = 0
            for digest, path, _size in blobs:
                if digest not in refs:
                    self.hasher.forget(path)
                    with suppress(OSError):
                        _remove(path)
                    deleted += 1
            self.clean_stale_tmp()
            why = {reason: Kept(len(entries), sum(sizes.get(d, 0) for d in _digests(entries)))
                   for reason, entries in kept.items()}
            return GcReport(evicted, deleted, before - now, now, max_bytes, **why,
                            failures_forgotten=FailureStore(self.root).prune())


# --- helpers ---------------------------------------------------------------------------
def _digests(entries: list[ActionEntry]) -> set[str]:
    return {d for entry in entries for d in entry.blob_digests()}


def _owned_name(label: str) -> str:
    """A fresh file name that says which process (pid and host) owns it."""
    return f"{os.getpid()}@{_HOST}@{label}-{uuid.uuid4().hex[:12]}"


def _owner_dead(name: str) -> bool:
    """Whether ``name`` (from ``_owned_name``) belongs to a process of this host that is gone."""
    pid, _, rest = name.partition("@")
    host, _, _ = rest.partition("@")
    if not pid.isdigit() or int(pid) <= 0 or host != _HOST:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _take(source: Path, tmp: Path) -> bool:
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


def _copy_hashing(source: Path, target: Path) -> str:
    """Copy ``source`` to a new file ``target``; the digest of exactly the bytes copied."""
    h = new_hasher()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(source, "rb") as src, open(target, "xb") as dst:
        while n := src.readinto(buf):
            h.update(view[:n])
            dst.write(view[:n])
    return h.hexdigest()


def _rehash(path: Path) -> str | None:
    """Digest read from disk (no stat cache); None when the file cannot be read."""
    try:
        return hash_file(path)[0]
    except OSError:
        return None


def _listing(folder: str, wanted_dirs: set[str]) -> set[str] | None:
    """The relative names of everything but folders under ``folder``; None when a folder
    there is not one of ``wanted_dirs`` or is a symbolic link (os.scandir: a stat-free walk,
    as a no-op looks at every step's folder). OSError when ``folder`` cannot be listed."""
    found: set[str] = set()
    stack = [("", folder)]
    while stack:
        prefix, path = stack.pop()
        with os.scandir(path) as entries:
            for item in entries:
                name = prefix + item.name
                if item.is_dir():
                    if name not in wanted_dirs or item.is_symlink():
                        return None
                    stack.append((name + "/", item.path))
                else:
                    found.add(name)
    return found


def _remove(path: Path) -> None:
    """Delete a file or a tree (read-only folders included); already gone is fine."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
            return
        os.chmod(path, 0o700)
        for dirpath, dirnames, _files in os.walk(path):
            for name in dirnames:
                if not os.path.islink(os.path.join(dirpath, name)):
                    os.chmod(os.path.join(dirpath, name), 0o700)
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
