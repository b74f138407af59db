"""optbuild.lock: a damaged one is reported and kept, never silently replaced; files
optbuild writes get the permissions the user's umask gives."""

from __future__ import annotations

import json
import os
import stat

import pytest

from optbuild.builder import lockfile
from optbuild.common.atomic import write_atomic

DAMAGED = "{ not json"


def test_a_damaged_lock_file_is_reported_once_and_kept_aside(project):
    assert project.cli("build").returncode == 0
    (project.root / "optbuild.lock").write_text(DAMAGED)
    run = project.cli("build", "--json")
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("optbuild.lock is damaged (not valid JSON") == 1, run.stderr
    (aside,) = project.root.glob("optbuild.lock.damaged-*")
    assert aside.read_text() == DAMAGED
    assert f"moved the damaged {project.root / 'optbuild.lock'}" in run.stderr and str(aside) in run.stderr
    assert len(lockfile.load(project.root / "optbuild.lock").steps) == 4


def test_gc_with_a_damaged_lock_file_keeps_every_recently_used_entry(project):
    assert project.cli("build").returncode == 0
    (project.root / "optbuild.lock").write_text(DAMAGED)
    gc = project.cli("cache", "gc", "--max-size", "0", "--grace-minutes", "0")
    assert gc.returncode == 0
    assert "optbuild.lock is damaged" in gc.stderr and "gc keeps every entry used in the last 7 days" in gc.stderr
    assert project.cli("build", "--json").steps("built") == []


@pytest.mark.parametrize("text, damage", [
    ("", "not valid JSON"),
    ("[]", "not an optbuild lock file"),
    ('{"format": 99, "steps": {}}', "not an optbuild lock file"),
    ('{"format": 1, "steps": {"a:b": 1}}', "its steps are not records"),
])
def test_damage_is_told_apart_from_absence(tmp_path, text, damage):
    path = tmp_path / "optbuild.lock"
    assert lockfile.load(path) == lockfile.LockState()
    path.write_text(text)
    state = lockfile.load(path)
    assert state.steps == {} and state.damage is not None and damage in state.damage


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_written_files_get_the_permissions_of_the_umask(project, tmp_path, umask):
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "report.json", b"{}")
        assert project.cli("build").returncode == 0  # the CLI inherits the umask
    finally:
        os.umask(old)
    for path in (tmp_path / "report.json", project.root / "optbuild.lock"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    assert json.loads((project.root / "optbuild.lock").read_text())["steps"]


def test_an_update_encodes_only_the_records_that_changed(tmp_path):
    path, guard = tmp_path / "optbuild.lock", tmp_path / "lock"
    records = {f"r:s{i}": {"key": f"{i:064x}", "metrics": {"n": i}} for i in range(5)}
    lockfile.update(path, records, guard)
    # An untouched record's line is kept as it was: a tighter one (same record) shows it.
    tight = '"r:s1": {"key":"' + f"{1:064x}" + '","metrics":{"n":1}}'
    path.write_text(path.read_text().replace(f'"r:s1": {json.dumps(records["r:s1"], sort_keys=True)}', tight))
    changed = {"r:s2": {"key": "f" * 64, "metrics": {"n": -1}}, "r:new": {"key": "e" * 64}}
    lockfile.update(path, changed, guard)
    assert lockfile.load(path).steps == {**records, **changed}
    assert path.read_text() == lockfile.render({**records, **changed}).replace(
        f'"r:s1": {json.dumps(records["r:s1"], sort_keys=True)}', tight)


def test_a_lock_file_laid_out_by_hand_is_rewritten_in_full(tmp_path):
    path, guard = tmp_path / "optbuild.lock", tmp_path / "lock"
    records = {"r:a": {"key": "a" * 64}, "r:b": {"key": "b" * 64}}
    path.write_text(json.dumps({"format": 1, "steps": records}, indent=2))
    lockfile.update(path, {"r:b": {"key": "c" * 64}}, guard)
    assert path.read_text() == lockfile.render({"r:a": records["r:a"], "r:b": {"key": "c" * 64}})
