"""The local store: what it serves is always complete and intact, whatever happened to it."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pwd
import random
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from plugins.store import (
    contend_for_lock,
    hold_shared_gc_lock,
    key_for,
    leave_tmp_dir,
    lock_as,
    make_entry,
    store_entry,
    store_forever,
)
from pydantic import ValidationError

from optbuild.common.digest import digest_bytes
from optbuild.common.errors import CacheError
from optbuild.store.actions import GC_GRACE_S
from optbuild.store.entry import ActionEntry, OutputFile
from optbuild.store.gc import Kept
from optbuild.store.local import LocalStore

SPAWN = multiprocessing.get_context("spawn")
HOUR_AGO = time.time() - 3600


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if not p.is_dir())


def read_only(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o222 == 0


def flip_first_byte(path: Path, keep_mtime: bool = False) -> None:
    st = path.stat()
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def entry_path(store: LocalStore, key: str) -> Path:
    return store.root / "ac" / key[:2] / f"{key[2:]}.json"


def run_child(target, *args) -> None:
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0


# --- blobs -------------------------------------------------------------------------------
def test_put_file_copies_into_a_read_only_blob_and_leaves_the_source(store, tmp_path):
    source = tmp_path / "model.onnx"
    source.write_bytes(b"onnx bytes")
    out = store.put_file(source)
    assert out == OutputFile(digest=digest_bytes(b"onnx bytes"), size=10)
    blob = store.blob_path(out.digest)
    assert blob == store.root / "cas" / out.digest[:2] / out.digest[2:]
    assert read_only(blob) and store.read_blob(out.digest) == b"onnx bytes"
    assert source.read_bytes() == b"onnx bytes" and not read_only(source)
    assert store.blob_ok(out.digest, 10) and store.blob_ok(out.digest)
    assert not store.blob_ok(out.digest, 11) and blob.exists()  # a wrong claimed size is not corruption


def test_identical_content_is_stored_once(store, tmp_path):
    (tmp_path / "a").write_bytes(b"same")
    (tmp_path / "b").write_bytes(b"same")
    digests = {store.put_file(tmp_path / "a").digest, store.put_file(tmp_path / "b", move=True).digest,
               store.put_bytes(b"same")}
    assert len(digests) == 1
    assert files_under(store.root / "cas") == [store.blob_path(digests.pop())]
    assert not (tmp_path / "b").exists()  # moved onto an existing blob: the source is dropped
    assert store.size_bytes() == 4


def test_put_file_move_renames_the_file_itself(store, tmp_path):
    source = store.new_tmp_dir("build") / "engine.plan"
    source.write_bytes(b"x" * 5000)
    inode = source.stat().st_ino
    out = store.put_file(source, move=True)
    assert not source.exists()
    blob = store.blob_path(out.digest)
    assert blob.stat().st_ino == inode and read_only(blob)
    assert files_under(store.root / "tmp") == []


def test_put_file_move_copies_a_file_with_other_hard_links(store, tmp_path):
    user_file = tmp_path / "user-model.onnx"
    user_file.write_bytes(b"the user's model")
    linked = store.new_tmp_dir("build") / "model.onnx"
    os.link(user_file, linked)
    out = store.put_file(linked, move=True)
    assert not linked.exists()
    assert store.blob_path(out.digest).stat().st_ino != user_file.stat().st_ino
    assert not read_only(user_file)  # the user's file was neither taken nor chmodded


def test_put_file_move_across_file_systems_copies(store, tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a writable /dev/shm on another file system")
    source = shm / f"optbuild-test-{os.getpid()}"
    source.write_bytes(b"elsewhere")
    try:
        out = store.put_file(source, move=True)
    finally:
        source.unlink(missing_ok=True)
    assert store.read_blob(out.digest) == b"elsewhere" and not source.exists()


def test_a_corrupt_blob_is_replaced_by_the_next_put(store, tmp_path):
    digest = store.put_bytes(b"payload")
    flip_first_byte(store.blob_path(digest))
    assert store.put_bytes(b"payload") == digest
    assert store.read_blob(digest) == b"payload" and read_only(store.blob_path(digest))


def test_a_read_only_store_gives_a_held_blob_and_names_what_it_cannot_store(store):
    held = store.put_bytes(b"held")
    reader = LocalStore(store.root, store.hasher, read_only=True)
    assert reader.put_bytes(b"held") == held  # held already: nothing to store
    with pytest.raises(CacheError, match=r"cannot store blob 0123 from afar in the cache .*: this is a dry run"):
        reader.put_bytes(b"new", "blob 0123 from afar")


def test_read_blob_verifies_and_removes_a_corrupt_blob(store):
    digest = store.put_bytes(b"a log")
    flip_first_byte(store.blob_path(digest))
    with pytest.raises(CacheError, match="corrupt"):
        store.read_blob(digest)
    assert not store.blob_path(digest).exists()
    with pytest.raises(CacheError, match="not in the cache"):
        store.read_blob(digest)


def test_names_that_are_not_digests_are_refused(store):
    for bad in ("../../etc/passwd", "ABCDEF" * 6, "00", digest_bytes(b"x") + "/"):
        with pytest.raises(ValueError):
            store.blob_path(bad)
        with pytest.raises(ValueError):
            store.get_action(bad)
    with pytest.raises(ValueError), store.lock("../escape"):
        pass


# --- action entries ------------------------------------------------------------------------
def test_put_and_get_action_round_trip(store):
    entry = store_entry(store, "k", {"model.onnx": b"model", "sub/calib.json": b"{}"}, log=b"built ok")
    got = store.get_action(entry.key)
    assert got == entry and store.last_miss_reason is None
    assert read_only(entry_path(store, entry.key))
    assert [key for key, _ in store.iter_entries()] == [entry.key]
    assert store.get_action(key_for("never built")) is None and store.last_miss_reason is None


def test_a_hit_refreshes_the_entry_mtime_for_lru(store):
    entry = store_entry(store, "k", {"a": b"a"})
    os.utime(entry_path(store, entry.key), (HOUR_AGO, HOUR_AGO))
    assert store.get_action(entry.key) is not None
    assert entry_path(store, entry.key).stat().st_mtime > time.time() - 60


def test_a_hit_on_an_entry_used_within_half_the_gc_grace_writes_nothing(store):
    """A no-op of many steps dirties no inode, and keeps the signatures the fast path recorded."""
    entry = store_entry(store, "k", {"a": b"a"})
    recent = time.time() - GC_GRACE_S / 4
    os.utime(entry_path(store, entry.key), (recent, recent))
    before = entry_path(store, entry.key).stat()
    assert store.get_action(entry.key) is not None
    after = entry_path(store, entry.key).stat()
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)


def test_a_flipped_byte_in_a_blob_is_a_miss_and_the_blob_is_removed(store, hasher):
    entry = store_entry(store, "k", {"model.onnx": b"weights" * 100})
    blob = store.blob_path(entry.outputs["model.onnx"].digest)
    os.utime(blob, (HOUR_AGO, HOUR_AGO))  # old enough for the stat cache to remember it
    assert store.get_action(entry.key) is not None
    hasher.flush()
    flip_first_byte(blob, keep_mtime=True)  # same size and mtime: only ctime tells
    assert store.get_action(entry.key) is None
    assert "model.onnx" in store.last_miss_reason and "corrupt" in store.last_miss_reason
    assert not blob.exists()
    store.put_bytes(b"weights" * 100)  # the rebuild repopulates it
    assert store.get_action(entry.key) == entry


@pytest.mark.parametrize("text", ["", "{ not json", '{"format": 1, "key": "', '{"format": 1}', "[]"])
def test_a_garbage_or_truncated_entry_is_a_miss_and_is_removed(store, text):
    entry = store_entry(store, "k", {"a": b"a"})
    path = entry_path(store, entry.key)
    path.chmod(0o644)
    path.write_text(text)
    assert store.get_action(entry.key) is None
    assert "corrupt" in store.last_miss_reason
    assert not path.exists() and list(store.iter_entries()) == []


def test_a_truncated_copy_of_a_real_entry_is_a_miss(store):
    entry = store_entry(store, "k", {"a": b"a"})
    path = entry_path(store, entry.key)
    text = path.read_text()
    path.chmod(0o644)
    path.write_text(text[: len(text) // 2])
    assert store.get_action(entry.key) is None and not path.exists()


def test_an_entry_filed_under_another_key_is_a_miss_and_is_removed(store):
    entry = store_entry(store, "k", {"a": b"a"})
    other = entry_path(store, key_for("other"))
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(entry_path(store, entry.key).read_bytes())
    assert store.get_action(key_for("other")) is None
    assert not other.exists()
    assert store.get_action(entry.key) == entry


def test_an_entry_naming_a_missing_blob_is_a_miss(store):
    entry = store_entry(store, "k", {"model.onnx": b"model"}, log=b"log")
    store.blob_path(entry.log).unlink()
    assert store.get_action(entry.key) is None
    assert "the step log is missing" in store.last_miss_reason
    store.put_bytes(b"log")
    assert store.get_action(entry.key) == entry


def test_an_entry_whose_blob_has_another_size_is_a_miss_that_blames_the_entry(store):
    digest = store.put_bytes(b"12345")
    store.put_action(make_entry(key_for("k"), {"a": OutputFile(digest=digest, size=4)}))
    report = store.verify()
    assert report.corrupt_entries == (key_for("k"),) and report.corrupt_blobs == () and not report.dangling_entries
    assert store.get_action(key_for("k")) is None
    assert store.last_miss_reason == ("its cache entry was wrong (it records 4 bytes for a, whose intact blob "
                                      "holds 5) and was removed")
    assert "blob" not in store.last_miss_reason.split("(")[0]
    assert store.blob_path(digest).exists() and not entry_path(store, key_for("k")).exists()
    assert store.blob_ok(digest, 5)  # the blob is right; only the entry was wrong


def test_put_action_refuses_an_entry_whose_blobs_are_not_stored(store):
    entry = make_entry(key_for("k"), {"a": OutputFile(digest=digest_bytes(b"absent"), size=6)})
    with pytest.raises(CacheError, match="not stored"):
        store.put_action(entry)
    assert files_under(store.root / "ac") == [] and files_under(store.root / "tmp") == []


def test_output_paths_that_escape_are_rejected_everywhere(store, tmp_path):
    out = OutputFile(digest=store.put_bytes(b"evil"), size=4)
    for name in ("../evil", "/etc/evil", "a/../../evil", "a//b", "a\\b"):
        with pytest.raises(ValidationError, match="escapes"):
            make_entry(key_for("k"), {name: out})
    # an entry file from elsewhere (a remote, an older version) is validated on read
    good = store_entry(store, "k", {"fine": b"evil"})
    path = entry_path(store, good.key)
    path.chmod(0o644)
    path.write_text(path.read_text().replace('"fine"', '"../evil"'))
    assert store.get_action(good.key) is None and not path.exists()
    # and materialize checks again, whatever it is given
    forged = ActionEntry.model_construct(key=good.key, outputs={"../evil": out}, log=None)
    dest = tmp_path / "build" / "step"
    with pytest.raises(CacheError, match="escapes"):
        store.materialize(forged, dest)
    assert not (tmp_path / "build" / "evil").exists() and not dest.exists()
    assert list((tmp_path / "build").iterdir()) == []


def test_an_entry_naming_something_that_is_not_a_digest_is_corrupt(store):
    entry = store_entry(store, "k", {"a": b"a"})
    path = entry_path(store, entry.key)
    path.chmod(0o644)
    path.write_text(path.read_text().replace(entry.outputs["a"].digest, "../../../../etc/passwd"))
    assert store.get_action(entry.key) is None and not path.exists()


# --- materialize -----------------------------------------------------------------------------
def test_materialize_makes_read_only_files_with_identical_bytes(store, tmp_path):
    files = {"model.onnx": b"model", "sub/deep/table.json": b'{"x": 1}', "sub/log.txt": b""}
    entry = store_entry(store, "k", files)
    dest = tmp_path / "build" / "recipe" / "step"
    store.materialize(entry, dest)
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in files_under(dest)} == files
    assert all(read_only(p) for p in files_under(dest))
    assert (dest / "model.onnx").stat().st_ino == store.blob_path(entry.outputs["model.onnx"].digest).stat().st_ino
    assert store.is_materialized(entry, dest)


def test_materialize_replaces_an_existing_tree_with_stale_files(store, tmp_path):
    old = store_entry(store, "old", {"model.onnx": b"old model", "stale/extra.bin": b"stale"})
    new = store_entry(store, "new", {"model.onnx": b"new model"})
    dest = tmp_path / "build" / "step"
    store.materialize(old, dest)
    (dest / "user-notes.txt").write_text("left by a user")
    (dest / "stale").chmod(0o555)
    store.materialize(new, dest)
    assert [p.relative_to(dest).as_posix() for p in files_under(dest)] == ["model.onnx"]
    assert (dest / "model.onnx").read_bytes() == b"new model"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["step"]  # no staging left behind
    assert store.get_action(old.key) == old  # the blobs of the old tree are untouched


def test_materialize_replaces_a_file_at_dest(store, tmp_path):
    entry = store_entry(store, "k", {"a": b"a"})
    dest = tmp_path / "step"
    dest.write_text("not a folder")
    store.materialize(entry, dest)
    assert store.is_materialized(entry, dest)


def test_materialize_copies_across_file_systems(store):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == store.root.stat().st_dev:
        pytest.skip("needs a writable /dev/shm on another file system")
    entry = store_entry(store, "k", {"a/model.onnx": b"model"})
    dest = shm / f"optbuild-test-{os.getpid()}" / "step"
    try:
        store.materialize(entry, dest)
        assert (dest / "a/model.onnx").read_bytes() == b"model" and read_only(dest / "a/model.onnx")
        assert store.is_materialized(entry, dest)
    finally:
        shutil.rmtree(dest.parent)  # folders stay writable: plain removal works


def test_materialize_refuses_a_missing_blob(store, tmp_path):
    entry = store_entry(store, "k", {"a": b"a"})
    store.blob_path(entry.outputs["a"].digest).unlink()
    dest = tmp_path / "step"
    dest.mkdir()
    (dest / "previous").write_text("kept")
    with pytest.raises(CacheError, match="not in the cache"):
        store.materialize(entry, dest)
    assert (dest / "previous").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_is_materialized_true_and_false_cases(store, tmp_path):
    entry = store_entry(store, "k", {"model.onnx": b"model", "sub/b.bin": b"bbbb"})
    dest = tmp_path / "step"
    assert not store.is_materialized(entry, dest)  # missing
    store.materialize(entry, dest)
    assert store.is_materialized(entry, dest)

    (dest / "extra.txt").write_text("x")
    assert not store.is_materialized(entry, dest)  # an extra file
    (dest / "extra.txt").unlink()
    (dest / "empty").mkdir()
    assert not store.is_materialized(entry, dest)  # an extra folder
    (dest / "empty").rmdir()

    (dest / "sub/b.bin").unlink()
    assert not store.is_materialized(entry, dest)  # a missing file
    (dest / "sub/b.bin").write_bytes(b"bbbb")
    assert store.is_materialized(entry, dest)  # an equal copy, not a link, is fine
    (dest / "sub/b.bin").write_bytes(b"bbbc")
    assert not store.is_materialized(entry, dest)  # same size, other bytes
    (dest / "sub/b.bin").unlink()
    (dest / "sub/b.bin").symlink_to(store.blob_path(entry.outputs["sub/b.bin"].digest))
    assert not store.is_materialized(entry, dest)  # a symbolic link is not the file


# --- processes ----------------------------------------------------------------------------------
def test_two_processes_contending_for_a_lock_run_one_at_a_time(store, tmp_path):
    log = tmp_path / "order.log"
    go = SPAWN.Event()
    procs = [SPAWN.Process(target=contend_for_lock, args=(str(store.root), key_for("k"), str(log), go, 3, 0.05))
             for _ in range(2)]
    for proc in procs:
        proc.start()
    go.set()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    events = [line.split() for line in log.read_text().splitlines()]
    assert len(events) == 12
    for start, end in zip(events[::2], events[1::2], strict=True):
        assert start[0] == "start" and end[0] == "end" and start[1] == end[1]  # never interleaved
    assert len({e[1] for e in events}) == 2
    intervals = sorted((float(s[2]), float(e[2])) for s, e in zip(events[::2], events[1::2], strict=True))
    assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(intervals))


def test_gc_waits_while_a_builder_holds_the_shared_lock(store, tmp_path):
    held = tmp_path / "held"
    proc = SPAWN.Process(target=hold_shared_gc_lock, args=(str(store.root), str(held), 0.5))
    proc.start()
    deadline = time.time() + 30
    while not held.exists() and time.time() < deadline:
        time.sleep(0.01)
    with store.shared_gc_lock():  # shared: a second builder is not held up
        pass
    store.gc(0)
    finished = time.monotonic()
    proc.join(30)
    released = float(held.read_text().split()[1])
    assert released <= finished


def lock_in_child(root: Path, umask: int, uid: int | None = None, gid: int | None = None) -> str:
    """``lock_as`` in a fresh process: what it says."""
    parent, child = SPAWN.Pipe(duplex=False)
    proc = SPAWN.Process(target=lock_as, args=(str(root), child, umask, uid, gid))
    proc.start()
    child.close()
    try:
        assert parent.poll(60), "the child said nothing"
        return parent.recv()
    finally:
        proc.join(30)


def test_lock_files_follow_the_umask_so_that_a_group_can_share_the_cache(tmp_path):
    assert lock_in_child(tmp_path / "shared", 0o002) == "locked"
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "shared/locks").iterdir()} == {
        "k.lock": 0o664, "@gc.lock": 0o664}
    assert lock_in_child(tmp_path / "private", 0o077) == "locked"
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "private/locks").iterdir()} == {0o600}


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second user needs root")
def test_a_teammate_locks_a_group_shared_cache_and_a_lock_file_it_may_not_open_is_a_clear_error():
    nobody = pwd.getpwnam("nobody").pw_uid
    with tempfile.TemporaryDirectory() as tmp:  # tmp_path's parents are private to this user
        os.chmod(tmp, 0o755)
        root = Path(tmp) / "cache"
        assert lock_in_child(root, 0o002) == "locked"  # made by the first member of group 0
        assert lock_in_child(root, 0o002, uid=nobody, gid=0) == "locked"  # a teammate of that group

        lock = root / "locks" / "k.lock"
        os.chmod(lock, 0o644)  # as optbuild made every lock file before
        said = lock_in_child(root, 0o002, uid=nobody, gid=0)
        assert said.startswith(f"LockError: cannot lock {lock}: permission denied (mode 644, owner uid 0, "
                               "group gid 0): a cache shared by a group needs group-writable lock files")
        assert f"chmod g+w {lock.parent}/*" in said


def test_gc_waits_for_a_builder_in_this_process_too(store):
    with store.shared_gc_lock():
        worker = threading.Thread(target=store.gc, args=(0,))
        worker.start()
        worker.join(0.3)
        assert worker.is_alive()
    worker.join(10)
    assert not worker.is_alive()


def test_a_builder_killed_mid_write_leaves_only_complete_items(store, tmp_path):
    started = tmp_path / "started"
    proc = SPAWN.Process(target=store_forever, args=(str(store.root), str(started)))
    proc.start()
    deadline = time.time() + 30
    while not started.exists() and time.time() < deadline:
        time.sleep(0.005)
    assert started.exists()
    time.sleep(random.uniform(0.0, 0.2))
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL

    blobs = files_under(store.root / "cas")
    assert blobs and all(digest_bytes(p.read_bytes()) == p.parent.name + p.name and read_only(p) for p in blobs)
    entries = list(store.iter_entries())
    assert len(entries) >= 2
    for key, entry in entries:
        assert entry is not None and store.get_action(key) == entry
    assert store.verify().ok

    leftovers = list((store.root / "tmp").iterdir())
    assert leftovers  # at least the killed builder's scratch folder
    assert store.clean_stale_tmp() == len(leftovers)
    assert list((store.root / "tmp").iterdir()) == []


def test_clean_stale_tmp_keeps_the_scratch_of_live_builders(store):
    mine = store.new_tmp_dir("step:name/with odd chars")
    (mine / "out").mkdir()
    run_child(leave_tmp_dir, str(store.root))
    (store.root / "tmp" / "not-ours").mkdir()
    assert len(list((store.root / "tmp").iterdir())) == 3
    assert store.clean_stale_tmp() == 1
    assert sorted((store.root / "tmp").iterdir()) == sorted([mine, store.root / "tmp" / "not-ours"])
    assert mine.name.startswith(f"{os.getpid()}@")


# --- gc and verify -------------------------------------------------------------------------------
def _aged_entries(store: LocalStore) -> dict[str, ActionEntry]:
    """Three entries of 1000 own bytes each plus 100 shared bytes, used in order a, b, c."""
    shared = b"s" * 100
    made = {}
    for age, name in enumerate("abc"):
        made[name] = store_entry(store, name, {"own.bin": name.encode() * 1000, "shared.bin": shared})
        os.utime(entry_path(store, made[name].key), (HOUR_AGO + age, HOUR_AGO + age))
    return made


def test_gc_evicts_least_recently_used_entries_to_the_bound(store):
    made = _aged_entries(store)
    orphan = store.put_bytes(b"o" * 50)
    assert store.size_bytes() == 3150
    report = store.gc(2100)
    assert report.ok and (report.entries_evicted, report.blobs_deleted) == (1, 2)
    assert (report.bytes_freed, report.bytes_now) == (1050, 2100) and store.size_bytes() == 2100
    assert store.get_action(made["a"].key) is None
    assert store.get_action(made["b"].key) == made["b"] and store.get_action(made["c"].key) == made["c"]
    assert not store.blob_path(orphan).exists()
    assert report.within_limit == Kept(entries=2, bytes=2100)  # b and c: the cache fit once a went


def test_trim_blobs_deletes_the_least_recently_used_blobs_to_the_bound_and_keeps_recent_ones(store):
    """A build node's cache holds blobs only: used ones are marked, the oldest go first."""
    a, b, c = (store.put_bytes(name * 1000) for name in (b"a", b"b", b"c"))
    for age, digest in enumerate((a, b, c)):
        os.utime(store.blob_path(digest), (HOUR_AGO + age, HOUR_AGO + age))
    hashed = store.hasher.files_hashed
    store.mark_used(a)  # a task linked it just now: the most recently used
    assert store.blob_ok(a) and store.hasher.files_hashed == hashed  # the touch cost no re-read
    assert store.trim_blobs(2000) == 1
    assert not store.blob_path(b).exists() and store.blob_ok(a) and store.blob_ok(c)
    assert store.trim_blobs(0) == 1  # c, an hour old, goes; a was used within the grace time
    assert store.blob_ok(a) and not store.blob_path(c).exists() and store.size_bytes() == 1000


