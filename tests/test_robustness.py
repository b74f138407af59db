"""Concurrency, crashes, corruption: the cache never serves a wrong or partial result."""

from __future__ import annotations

import os
import signal
import time

from optbuild.common.digest import FileHasher
from optbuild.store.local import LocalStore

SLOW = '\n[steps.slow]\nkind = "join"\ninput = "src"\nsuffix = "-slow"\nsleep = 1.5\n'


def entries(project) -> list:
    store = LocalStore(project.root / "cache", FileHasher(None))
    return list(store.iter_entries())


def test_two_concurrent_builds_both_succeed_and_run_each_step_once(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml") + SLOW)
    first = project.popen("build", "--json")
    second = project.popen("build", "--json")
    outputs = [p.communicate(timeout=120) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outputs
    import json

    built = [json.loads(line)["step"] for out, _ in outputs for line in out.splitlines()
             if '"status": "built"' in line]
    assert sorted(built) == sorted(set(built)) and len(built) == 5
    assert project.cli("cache", "verify").returncode == 0


def test_a_build_killed_mid_step_leaves_no_entry_and_the_next_build_completes(project, tmp_path):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml") + SLOW.replace("1.5", "30"))
    marker = tmp_path / "started"
    proc = project.popen("build", "chain:slow", env={"OPTBUILD_TEST_STARTED": str(marker)})
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    before = {key for key, _ in entries(project)}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(before) == 1  # only chain:src finished
    assert project.cli("cache", "verify").returncode == 0
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace("sleep = 30", "sleep = 0"))
    result = project.build()
    assert result.ok and "chain:slow" in result.steps("built")
    assert not any((project.root / "cache" / "tmp").iterdir())


def test_a_crashing_step_fails_cleanly_and_other_branches_build_with_keep_going(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml") + '\n[steps.boom]\nkind = "crash"\ninput = "src"\n')
    result = project.build(keep_going=True)
    assert not result.ok
    failed = result.outcomes["chain:boom"]
    assert failed.status == "failed" and "step process died (signal 6)" in failed.error
    assert "about to crash" in failed.error
    assert sorted(result.steps("built")) == ["chain:mid", "chain:out", "chain:side", "chain:src"]
    assert (project.root / "build/.logs/chain/boom.log").exists()


def test_a_failed_step_skips_its_dependents(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('suffix = "-mid"', 'suffix = "-mid"\nfail = true'))
    result = project.build(keep_going=True)
    assert result.outcomes["chain:mid"].status == "failed"
    assert "asked to fail" in result.outcomes["chain:mid"].error
    assert result.outcomes["chain:out"].status == "skipped"
    assert result.outcomes["chain:side"].status == "built"


def test_a_flipped_byte_in_a_cached_blob_is_a_miss_and_is_rebuilt(project):
    project.build()
    store = LocalStore(project.root / "cache", FileHasher(None))
    entry = next(e for _, e in store.iter_entries() if e.step == "chain:out")
    blob = store.blob_path(entry.outputs["data.txt"].digest)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[0] ^= 0x01
    blob.write_bytes(bytes(data))
    # the materialized copy is a hard link to the blob: it was corrupted too
    result = project.build()
    assert result.ok
    assert result.steps("built") == ["chain:out"]
    assert project.read("build/chain/out/data.txt") == "hello-mid-out"
    assert project.cli("cache", "verify").returncode == 0


def test_a_corrupt_action_entry_is_a_miss(project):
    project.build()
    store = LocalStore(project.root / "cache", FileHasher(None))
    key = next(k for k, e in store.iter_entries() if e.step == "chain:side")
    path = next((project.root / "cache" / "ac").rglob(key[2:] + "*"))
    path.chmod(0o644)
    path.write_text("{ not json")
    result = project.build()
    assert result.steps("built") == ["chain:side"]


def test_ctrl_c_stops_the_build_keeps_finished_steps_and_leaves_no_partial_state(project, tmp_path):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml") + SLOW.replace("1.5", "30"))
    marker = tmp_path / "started"
    proc = project.popen("build", "chain:slow", env={"OPTBUILD_TEST_STARTED": str(marker)})
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted: the steps that had finished are kept" in stderr and "Traceback" not in stderr
    assert "no partial results" not in stderr
    assert [e.step for _, e in entries(project)] == ["chain:src"]  # finished: kept
    assert project.read("build/chain/src/data.txt") == "hello"
    assert not any((project.root / "cache" / "tmp").iterdir())
    assert not (project.root / "build/chain/slow").exists()
