"""`optbuild cache gc` and `cache stats` as people read them: a gc that frees less than asked
says what it kept and which flag lifts each protection; sizes read "7.8 KiB"; steps this
host cannot run are counted apart, never as cache misses."""

from __future__ import annotations

import io
import json
import multiprocessing
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest
from plugins.projects import CONFIG, PIPELINE, CliRun, ProjectDir
from plugins.store import hold_shared_gc_lock

from optbuild.builder.runstats import describe_stats
from optbuild.cli import main
from optbuild.store.remote import RemoteStats

# 2000 bytes in: src, mid, out and side hold 2000 + 2004 + 2008 + 2005 bytes = 7.8 KiB
BIG_INPUT = "x" * 2000
ALL_KEPT = "kept all 4 entries (7.8 KiB)"

NEEDS_GPU = """\
from optbuild.steps.base import Step, StepParams, StepRef


class NeedsGpuParams(StepParams):
    input: StepRef


class NeedsGpu(Step):
    \"\"\"A step no host here can run, as a TensorRT step on a host without a GPU.\"\"\"

    Params = NeedsGpuParams

    def unavailable(self, host):
        return "an imaginary GPU"
"""


def cli(project: ProjectDir, *args: str) -> CliRun:
    """The CLI in this process (no interpreter start-up), its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["-C", str(project.root), *args])
    return CliRun(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> ProjectDir:
    """The `chain` project built once from a 2000-byte input: four entries, all in
    optbuild.lock. Shared: a test that changes it puts it back."""
    project = ProjectDir.with_test_kinds(tmp_path_factory.mktemp("gc") / "proj")
    project.write("optbuild.toml", CONFIG)
    project.write("recipes/chain.toml", PIPELINE)
    project.write("data/input.txt", BIG_INPUT)
    assert project.build().ok
    return project


# --- gc --------------------------------------------------------------------------------------
def test_gc_that_evicts_nothing_because_the_lock_file_references_everything_says_so(built):
    run = cli(built, "cache", "gc", "--max-size", "1 KiB", "--grace-minutes", "0")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == ("evicted 0 entries, deleted 0 blobs, freed 0 B; "
                        "the cache now holds 7.8 KiB, over its limit of 1.0 KiB")
    assert lines[1] == f"{ALL_KEPT}: optbuild.lock references them (--include-locked lets gc evict them)"
    assert lines[2] == "the kept entries alone exceed the limit"


def test_gc_that_evicts_nothing_because_everything_is_recent_names_the_grace_period(built):
    run = cli(built, "cache", "gc", "--max-size", "0", "--include-locked")
    assert run.stdout.splitlines()[1] == (
        f"{ALL_KEPT}: used in the last 10 minutes, a running build may restore them "
        "(--grace-minutes 0 lets gc evict them)")

    run = cli(built, "cache", "gc", "--max-size", "0", "--include-locked", "--grace-minutes", "90")
    assert "used in the last 1.5 hours" in run.stdout


def test_gc_with_a_damaged_lock_file_says_why_it_kept_recent_entries(built):
    lock = built.root / "optbuild.lock"
    intact = lock.read_text()
    lock.write_text("{")
    try:
        run = cli(built, "cache", "gc", "--max-size", "0", "--grace-minutes", "0")
    finally:
        lock.write_text(intact)
    assert run.stdout.splitlines()[1] == (
        f"{ALL_KEPT}: used in the last 7 days (optbuild.lock is damaged: what it references is unknown)")


def test_gc_under_its_limit_says_the_cache_fits(built):
    run = cli(built, "cache", "gc")  # [cache] max_size defaults to 20 GiB
    assert run.stdout.splitlines() == [
        "evicted 0 entries, deleted 0 blobs, freed 0 B; the cache now holds 7.8 KiB, within its limit of 20.0 GiB",
        f"{ALL_KEPT}: the cache fits its limit with them",
    ]


def test_gc_that_evicts_says_what_it_freed_and_why_it_kept_the_rest(project):
    project.write("data/input.txt", BIG_INPUT)
    assert project.build().ok
    project.write("data/input.txt", BIG_INPUT + "!")  # every step rebuilds: the old four leave the lock
    assert project.build().ok
    run = cli(project, "cache", "gc", "--max-size", "8 KiB", "--grace-minutes", "0")
    lines = run.stdout.splitlines()
    assert lines[0].startswith("evicted 4 entries, deleted 4 blobs, freed 7.8 KiB; the cache now holds 7.8 KiB")
    assert lines[1:] == ["kept all 4 entries (7.8 KiB): the cache fits its limit with them"]
    assert "bytes" not in run.stdout


def test_gc_says_when_it_waits_for_running_builds_and_for_which(built, tmp_path):
    """gc takes the cache's gc lock exclusively; a build storing or restoring holds it shared.
    Waiting silently, gc would look hung."""
    assert "waiting" not in cli(built, "cache", "gc").stderr  # nobody holds it: no word of waiting
    held = tmp_path / "held"
    builder = multiprocessing.get_context("spawn").Process(
        target=hold_shared_gc_lock, args=(str(built.root / "cache"), str(held), 1.0))
    builder.start()
    try:
        deadline = time.monotonic() + 30
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        run = cli(built, "cache", "gc")
        finished = time.monotonic()
    finally:
        builder.join(30)
    assert run.returncode == 0 and run.stdout.startswith("evicted 0 entries")
    assert run.stderr == (f"cache gc: waiting for the running builds that hold the cache {built.root / 'cache'} "
                          f"(pid {builder.pid}) to finish storing or restoring\n")
    assert float(held.read_text().split()[1]) <= finished  # it waited for the release


def test_gc_with_a_size_it_cannot_read_is_an_error_not_a_traceback(built):
    run = cli(built, "cache", "gc", "--max-size", "big")
    assert run.returncode == 2
    assert run.stderr.startswith("error: --max-size: not a size: 'big' (write e.g. '20 GiB'")


# --- stats -----------------------------------------------------------------------------------
def test_stats_counts_steps_this_host_cannot_run_apart_from_misses(project):
    project.write("optbuild.toml", CONFIG.replace("[kinds]\n", '[kinds]\nneeds_gpu = "gpu_kinds.py:NeedsGpu"\n'))
    project.write("gpu_kinds.py", NEEDS_GPU)
    project.write("recipes/gpu.toml", '[steps.engine]\nkind = "needs_gpu"\ninput = "chain:mid"\n')
    for _ in range(2):
        assert project.build(skip_unavailable=True).ok

    totals = json.loads(cli(project, "cache", "stats", "--json").stdout)["totals"]
    assert totals["local"] == {"hits": 4, "misses": 4, "unavailable": 2}
    text = cli(project, "cache", "stats").stdout
    assert "local hit rate 50% (4/8), 2 unavailable" in text
    rows = [line.split() for line in text.splitlines()[1:3]]
    assert [row[3:5] for row in rows] == [["0/4", "1"], ["4/0", "1"]]


def test_stats_of_runs_recorded_before_unavailable_had_a_count_of_its_own(project):
    """Such records counted a step this host cannot run as a miss; their status counts say
    how many to move."""
    old = {"time": 0, "command": "build", "ok": True, "counts": {"cached": 3, "unavailable": 2},
           "local": {"hits": 3, "misses": 2}, "remote": None}
    project.write("cache/stats.jsonl", json.dumps(old) + "\n")
    totals = json.loads(cli(project, "cache", "stats", "--json").stdout)["totals"]
    assert totals["local"] == {"hits": 3, "misses": 0, "unavailable": 2}
    assert "local hit rate 100% (3/3), 2 unavailable" in cli(project, "cache", "stats").stdout


def test_the_build_stats_line_names_unavailable_steps_apart():
    line = describe_stats({"local": {"hits": 3, "misses": 0, "unavailable": 2}, "remote": None})
    assert line == "cache: local 3 hits, 0 misses, 2 unavailable"


def test_the_build_stats_line_counts_the_requests_made_to_the_remote():
    remote = {"url": "s3://b/c", **RemoteStats(hits=4, requests=6, bytes_down=2048).__dict__}
    line = describe_stats({"local": {"hits": 0, "misses": 4}, "remote": remote})
    assert line == ("cache: local 0 hits, 4 misses; remote s3://b/c: 4 hits, 0 misses, 0 errors, 6 requests, "
                    "2.0 KiB down, 0 B up")
