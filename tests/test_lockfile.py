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