def test_trim_blobs_takes_a_stray_file_in_the_blob_folders_as_an_unused_blob(store):
    blob = store.put_bytes(b"b" * 1000)
    stray = store.blob_path(blob).parent / "not-a-blob"
    stray.write_bytes(b"x" * 10)
    for path in (store.blob_path(blob), stray):  # the same age: ordered by name, not by digest
        os.utime(path, (HOUR_AGO, HOUR_AGO))
    assert store.trim_blobs(0) == 2
    assert not stray.exists() and store.size_bytes() == 0


def test_gc_keeps_what_it_is_told_to_and_a_hit_counts_as_use(store):
    made = _aged_entries(store)
    assert store.get_action(made["a"].key) is not None  # a is now the most recently used
    report = store.gc(2100, keep={made["b"].key})
    assert report.ok and report.entries_evicted == 1  # c goes: b is kept, a was just used
    assert sorted(k for k, _ in store.iter_entries()) == sorted([made["a"].key, made["b"].key])

    report = store.gc(0, keep={made["b"].key}, min_age_s=0)
    assert not report.ok and report.bytes_now == 1100 and report.locked == Kept(entries=1, bytes=1100)
    assert store.get_action(made["b"].key) == made["b"]


def test_gc_reports_what_each_protection_kept(store):
    """A gc that frees less than asked says why, per reason, so that people know which
    protection (the lock file, the grace period) to lift; a blob shared by entries kept for
    different reasons counts under each."""
    made = _aged_entries(store)
    os.utime(entry_path(store, made["c"].key))  # c was used just now
    report = store.gc(0, keep={made["a"].key})  # LRU order: a (locked), b (evicted), c (recent)
    assert not report.ok and report.entries_evicted == 1 and report.bytes_now == 2100
    assert report.locked == Kept(entries=1, bytes=1100)
    assert report.recent == Kept(entries=1, bytes=1100)
    assert report.within_limit == Kept()


