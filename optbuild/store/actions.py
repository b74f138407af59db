"""The action cache: one entry per action key under ``ac/``, each naming the blobs of its
outputs and log. An entry is served only when every blob it names is present and verifies;
a corrupt or lying entry is deleted and counts as a miss, so the next build repopulates it.
An entry's mtime is its last use, which gc reads."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

from optbuild.common.digest import FileHasher
from optbuild.common.errors import CacheError, first_line
from optbuild.common.signatures import signature
from optbuild.store.content import ContentStore
from optbuild.store.entry import ActionEntry, check_digest, read_entry
from optbuild.store.layout import entry_name

GC_GRACE_S = 600.0  # gc keeps entries used this recently: a running build may restore them next
# a hit refreshes an entry's last use only when it is older than this (within the grace above):
# a no-op of 10,000 steps writes no inode, and the entries' signatures stay those the
# no-op fast path recorded
REFRESH_NS = int(GC_GRACE_S / 2 * 1e9)


class ActionCache(ContentStore):
    """The entries of a cache folder, over its blobs."""

    def __init__(self, root: Path, hasher: FileHasher, *, read_only: bool = False):
        super().__init__(root, hasher, read_only=read_only)
        self.last_miss_reason: str | None = None  # why the last get_action missed, for users
        # the entries marked used (``refresh_use``), each with the signature its mark gave: read and
        # checked just before, so the no-op stamp may vouch for it, young as it is (the memo does)
        self.refreshed: dict[str, list[int] | str] = {}

    def entry_path(self, key: str) -> Path:
        check_digest(key, "key")
        return self.root / entry_name(key)

    def get_action(self, key: str) -> ActionEntry | None:
        """The entry for ``key`` if it and every blob it names are intact, else None.

        A corrupt entry is a miss, never an error: it is deleted so the build repopulates
        it. ``last_miss_reason`` says why an existing entry was not served (None for a
        plain miss). A hit refreshes the entry's mtime, which gc reads as last use (when older
        than ``REFRESH_NS``). A read-only store deletes and refreshes nothing.
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
        with suppress(OSError):
            self.refresh_use(path, os.stat(path).st_mtime_ns)
        return entry

    def refresh_use(self, path: Path | str, mtime_ns: int) -> bool:
        """Mark the entry at ``path``, last used at ``mtime_ns``, as used now (its mtime, which
        gc reads) when that is older than ``REFRESH_NS``; whether it did. A read-only store
        refreshes nothing. OSError when the entry cannot be touched."""
        if self.read_only or time.time_ns() - mtime_ns <= REFRESH_NS:
            return False
        os.utime(path)
        self.refreshed[os.fspath(path)] = signature(os.fspath(path))
        return True

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
        entry = entry.uncarried()  # its blobs lie beside it
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
