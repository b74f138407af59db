"""Incremental decisions (``builder/memo.py``): a run that takes what the last run remembered
decides exactly as one that computes everything from scratch, whatever changed in between,
and spares the cache reads and folder walks of the steps nothing reached."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from plugins.projects import ProjectDir

from optbuild import api
from optbuild.builder import lockfile, memo
from optbuild.builder.report import Reporter
from optbuild.common.digest import FileHasher
from optbuild.project import parsed
from optbuild.store.local import LocalStore

CHAINS, LENGTH = 6, 5


@pytest.fixture
def chains(tmp_path) -> ProjectDir:
    """Six chains of a text source and four joins (30 steps)."""
    proj = ProjectDir.with_test_kinds(tmp_path / "p")
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n[kinds]\ntext = "kinds.py:Text"\n'
                                'join = "kinds.py:Join"\n[build]\njobs = 2\nkeep_going = true\n')
    for chain in range(CHAINS):
        proj.write(f"data/in{chain}.txt", f"input {chain}")
        proj.write(f"recipes/c{chain}.toml", _recipe(chain, {}))
    return proj


def _recipe(chain: int, suffixes: dict[int, str]) -> str:
    lines = [f'[steps.s0]\nkind = "text"\npath = "../data/in{chain}.txt"\n']
    lines += [f'[steps.s{i}]\nkind = "join"\ninput = "s{i - 1}"\nsuffix = "{suffixes.get(i, f"-{i}")}"\n'
              for i in range(1, LENGTH)]
    return "\n".join(lines)


def _run(proj: ProjectDir, *, dry_run: bool) -> tuple[dict[str, tuple[str, str | None]], int]:
    """Each step's (status, key), and how many entries the memo served."""
    ws = api.open_workspace(proj.root)
    served = []
    real = memo.DecisionMemo.entry

    def counting(self, *args, **kwargs):
        found = real(self, *args, **kwargs)
        served.append(found is not None)
        return found

    memo.DecisionMemo.entry = counting
    try:
        result = api.build(ws, None, reporter=Reporter(), dry_run=dry_run)
    finally:
        memo.DecisionMemo.entry = real
        ws.close()
    return {sid: (str(o.status), o.key) for sid, o in result.outcomes.items()}, sum(served)


def _from_scratch_plan(proj: ProjectDir) -> dict[str, tuple[str, str | None]]:
    """The plan with nothing remembered: the decision memo and the parsed recipes moved aside
    meanwhile (and back, as they were: a plan writes no memo)."""
    state = proj.root / "build" / ".optbuild"
    kept = {state / name: state / f"aside-{name}" for name in (memo.NAME, parsed.NAME) if (state / name).exists()}
    assert state / memo.NAME in kept
    for path, aside in kept.items():
        path.rename(aside)
    try:
        return _run(proj, dry_run=True)[0]
    finally:
        for path, aside in kept.items():
            aside.replace(path)


def _materialized(proj: ProjectDir) -> list[str]:
    """The steps whose build folder does not hold exactly their entry's outputs, checked from
    scratch by a fresh store."""
    store = LocalStore(proj.root / "cache", FileHasher(proj.root / "cache" / "fresh-stat-cache.db"), read_only=True)
    wrong = []
    for sid, record in lockfile.read(proj.root / "optbuild.lock").items():
        key = record["key"]
        recipe, step = sid.split(":")
        entry = store.get_action(key)
        if entry is None or not store.is_materialized(entry, proj.root / "build" / recipe / step):
            wrong.append(sid)
    return wrong


def _blobs(proj: ProjectDir) -> list[Path]:
    return sorted(p for p in (proj.root / "cache" / "cas").rglob("*") if p.is_file())


def _edit(proj: ProjectDir, rng: random.Random, suffixes: dict[int, dict[int, str]]) -> str:
    """One random change of what a decision is made from; says which."""
    chain, step = rng.randrange(CHAINS), rng.randrange(1, LENGTH)
    what = rng.choice(["input", "touch", "param", "entry", "blob", "corrupt", "output", "nothing"])
    if what == "input":
        proj.write(f"data/in{chain}.txt", f"input {chain} {rng.random()}")
    elif what == "touch":
        os.utime(proj.root / f"data/in{chain}.txt")
    elif what == "param":
        suffixes.setdefault(chain, {})[step] = f"-{rng.randrange(3)}"
        proj.write(f"recipes/c{chain}.toml", _recipe(chain, suffixes[chain]))
    elif what == "entry":
        entries = sorted((proj.root / "cache" / "ac").rglob("*.json"))
        rng.choice(entries).unlink()
    elif what == "blob":
        rng.choice(_blobs(proj)).unlink()
    elif what == "corrupt":  # same size, other bytes: only its signature tells
        blob = rng.choice(_blobs(proj))
        blob.chmod(0o644)
        data = blob.read_bytes()
        blob.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    elif what == "output":
        folder = proj.root / "build" / f"c{chain}" / f"s{step}"
        (folder / "data.txt").unlink(missing_ok=True)
    return what


