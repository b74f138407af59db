"""The local cache and the remote share one layout (``store.layout``): a local cache folder
read as a ``file://`` remote serves what the local store put in it."""

from __future__ import annotations

from pathlib import Path

from plugins.store import store_entry

from optbuild.common.digest import FileHasher
from optbuild.store.layout import BlobStore
from optbuild.store.local import LocalStore
from optbuild.store.remote import RemoteSession, RemoteStore


def test_a_local_cache_folder_read_as_a_remote_serves_its_entries_and_blobs(tmp_path: Path, store: LocalStore):
    entry = store_entry(store, "model", {"model.onnx": b"weights", "sub/extra.bin": b"more"}, log=b"built")
    remote = RemoteStore(store.root.as_uri())
    other = LocalStore(tmp_path / "other", FileHasher(None))

    session = RemoteSession(remote)
    found = session.lookup(entry.key)
    assert found == entry
    with other.shared_gc_lock():
        assert session.fetch(found, other) == entry
    assert other.get_action(entry.key) == entry
    assert other.read_blob(entry.outputs["model.onnx"].digest) == b"weights"
    assert session.stats.rejected == 0 and session.stats.blobs_down == 3


def test_both_stores_place_a_blob_at_the_same_name_under_their_root(store: LocalStore):
    digest = store.put_bytes(b"shared")
    remote = RemoteStore(store.root.as_uri())
    _fs, root = remote.filesystem()
    stores: list[BlobStore] = [store, remote]
    places = [Path(str(s.blob_path(digest))) for s in stores]
    assert places[0] == places[1] == Path(root) / "cas" / digest[:2] / digest[2:]
