"""The local cache: content-addressed blobs and action entries on disk.

    cas/<2 hex>/<62 hex>        immutable blobs (BLAKE3-256), read-only (0444)
    ac/<2 hex>/<62 hex>.json    action entries (ActionEntry JSON); mtime = last use (LRU)
    tmp/<pid>@<host>@<label>-<random>   scratch of running builders, found by pid when stale
    locks/                      flock files: one per key, and the gc lock (the umask's permissions,
                                so a group sharing the cache can lock it: umask 002)
    .optbuild-folder            the marker of a cache folder optbuild made (``store.marker``)

Whatever is killed when, no half-written blob or entry is ever visible: everything is
written under tmp/ and renamed into place, a blob fsynced first (``folder._publish`` says
why an entry is not). An entry is served only when every blob
it names is present and verifies; anything corrupt is deleted and counts as a miss, so the
next build repopulates it instead of failing.

Restored outputs share bytes with the blobs (reflinks where the file system has them, else
hard links), so an edit through a hard link reaches the blob. Each blob's stat signature is
recorded when it is published; one whose signature changed is re-read before it is served,
linked or trusted as a step's input, so an edited blob is found and dropped, never served.

A store is read-only when its folders cannot be written (a read-only mount, another user's
cache) or when asked to be (``read_only_view``, for dry runs): it serves hits, takes locks
only where lock files exist, and never writes or deletes anything in the cache.

``LocalStore`` is made of one part per concern, each a module of ``optbuild.store``:
``folder`` (the folder, scratch space, publishing, locks), ``content`` (blobs), ``actions``
(entries), ``materialize`` (entries restored into folders) and ``gc`` (gc, trim, verify,
the gc lock). The layout it shares with the remote cache is ``layout``.
"""

from __future__ import annotations

import copy

from optbuild.store.gc import Collector
from optbuild.store.materialize import Materializer


class LocalStore(Collector, Materializer):
    """A cache folder shared by concurrent builders on this host (safe across processes)."""

    def read_only_view(self) -> LocalStore:
        """The same cache, changing nothing: for dry runs, which must leave even corrupt items
        for a real build (or ``verify --repair``) to remove."""
        view = copy.copy(self)
        view.read_only = True
        view.last_miss_reason = None
        return view
