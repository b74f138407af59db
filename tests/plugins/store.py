"""Local-store fixtures (a pytest plugin) and child-process bodies for tests/store/.

The child functions live here (not in the test module) so that spawned processes import
only this small module.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from optbuild.common.digest import FileHasher, digest_bytes
from optbuild.store.entry import ActionEntry, OutputFile
from optbuild.store.local import LocalStore


@pytest.fixture
def hasher(tmp_path: Path):
    """A hasher with a real stat cache on disk, as builds use."""
    hasher = FileHasher(tmp_path / "hashes.db")
    yield hasher
    hasher.close()


@pytest.fixture
def store(tmp_path: Path, hasher: FileHasher) -> LocalStore:
    return LocalStore(tmp_path / "cache", hasher)


def key_for(name: str) -> str:
    return digest_bytes(name.encode())


def make_entry(key: str, outputs: dict[str, OutputFile], log: str | None = None) -> ActionEntry:
    return ActionEntry(key=key, step="recipe:step", kind="test", outputs=outputs, ingredients={"name": key},
                       log=log)


def store_entry(store: LocalStore, name: str, files: dict[str, bytes], *, log: bytes | None = None) -> ActionEntry:
    """Put ``files`` as blobs and an entry keyed by ``name`` that names them."""
    outputs = {path: OutputFile(digest=store.put_bytes(data), size=len(data)) for path, data in files.items()}
    entry = make_entry(key_for(name), outputs, store.put_bytes(log) if log is not None else None)
    store.put_action(entry)
    return entry


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


# --- bodies of child processes (spawned) -------------------------------------------------
def contend_for_lock(root: str, key: str, log: str, go, rounds: int, hold_s: float) -> None:
    """Take ``lock(key)`` ``rounds`` times, logging when the critical section starts and ends."""
    store = LocalStore(Path(root), FileHasher(None))
    go.wait(30)
    for _ in range(rounds):
        with store.lock(key):
            _append(Path(log), f"start {os.getpid()} {time.monotonic()}")
            time.sleep(hold_s)
            _append(Path(log), f"end {os.getpid()} {time.monotonic()}")


def hold_shared_gc_lock(root: str, held: str, hold_s: float) -> None:
    store = LocalStore(Path(root), FileHasher(None))
    with store.shared_gc_lock():
        Path(held).touch()
        time.sleep(hold_s)
        _append(Path(held), f"released {time.monotonic()}")


def lock_as(root: str, conn, umask: int, uid: int | None = None, gid: int | None = None) -> None:
    """Take a key's lock and the shared gc lock of the cache ``root`` as a user with ``umask``
    (and, given ``uid`` and ``gid``, as another user: a teammate); sends "locked", or the
    error's type and message."""
    os.umask(umask)
    if uid is not None and gid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    try:
        store = LocalStore(Path(root), FileHasher(None))
        with store.lock("k"), store.shared_gc_lock():
            conn.send("locked")
    except Exception as exc:  # what a user would see, sent back as text
        conn.send(f"{type(exc).__name__}: {exc}")


def leave_tmp_dir(root: str) -> None:
    """A builder that dies without cleaning its scratch folder."""
    LocalStore(Path(root), FileHasher(None)).new_tmp_dir("abandoned")


def store_forever(root: str, started: str) -> None:
    """Store blobs and entries in a loop (as a builder does) until killed."""
    store = LocalStore(Path(root), FileHasher(None))
    scratch = store.new_tmp_dir("build")
    for i in range(10**6):
        source = scratch / f"out{i}.bin"
        source.write_bytes(os.urandom(3 << 20) + i.to_bytes(8, "little"))
        output = store.put_file(source, move=i % 2 == 0)
        entry = make_entry(key_for(f"killed-{i}"), {"model.bin": output}, store.put_bytes(f"log {i}".encode()))
        store.put_action(entry)
        if i == 1:
            Path(started).touch()
