"""Incremental decisions: a run that takes what the last run remembered (``builder/memo.py``)
or loads only what a change reaches (``common/noopreach.py``) decides exactly as one that
computes everything from scratch, whatever changed in between, and spares the cache reads and
folder walks of the steps nothing reached."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
from plugins.fastpath import optbuild
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


def _cli_lines(text: str) -> dict[str, str]:
    """Step -> status, from a plan's or a build's step lines ("  would-build c0:s2  (...)")."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if line.startswith("  ") and len(words) >= 2 and ":" in words[1] and words[0] != "build":
            found[words[1]] = words[0]
    return found


def _with_reader(chains: ProjectDir) -> None:
    """Recipe x, whose step reads c0's last step and c1's third; built, with a usable stamp."""
    chains.write("recipes/x.toml", '[steps.after]\nkind = "join"\ninput = "c0:s4"\nother = "c1:s2"\n'
                                   'suffix = "-x"\n')
    assert optbuild(chains, "build").returncode == 0  # it made build/ and cache/: not vouched for
    assert optbuild(chains, "build").returncode == 0
    assert optbuild(chains, "build").fast


def test_a_change_reaches_the_recipes_downstream_and_those_they_read_from(chains):
    _with_reader(chains)
    chains.write("data/in0.txt", "input 0, edited")
    plan = optbuild(chains, "plan")
    assert "partial: c0:s0: data/in0.txt changed; loading 3 recipes" in plan.declined  # c0, x, and c1 for x
    lines = _cli_lines(plan.stdout)
    assert [sid for sid, status in lines.items() if status == "would-build"] == [
        *(f"c0:s{i}" for i in range(LENGTH)), "x:after"]
    build = optbuild(chains, "build")
    assert "ok: 25 cached, 6 built" in build.stderr
    assert (chains.root / "build" / "x" / "after" / "data.txt").read_text() == "input 0, edited-1-2-3-4+input 1-1-2-x"
    assert optbuild(chains, "build").fast


def test_a_build_that_loads_only_what_a_change_reaches_decides_as_one_from_scratch(chains):
    """``optbuild plan`` and ``build`` as a user runs them: when the no-op stamp shows that only
    some steps' own files changed (an input, an output, a cache entry or blob), they load the
    recipes the change reaches and replay the other steps as recorded (``common/noopreach.py``).
    Their answer is a from-scratch computation's, and what they leave behind (optbuild.lock,
    the step folders) is what a build from scratch would."""
    _with_reader(chains)
    rng = random.Random(7)
    suffixes: dict[int, dict[int, str]] = {}
    partial = 0
    for _round in range(20):
        time.sleep(0.02)
        done = [_edit(chains, rng, suffixes) for _ in range(rng.randrange(1, 3))]
        time.sleep(0.02)
        scratch = _from_scratch_plan(chains)
        plan = optbuild(chains, "plan")
        assert plan.returncode == 0, (done, plan.stderr)
        assert _cli_lines(plan.stdout) == {sid: status for sid, (status, _) in scratch.items()}, (done, plan.stderr)
        build = optbuild(chains, "build")
        assert build.returncode == 0, (done, build.stderr)
        assert len(_cli_lines(build.stderr)) == len(scratch), done
        partial += "partial: " in build.declined
        after = _from_scratch_plan(chains)
        assert all(status == "cached" for status, _ in after.values()), (done, after)
        recorded = lockfile.read(chains.root / "optbuild.lock")
        assert {sid: recorded[sid]["key"] for sid in after} == {sid: key for sid, (_, key) in after.items()}, done
        assert _materialized(chains) == [], done
    assert partial >= 12  # the rounds with something to decide again


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


def test_a_build_that_loads_some_recipes_keeps_the_failure_logs_of_the_others(chains):
    """The log of a failed step is removed when the step succeeds or leaves the project; a
    step of a recipe that a build did not load did neither."""
    chains.write("recipes/c1.toml", _recipe(1, {}).replace('suffix = "-2"', 'suffix = "-2"\nfail = true'))
    assert optbuild(chains, "build", "c1").returncode == 1
    log = chains.root / "build" / ".logs" / "c1" / "s2.log"
    assert log.is_file()
    for _ in range(2):
        assert optbuild(chains, "build", "c0").returncode == 0
    assert optbuild(chains, "build", "c0").fast
    chains.write("data/in0.txt", "input 0, edited")
    build = optbuild(chains, "build", "c0")
    assert build.returncode == 0 and "loading 1 recipes" in build.declined
    assert log.is_file()


def test_a_record_that_would_replay_a_step_as_no_ok_build_leaves_it_takes_the_normal_path(chains):
    _with_reader(chains)
    path = chains.root / "build" / ".optbuild" / "noop-steps.json"
    doc = json.loads(path.read_text())
    doc["steps"]["c3:s1"]["status"] = "exploded"
    path.write_text(json.dumps(doc))
    chains.write("data/in0.txt", "input 0, edited")
    build = optbuild(chains, "build")
    assert build.returncode == 0 and "ValueError: a step of the record has a status" in build.declined
    assert "ok: 25 cached, 6 built" in build.stderr


