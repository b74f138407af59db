"""Issue #8: what the cache holds stays intact whatever users, steps, gc, dry runs or a
read-only mount do, and every such case ends in a rebuild or a clear message, never in
wrong bytes or a traceback."""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from plugins.projects import ProjectDir
from plugins.store import key_for, make_entry, store_entry

from optbuild.common.digest import FileHasher
from optbuild.common.errors import CacheError
from optbuild.store.entry import OutputFile
from optbuild.store.files import HOST
from optbuild.store.local import LocalStore
from optbuild.store.materialize import BlobGone

HOUR_AGO = time.time() - 3600


def cache_of(project: ProjectDir) -> LocalStore:
    return LocalStore(project.root / "cache", FileHasher(None))


def entry_file(store: LocalStore, key: str) -> Path:
    return store.root / "ac" / key[:2] / f"{key[2:]}.json"


def key_of(project: ProjectDir, step: str) -> str:
    return next(k for k, e in cache_of(project).iter_entries() if e is not None and e.step == step)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and mtime: equal snapshots, nothing written."""
    return {p.relative_to(folder).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in folder.rglob("*")}


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- (4) the local store checks names as strictly as a remote's entries ---------------------------
LONG_NAME = "x" * 300
DEEP_NAME = "/".join(["d"] * 3000)


def plant_entry(store: LocalStore, key: str, doc: dict) -> None:
    path = entry_file(store, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_verify_reports_and_repairs_entries_naming_paths_no_file_system_can_hold(store):
    digest = store.put_bytes(b"model")
    for name in (LONG_NAME, DEEP_NAME):
        doc = make_entry(key_for(name[:5]), {"ok.bin": OutputFile(digest=digest, size=5)}).model_dump()
        doc["outputs"] = {name: {"digest": digest, "size": 5}}
        plant_entry(store, key_for(name[:5]), doc)
    report = store.verify()
    assert sorted(report.corrupt_entries) == sorted([key_for(LONG_NAME[:5]), key_for(DEEP_NAME[:5])])
    assert store.get_action(key_for(LONG_NAME[:5])) is None  # a miss, not "File name too long"
    assert "corrupt" in store.last_miss_reason
    store.verify(repair=True)
    assert list(store.iter_entries()) == []


def test_a_build_meeting_an_entry_with_an_overlong_name_rebuilds_the_step(project):
    project.build()
    store = cache_of(project)
    key = key_of(project, "chain:out")
    doc = json.loads(entry_file(store, key).read_text())
    doc["outputs"][LONG_NAME] = doc["outputs"]["data.txt"]
    entry_file(store, key).chmod(0o644)
    plant_entry(store, key, doc)
    result = project.build()
    assert result.ok and result.steps("built") == ["chain:out"]
    assert any("corrupt" in r for r in result.outcomes["chain:out"].reasons)
    assert sorted(p.name for p in (project.root / "build/chain/out").iterdir()) == ["data.txt"]


# --- (6) restored outputs share bytes with blobs: edits are caught, never served -----------------
def test_a_blob_edited_through_a_restored_hard_link_is_neither_trusted_nor_linked_again(store, tmp_path):
    entry = store_entry(store, "k", {"model.onnx": b"weights" * 100})
    blob = store.blob_path(entry.outputs["model.onnx"].digest)
    os.utime(blob, (HOUR_AGO, HOUR_AGO))
    first = tmp_path / "first"
    store.materialize(entry, first)
    assert store.is_materialized(entry, first)  # the blob's signature is now on record
    restored = first / "model.onnx"
    restored.chmod(0o644)  # what a user editing the restored model does
    mtime = restored.stat().st_mtime_ns
    with open(restored, "r+b") as f:
        f.write(b"W")
    os.utime(restored, ns=(mtime, mtime))  # same size, same mtime: only ctime tells
    assert not store.is_materialized(entry, first)
    with pytest.raises(BlobGone, match="corrupt"):
        store.materialize(entry, tmp_path / "second")
    assert not blob.exists() and not (tmp_path / "second").exists()
    assert store.get_action(entry.key) is None


def test_a_user_edit_of_a_restored_output_is_never_served_by_the_next_build(project):
    project.build()
    restored = project.root / "build/chain/out/data.txt"
    restored.chmod(0o644)
    restored.write_text("HELLO-MID-OUT")
    result = project.build()
    assert result.ok and result.steps("built") == ["chain:out"]
    assert project.read("build/chain/out/data.txt") == "hello-mid-out"
    assert project.cli("cache", "verify").returncode == 0


def test_a_step_that_writes_into_its_input_fails_and_caches_nothing(project):
    project.write("optbuild.toml", project.read("optbuild.toml").replace(
        'crash = "kinds.py:Crash"', 'crash = "kinds.py:Crash"\nappend = "kinds.py:Append"'))
    recipe = project.read("recipes/chain.toml")
    project.write("recipes/chain.toml", recipe + '\n[steps.app]\nkind = "append"\ninput = "src"\n')
    result = project.build(keep_going=True)
    app = result.outcomes["chain:app"]
    assert app.status == "failed"
    assert f"its input {project.root / 'build/chain/src/data.txt'} (an output of chain:src) changed while chain:app" in app.error
    assert "not cached" in app.error
    assert [e.step for _, e in cache_of(project).iter_entries() if e.step == "chain:app"] == []
    src = cache_of(project).get_action(key_of(project, "chain:src"))
    assert src is None  # its damaged blob was dropped: served to nobody
    project.write("recipes/chain.toml", recipe)
    again = project.build()
    assert again.ok and "chain:src" in again.steps("built")
    assert project.read("build/chain/src/data.txt") == "hello"


# --- (9) a read-only cache serves hits -----------------------------------------------------------
def _unshare() -> list[str]:
    return ["unshare", "--mount", "--propagation", "private"] + (["--map-root-user"] if os.geteuid() else [])


def _in_read_only_mounts(folders: list[Path], command: str) -> list[str]:
    """argv running ``command`` (shell) where ``folders`` are mounted read-only, for it alone."""
    mounts = "".join(f"mount --bind {d} {d} && mount -o remount,bind,ro {d} {d} || exit 97; "
                     for d in map(shlex.quote, map(str, folders)))
    return [*_unshare(), "sh", "-c", mounts + command]


@functools.cache
def _read_only_mounts() -> bool:
    """Whether this machine lets a test mount a folder read-only in a private namespace
    (root's permission bits prove nothing: it writes through them)."""
    probe = Path(f"/tmp/optbuild-ro-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        argv = _in_read_only_mounts([probe], f"! touch {probe}/x 2>/dev/null")
        return subprocess.run(argv, check=False, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        (probe / "x").unlink(missing_ok=True)
        probe.rmdir()


def cli_read_only(project: ProjectDir, read_only: list[str], *args: str) -> subprocess.CompletedProcess:
    """Run the CLI with the project's folders ``read_only`` mounted read-only (for it alone)."""
    if not _read_only_mounts():
        pytest.skip("needs `unshare --mount` and a read-only bind mount, unavailable here")
    command = shlex.join([sys.executable, "-m", "optbuild.cli", *args])
    cd = f"cd {shlex.quote(str(project.root))}"
    argv = _in_read_only_mounts([project.root / d for d in read_only], f"{cd} && exec {command}")
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode != 97, proc.stderr
    return proc


def test_a_read_only_cache_serves_hits_writes_nothing_and_warns_once(project):
    assert project.cli("build").returncode == 0
    (project.root / "optbuild.lock").unlink()  # the build must write this, outside the cache
    shutil.rmtree(project.root / "build")  # and restore every output from the read-only cache
    before = snapshot(project.root / "cache")
    run = cli_read_only(project, ["cache"], "build", "--json")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.count("read-only") == 1 and "nothing new is stored" in run.stderr
    statuses = {e["step"]: e["status"] for e in map(json.loads, run.stdout.splitlines())
                if e.get("event") == "step"}
    assert set(statuses.values()) == {"cached"}
    assert project.read("build/chain/out/data.txt") == "hello-mid-out"
    assert snapshot(project.root / "cache") == before


def test_a_step_that_must_build_says_the_read_only_cache_cannot_store_it(project):
    assert project.cli("build").returncode == 0
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('"-out"', '"-o2"'))
    before = snapshot(project.root / "cache")
    run = cli_read_only(project, ["cache"], "build", "--json")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    failed = [e for e in map(json.loads, run.stdout.splitlines()) if e.get("status") == "failed"]
    assert [e["step"] for e in failed] == ["chain:out"]
    assert f"the cache {project.root / 'cache'} is read-only" in failed[0]["error"]
    assert snapshot(project.root / "cache") == before


def test_an_unwritable_build_dir_or_project_is_a_clear_error_naming_the_path(project):
    assert project.cli("build").returncode == 0
    shutil.rmtree(project.root / "build/chain/out")
    run = cli_read_only(project, ["build"], "build")
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    # the record of what it will write there (store.written), written first
    assert f"{project.root / 'build/.optbuild/written/chain/out.json'}" in run.stdout + run.stderr
    assert "Read-only file system" in run.stdout + run.stderr

    assert project.cli("build").returncode == 0
    assert cli_read_only(project, ["."], "build").returncode == 0  # all cached and restored: no write
    (project.root / "optbuild.lock").unlink()  # now the build must write it, and cannot
    run = cli_read_only(project, ["."], "build")
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert "error:" in run.stderr and "Read-only file system" in run.stderr
    assert f"{project.root / 'build'}" in run.stderr  # the lock file's lock: the first thing written


# --- (11) leftovers of restores killed mid-swap ----------------------------------------------------
def test_leftovers_of_killed_restores_are_swept_even_when_nothing_needs_restoring(project):
    project.build()
    folder = project.root / "build/chain"
    pid = dead_pid()
    dead = [folder / f".out.{pid}@{HOST}@old-0123456789ab", folder / f".side.{pid}@{HOST}@new-ba9876543210"]
    live = folder / f".mid.{os.getpid()}@{HOST}@new-0123456789ab"
    for tree in [*dead, live]:
        (tree / "sub").mkdir(parents=True)
        (tree / "sub/data.txt").write_text("half")
        (tree / "sub/data.txt").chmod(0o444)
    result = project.build()
    assert result.ok and set(result.steps("cached")) == {"chain:src", "chain:mid", "chain:out", "chain:side"}
    assert not any(tree.exists() for tree in dead)
    assert live.exists()  # its owner (this process) may still be swapping it in


# --- (13) gc between a hit and its restore, and gc right after a build ----------------------------
def test_gc_waits_until_a_cache_hit_is_restored(project):
    project.build()
    shutil.rmtree(project.root / "build")  # the hit must link its blobs again
    store = cache_of(project)
    key = key_of(project, "chain:src")
    for k, _ in store.iter_entries():
        os.utime(entry_file(store, k), (HOUR_AGO, HOUR_AGO))
    dest = project.root / "build/chain/src"
    results: dict[str, object] = {}
    with store.lock_dest(dest):  # the build finds its hit, then waits here to restore it
        build = threading.Thread(target=lambda: results.setdefault("build", project.build(["chain:src"])))
        build.start()
        deadline = time.time() + 30
        while entry_file(store, key).stat().st_mtime < HOUR_AGO + 60 and time.time() < deadline:
            time.sleep(0.01)  # a hit refreshes the entry's mtime
        assert time.time() < deadline, "the build never looked the step up"
        gc = threading.Thread(target=lambda: results.setdefault("gc", cache_of(project).gc(0, min_age_s=0)))
        gc.start()
        gc.join(1.0)
        assert gc.is_alive(), "gc ran between the lookup and the restore"
    build.join(30)
    gc.join(30)
    result = results["build"]
    assert result.ok and result.steps("cached") == ["chain:src"]
    assert project.read("build/chain/src/data.txt") == "hello"
    assert results["gc"].entries_evicted == 4  # then gc went ahead


def test_gc_keeps_what_was_used_within_its_grace_period(project):
    project.build()
    report = cache_of(project).gc(0)  # as if it ran during the build: everything is fresh
    assert report.entries_evicted == 0
    assert set(project.build().steps("cached")) == {"chain:src", "chain:mid", "chain:out", "chain:side"}
    assert cache_of(project).gc(0, min_age_s=0).entries_evicted == 4


# --- (16d) a dry run deletes nothing ---------------------------------------------------------------
def test_plan_reports_corrupt_items_as_misses_and_leaves_them_for_a_real_build(project):
    project.build()
    store = cache_of(project)
    out = store.get_action(key_of(project, "chain:out"))
    blob = store.blob_path(out.outputs["data.txt"].digest)
    blob.chmod(0o644)
    blob.write_text("HELLO-MID-OUT")
    side = entry_file(store, key_of(project, "chain:side"))
    side.chmod(0o644)
    side.write_text("{ not json")
    before = snapshot(project.root / "cache")
    run = project.cli("plan", "--json")
    assert run.returncode == 0, run.stderr
    steps = {e["step"]: e for e in run.events if e.get("event") == "step"}
    assert steps["chain:out"]["status"] == "would-build" and "corrupt" in " ".join(steps["chain:out"]["reasons"])
    assert steps["chain:side"]["status"] == "would-build" and "corrupt" in " ".join(steps["chain:side"]["reasons"])
    assert "removed" not in run.stdout
    after = snapshot(project.root / "cache")
    assert {k: v for k, v in after.items() if not k.startswith(("statcache", "locks"))} == \
        {k: v for k, v in before.items() if not k.startswith(("statcache", "locks"))}
    assert blob.exists() and side.exists()
    result = project.build()
    assert sorted(result.steps("built")) == ["chain:out", "chain:side"]
    assert project.cli("cache", "verify").returncode == 0


def test_a_read_only_view_serves_hits_and_neither_writes_nor_deletes(store):
    good = store_entry(store, "good", {"a": b"a"})
    bad = store_entry(store, "bad", {"b": b"bb"})
    flip = store.blob_path(bad.outputs["b"].digest)
    flip.chmod(0o644)
    flip.write_bytes(b"bc")
    view = store.read_only_view()
    assert view.get_action(good.key) == good
    assert view.get_action(bad.key) is None and view.last_miss_reason.endswith("is corrupt")
    assert flip.exists() and store.last_miss_reason is None
    with pytest.raises(CacheError, match="dry run"):
        view.put_bytes(b"new")
    assert store.get_action(bad.key) is None and not flip.exists()  # the store itself repairs


def test_a_just_published_blob_is_checked_by_a_stat_not_a_read(store, hasher):
    entry = store_entry(store, "k", {"model.onnx": b"weights" * 1000})
    read = hasher.bytes_read
    assert store.get_action(entry.key) == entry
    assert hasher.bytes_read == read
