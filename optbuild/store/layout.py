"""The one layout of a cache, local or remote: where the blob of a digest and the entry of a
key lie under its root. A local cache folder is laid out as a remote is (a ``file://``
remote can be a copy of one), because both name their files here."""

from __future__ import annotations

import os
from typing import Protocol

ENTRIES = "ac"  # the folder of the entries, in folders by their key's first two hex digits


def blob_name(digest: str) -> str:
    """The blob of ``digest``, relative to a cache's root: ``cas/<2 hex>/<62 hex>``."""
    return f"cas/{digest[:2]}/{digest[2:]}"


def entry_name(key: str, slot: str | None = None) -> str:
    """The entry of ``key``, relative to a cache's root: ``ac/<2 hex>/<62 hex>.json``
    (``.<slot>.json`` for a remote key holder's entry beside another's)."""
    name = key[2:] if slot is None else f"{key[2:]}.{slot}"
    return f"{ENTRIES}/{key[:2]}/{name}.json"


class BlobStore(Protocol):
    """What the local store and the remote share about blobs: a blob is found by its
    digest alone, at ``blob_name`` under the store's root (a local path, or a path on the
    remote's file system). Putting and reading differ (a local put is a rename, a remote one
    a transfer under a watchdog), so they are each store's own."""

    def blob_path(self, digest: str) -> str | os.PathLike[str]:
        """Where the blob of ``digest`` lies in this store."""
        ...
