"""Keeping the cache in bounds and intact: gc (entries evicted least recently used first,
then every blob no entry names), ``trim_blobs`` for a store of blobs only, ``verify``, the
scratch space of dead builders, and the gc lock that builders hold shared while they store.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from optbuild.common.digest import FileHasher
from optbuild.store.actions import GC_GRACE_S, ActionCache
from optbuild.store.entry import ActionEntry
from optbuild.store.failures import FailureStore
from optbuild.store.files import owner_dead, rehash, remove
from optbuild.store.folder import GC_LOCK


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


class Collector(ActionCache):
    """The maintenance of a cache folder: what walks all of it, under the gc lock."""

    def __init__(self, root: Path, hasher: FileHasher, *, read_only: bool = False):
        super().__init__(root, hasher, read_only=read_only)
        self._gc_held = threading.local()  # how deep this thread holds shared_gc_lock

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
        with self._flock(GC_LOCK, shared=True):
            self._gc_held.depth = 1
            try:
                yield
            finally:
                self._gc_held.depth = 0

    def clean_stale_tmp(self) -> int:
        """Remove what builders killed on this host left in tmp/; returns how many items.

        Items of live processes, of other hosts (a shared file system) and with foreign
        names are left alone, and so is everything in a read-only store.
        """
        removed = 0
        if self.read_only:
            return removed
        for path in (self.root / "tmp").iterdir():
            if owner_dead(path.name):
                remove(path)
                removed += 1
        return removed

    def trim_blobs(self, max_bytes: int, min_age_s: float = GC_GRACE_S) -> int:
        """For a store of blobs only (a build node's, ``optbuild worker --cache``): delete the
        least recently used blobs (``mark_used``) until the rest fit ``max_bytes``, and the
        scratch space of dead processes. A blob used in the last ``min_age_s`` seconds stays,
        even past the bound: a task may be about to link it. Under the exclusive gc lock, as
        ``gc``; returns how many blobs went."""
        self._require_writable("trim the cache")
        recent = time.time_ns() - int(min_age_s * 1e9)
        deleted = 0
        with self._flock(GC_LOCK):
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
                    remove(path)
                    total -= size
                    deleted += 1
            self.clean_stale_tmp()
        return deleted

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
            if digest is not None and rehash(path) == digest:
                intact[digest] = size
                continue
            corrupt_blobs.append(digest or path.relative_to(self.root).as_posix())
            if repair:
                self.hasher.forget(path)
                with suppress(OSError):
                    remove(path)
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
                    if rehash(late) == digest:
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
        with self._flock(GC_LOCK, waiting=waiting):
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
            for scanned, path, _size in blobs:
                if scanned not in refs:
                    self.hasher.forget(path)
                    with suppress(OSError):
                        remove(path)
                    deleted += 1
            self.clean_stale_tmp()
            why = {reason: Kept(len(entries), sum(sizes.get(d, 0) for d in _digests(entries)))
                   for reason, entries in kept.items()}
            return GcReport(evicted, deleted, before - now, now, max_bytes, **why,
                            failures_forgotten=FailureStore(self.root).prune())


def _digests(entries: list[ActionEntry]) -> set[str]:
    return {d for entry in entries for d in entry.blob_digests()}