def test_gc_under_its_bound_keeps_everything_because_it_fits(store):
    made = _aged_entries(store)
    report = store.gc(10**9, keep={made["a"].key}, min_age_s=10**9)
    assert report.ok and (report.entries_evicted, report.bytes_freed) == (0, 0)
    assert report.within_limit == Kept(entries=3, bytes=3100)  # not "locked" nor "recent": nothing had to go
    assert report.locked == report.recent == Kept()


def test_gc_removes_corrupt_entries_and_stale_scratch(store):
    entry = store_entry(store, "k", {"a": b"a"})
    path = entry_path(store, entry.key)
    path.chmod(0o644)
    path.write_text("garbage")
    run_child(leave_tmp_dir, str(store.root))
    report = store.gc(10**9)
    assert (report.entries_evicted, report.blobs_deleted, report.bytes_now) == (1, 1, 0)
    assert files_under(store.root / "ac") == [] and list((store.root / "tmp").iterdir()) == []


def test_verify_finds_corruption_and_repair_removes_it(store):
    bad = store_entry(store, "bad", {"model.onnx": b"model bytes"})
    good = store_entry(store, "good", {"model.onnx": b"other bytes"}, log=b"log")
    garbage = entry_path(store, key_for("garbage"))
    garbage.parent.mkdir(parents=True, exist_ok=True)
    garbage.write_text("{")
    store.put_bytes(b"orphan")
    corrupt = bad.outputs["model.onnx"].digest
    flip_first_byte(store.blob_path(corrupt))

    report = store.verify()
    assert not report.ok and (report.entries, report.blobs) == (3, 4)
    assert report.corrupt_blobs == (corrupt,)
    assert report.dangling_entries == (bad.key,) and report.corrupt_entries == (key_for("garbage"),)
    assert report.orphan_blobs == 1 and "PROBLEMS FOUND" in str(report)
    assert store.blob_path(corrupt).exists() and garbage.exists()  # only reported

    repaired = store.verify(repair=True)
    assert not repaired.ok and "repaired" in str(repaired)
    assert not store.blob_path(corrupt).exists() and not garbage.exists()
    assert [k for k, _ in store.iter_entries()] == [good.key]
    again = store.verify()
    assert again.ok and "all intact" in str(again)
    assert store.get_action(good.key) == good


def test_verify_reports_stray_files_in_cas(store):
    stray = store.root / "cas" / "zz" / "not-a-blob"
    stray.parent.mkdir()
    stray.write_text("?")
    report = store.verify(repair=True)
    assert report.corrupt_blobs == ("cas/zz/not-a-blob",) and not stray.exists()