def test_incremental_decisions_equal_a_from_scratch_computation_on_random_edits(chains, monkeypatch):
    monkeypatch.setattr(memo, "RACY_NS", 0)  # this test edits faster than timestamps tick: see the next test
    assert all(status == "built" for status, _ in _run(chains, dry_run=False)[0].values())
    rng = random.Random(31)
    suffixes: dict[int, dict[int, str]] = {}
    for _round in range(12):
        time.sleep(0.02)  # a timestamp tick between an edit and the run before it
        done = [_edit(chains, rng, suffixes) for _ in range(rng.randrange(1, 4))]
        time.sleep(0.02)
        planned, served = _run(chains, dry_run=True)
        assert planned == _from_scratch_plan(chains), done
        built, _ = _run(chains, dry_run=False)
        for sid, (status, key) in built.items():  # what the plan said, done
            expected = {"would-build": "built"}.get(planned[sid][0], planned[sid][0])
            assert status in (expected, "cached"), (done, sid, status, planned[sid])
            assert planned[sid][1] in (None, key), (done, sid)
        assert _materialized(chains) == [], done
    _, served = _run(chains, dry_run=True)
    assert served == CHAINS * LENGTH  # nothing changed since: every step decided from the memo


def test_a_file_changed_within_the_racy_window_is_not_vouched_for(chains):
    assert _run(chains, dry_run=False)[0]
    _, served = _run(chains, dry_run=False)  # its entries, blobs and folders were written just now
    assert served == 0
    time.sleep(memo.RACY_NS / 1e9 + 0.1)
    _run(chains, dry_run=False)  # now old enough to be remembered
    _, served = _run(chains, dry_run=True)
    assert served == CHAINS * LENGTH


def test_a_builds_own_products_old_enough_when_it_ends_are_vouched_for_once_their_content_checks(
        chains, monkeypatch):
    """Every product is young when its step settles; a build that ends RACY_NS later vouches
    for those whose bytes still check out, so the next run decides from the memo at once.
    One changed in place meanwhile (same size) is not vouched for: its step is read again."""
    monkeypatch.setattr(memo, "RACY_NS", 300_000_000)
    damaged = chains.root / "build" / "c0" / "s2" / "data.txt"  # a hard link of its blob
    real_save = memo.DecisionMemo.save

    def ends_later(self):
        data = damaged.read_bytes()
        damaged.chmod(0o644)
        damaged.write_bytes(bytes([data[0] ^ 1]) + data[1:])
        time.sleep(0.4)  # the rest of a long build
        real_save(self)

    monkeypatch.setattr(memo.DecisionMemo, "save", ends_later)
    assert all(status == "built" for status, _ in _run(chains, dry_run=False)[0].values())
    monkeypatch.setattr(memo.DecisionMemo, "save", real_save)
    planned, served = _run(chains, dry_run=True)
    assert planned["c0:s2"][0] == "would-build"  # the cache found its blob damaged: it builds again
    assert served == CHAINS * LENGTH - 3  # all but c0:s2 and the two steps whose keys wait on it
    assert planned == _from_scratch_plan(chains)


def test_a_memo_naming_an_output_outside_its_step_folder_is_not_followed(chains, monkeypatch, tmp_path):
    """The memo is a file in the build folder: whatever it names, a restore writes only there."""
    import json

    monkeypatch.setattr(memo, "RACY_NS", 0)
    for _ in range(3):  # built, then remembered as steady (a log blob the steps share settles)
        _run(chains, dry_run=False)
    assert _run(chains, dry_run=True)[1] == CHAINS * LENGTH
    path = chains.root / "build" / ".optbuild" / memo.NAME
    doc = json.loads(path.read_text())
    record = doc["steps"]["c0:s1"]
    record["entry"]["outputs"] = {"../../../escaped.txt": record["entry"]["outputs"]["data.txt"]}
    path.write_text(json.dumps(doc))  # its entry and blobs unchanged: only the names it gives lie
    outcomes, _ = _run(chains, dry_run=False)
    assert outcomes["c0:s1"][0] == "cached"
    assert not list(tmp_path.rglob("escaped.txt"))
    assert (chains.root / "build" / "c0" / "s1" / "data.txt").read_text() == "input 0-1"


def test_a_run_that_changed_no_record_writes_no_memo(chains, monkeypatch):
    """A no-op decides every step from the memo and changes none of its records: it writes
    nothing (the memo is 7 MB of JSON at 10,000 steps). A build that changed a step writes it."""
    monkeypatch.setattr(memo, "RACY_NS", 0)  # every product old enough at once
    _run(chains, dry_run=False)
    _run(chains, dry_run=False)  # its records now as this run checked them
    path = chains.root / "build" / ".optbuild" / memo.NAME
    written = path.stat()
    statuses, served = _run(chains, dry_run=False)
    assert served == CHAINS * LENGTH and all(status == "cached" for status, _ in statuses.values())
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == (written.st_mtime_ns, written.st_ino)
    chains.write("data/in0.txt", "changed")
    statuses, _ = _run(chains, dry_run=False)
    assert statuses["c0:s0"][0] == "built"
    assert path.stat().st_ino != written.st_ino  # replaced whole, with the new records
