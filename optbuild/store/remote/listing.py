"""What the remote holds, asked in batches: its entries read together, its entries and its
blobs listed once a run, so that a build of many steps makes a few requests, not one a step.
A part of ``RemoteSession`` (``session`` holds the breaker and the counters it uses)."""

from __future__ import annotations

from collections.abc import Iterable

from optbuild.store.entry import ActionEntry, is_digest
from optbuild.store.remote.errors import Failed, Rejected
from optbuild.store.remote.parts import SessionParts

_UNASKED = object()  # a key prefetch did not answer for


class Listing(SessionParts):
    """``RemoteSession``'s batched questions: a mixin, whose fields, breaker and counters are
    the session's."""

    def prefetch(self, keys: Iterable[str]) -> None:
        """Read the entries of ``keys`` together (concurrent requests on an object store), so
        that ``lookup`` of each afterwards costs no round trip. Each answer serves one
        ``lookup``, which checks it as any entry it reads (signature, bounds, main output);
        a key whose read failed is left to ``lookup`` to ask again. Never raises."""
        with self._lock:
            known = set(self._prefetched)
            listed = self._listed
        wanted = sorted({key for key in keys if is_digest(key)} - known)
        if listed is not None:  # what the listing lacks is a miss already
            wanted = [key for key in wanted if key in listed]
        if not wanted or not self._usable():
            return
        try:
            found = self._call(f"reading {len(wanted)} entries", self.store._read_entries, wanted,
                               requests=len(wanted))  # one GET an entry, however batched
        except (Failed, Rejected):  # counted and reported; lookup asks again, key by key
            return
        with self._lock:
            self._prefetched.update(found)

    def prefetch_listing(self) -> None:
        """List the remote's entries once, so that ``lookup`` of a key not listed is a miss
        without a round trip. An entry pushed after the listing is missed in this run (the
        step builds here, as when two hosts race for it). Never raises."""
        if not self._usable():
            return
        try:
            listed = self._call("listing entries", self.store._entry_keys)
        except (Failed, Rejected):
            return
        with self._lock:
            self._listed = listed

    def listed_absent(self, key: str) -> bool:
        """Whether the listing (``prefetch_listing``) says the remote has no entry of ``key``."""
        with self._lock:
            return self._listed is not None and key not in self._listed

    def _answered(self, key: str) -> bytes | None:
        """The entry of ``key`` as prefetched (taken: it serves one lookup), or None when
        there was no answer; FileNotFoundError when the remote has none."""
        with self._lock:
            data = self._prefetched.pop(key, _UNASKED)
            if data is _UNASKED and self._listed is not None and key not in self._listed:
                data = None
        if data is None:
            self._note_absent(key)
            raise FileNotFoundError(key)
        return data if isinstance(data, bytes) else None  # not bytes: _UNASKED, no answer

    def holds_blobs(self, entry: ActionEntry, *, listing: bool, as_blobs: bool = False) -> bool:
        """Whether the remote holds every blob ``entry`` names, at its size: an entry whose
        outputs stay there is no use once one was evicted. ``listing``: by one listing of its
        blobs a run (a build of many steps), else by a request per blob (a few steps: a fleet's
        remote may hold millions of blobs). What the entry carries inline is held with it,
        unless ``as_blobs``: a Dask node reads each blob by its digest. Any failure is a no:
        the entry is then downloaded, which checks it."""
        sizes = {o.digest: o.size for o in entry.outputs.values()}  # the log's is not recorded
        wanted = sorted(entry.blob_digests() if as_blobs else entry.blobs_apart())
        listed = self._blob_listing() if listing and wanted else None  # none wanted: no listing

        def present(digest: str) -> bool:
            size = (listed.get(digest) if listed is not None
                    else self._call(f"checking blob {digest[:8]}", self.store._blob_size, digest))
            return size is not None and sizes.get(digest, size) == size

        try:
            return all(present(digest) for digest in wanted)
        except (Failed, Rejected):
            return False

    def _blob_listing(self) -> dict[str, int]:
        """Digest -> size of the remote's blobs, listed once a run (empty when that failed:
        said once; each entry is then downloaded, which checks it)."""
        with self._blobs_lock:  # not self._lock, which _usable and _call take
            if self._blobs is None and self._usable():
                try:
                    self._blobs = self._call("listing blobs", self.store._blob_sizes)
                except (Failed, Rejected):
                    self._blobs = {}
            return self._blobs or {}