def test_an_edited_recipe_is_loaded_with_what_it_reaches_and_its_new_steps_are_built(chains):
    _with_reader(chains)
    chains.write("recipes/c2.toml", _recipe(2, {3: "-three"}) + '[steps.s5]\nkind = "join"\ninput = "s4"\n')
    plan = optbuild(chains, "plan")
    assert "partial: c2:s0 and 4 more: recipes/c2.toml changed; loading 1 recipes" in plan.declined
    assert {sid: status for sid, status in _cli_lines(plan.stdout).items() if status != "cached"} == {
        "c2:s3": "would-build", "c2:s4": "would-build", "c2:s5": "would-build"}
    build = optbuild(chains, "build")
    assert "ok: 29 cached, 3 built" in build.stderr, build.stderr
    assert (chains.root / "build" / "c2" / "s5" / "data.txt").read_text() == "input 2-1-2-three-4"
    assert optbuild(chains, "build").fast
    chains.write("recipes/c4.toml", _recipe(4, {4: "-four"}))  # a recipe that build replayed
    plan = optbuild(chains, "plan")
    assert "partial: c4:s0 and 4 more: recipes/c4.toml changed; loading 1 recipes" in plan.declined


def test_a_recipe_edited_to_read_a_recipe_it_did_not_read_loads_the_whole_project(chains):
    _with_reader(chains)
    chains.write("recipes/c2.toml", _recipe(2, {}).replace('input = "s3"', 'input = "c5:s1"'))
    build = optbuild(chains, "build")
    assert build.returncode == 0 and "partial: " in build.declined, build.stderr
    assert (chains.root / "build" / "c2" / "s4" / "data.txt").read_text() == "input 5-1-4"
    assert all(status == "cached" for status, _ in _from_scratch_plan(chains).values())


def test_a_step_removed_that_another_recipe_reads_is_reported_as_a_whole_load_reports_it(chains):
    _with_reader(chains)
    chains.write("recipes/c1.toml", '[steps.s0]\nkind = "text"\npath = "../data/in1.txt"\n')
    partial = optbuild(chains, "build")
    (chains.root / "build" / ".optbuild" / "noop.json").unlink()
    whole = optbuild(chains, "build")
    assert partial.returncode == whole.returncode == 2 and "no step 'c1:s2'" in whole.stderr
    assert partial.stderr.split("\n", 1)[1] == whole.stderr.split("\n", 1)[1]  # after why the fast path declined


def test_a_build_of_targets_in_an_edited_recipe_selects_as_a_whole_load_does(chains):
    """Here c0:s4 comes to read c0:s0 alone: a build of it selects those two, not the steps
    the record had selected for it."""
    for _ in range(2):
        assert optbuild(chains, "build", "c0:s4").returncode == 0
    assert optbuild(chains, "build", "c0:s4").fast
    chains.write("recipes/c0.toml", _recipe(0, {}).replace('input = "s3"', 'input = "s0"'))
    build = optbuild(chains, "build", "c0:s4")
    assert build.returncode == 0, build.stderr
    assert sorted(_cli_lines(build.stderr)) == ["c0:s0", "c0:s4"]


def test_plan_warns_of_two_deploy_steps_publishing_one_model_when_one_is_not_loaded(tmp_path):
    from plugins.steps import tiny_onnx

    proj = ProjectDir(tmp_path / "p")
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n[build]\njobs = 1\n')
    for name in ("net", "other"):
        proj.write(f"recipes/{name}.toml", f'[steps.src]\nkind = "onnx"\npath = "{name}.onnx"\n\n'
                   '[steps.serve]\nkind = "deploy"\ninput = "src"\n')
        tiny_onnx(proj.root / "recipes" / f"{name}.onnx")
    for _ in range(2):
        assert optbuild(proj, "build").returncode == 0
    proj.write("recipes/other.toml", proj.read("recipes/other.toml") + 'model_name = "net"\n')
    plan = optbuild(proj, "plan")
    assert "partial: other:src and 1 more: recipes/other.toml changed; loading 1 recipes" in plan.declined
    assert "warning: deploy steps net:serve, other:serve all publish model 'net'" in plan.stderr


def test_an_input_saved_by_renaming_a_new_file_over_it_reaches_only_its_steps(chains):
    """As editors save: the folder then holds the names it held, and those alone vouch for it."""
    _with_reader(chains)
    saved = chains.write("data/.in3.txt.tmp", "input 3, saved")
    os.replace(saved, chains.root / "data" / "in3.txt")
    plan = optbuild(chains, "plan")
    assert "partial: c3:s0: data/in3.txt changed; loading 1 recipes" in plan.declined
    chains.write("data/in9.txt", "a new file beside the inputs")  # named by no recipe: it reaches no step
    assert "partial: c3:s0: data/in3.txt changed; loading 1 recipes" in optbuild(chains, "plan").declined


def test_a_new_file_in_a_folder_that_a_kind_lists_reaches_its_steps_and_no_others(chains):
    """A kind whose key files come from listing a folder (it overrides ``key_files``, not
    ``key_folders``) has that folder's names checked; a file named by a recipe, its own alone."""
    chains.write("optbuild.toml", chains.read("optbuild.toml").replace('join = "kinds.py:Join"',
                                                                       'join = "kinds.py:Join"\nlisting = "kinds.py:Listing"'))
    chains.write("recipes/l.toml", '[steps.all]\nkind = "listing"\nfolder = "../data"\n')
    _with_reader(chains)
    chains.write("data/in9.txt", "a new file beside the inputs")
    plan = optbuild(chains, "plan")
    assert "partial: l:all: data changed; loading 1 recipes" in plan.declined
    assert [sid for sid, status in _cli_lines(plan.stdout).items() if status != "cached"] == ["l:all"]
