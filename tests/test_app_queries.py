"""The read-only use cases behind `optbuild diff`, `graph` and `kinds`, called from Python as
the CLI calls them: typed results, and the CLI's refusals as OptbuildError."""

from __future__ import annotations

import shutil

import pytest
from plugins.projects import CONFIG, PIPELINE, ProjectDir

from optbuild.app.diff import lock_diff, lock_file
from optbuild.app.graph import graph_text
from optbuild.app.kinds import kinds, reference
from optbuild.common.errors import OptbuildError


def _project(root) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("optbuild.toml", CONFIG.replace("[project]", '[project]\nlock_file = "team.lock"', 1))
    proj.write("recipes/chain.toml", PIPELINE)
    return proj


def test_the_lock_file_is_the_one_optbuild_toml_names_and_a_diff_needs_it_built(tmp_path):
    proj = _project(tmp_path / "proj")
    assert lock_file(proj.root) == proj.root / "team.lock"
    with pytest.raises(OptbuildError, match="team.lock does not exist: build first"):
        lock_diff(proj.root)


def test_a_lock_file_against_a_copy_of_itself_differs_in_nothing(tmp_path):
    proj = _project(tmp_path / "proj")
    assert proj.build().ok
    shutil.copy(proj.root / "team.lock", proj.root / "before.lock")
    found = lock_diff(proj.root, "before.lock")
    assert not found.differs and found.current == proj.root / "team.lock"
    assert found.as_json()["differs"] is False


def test_outside_a_project_diff_names_the_folder(tmp_path):
    with pytest.raises(OptbuildError, match=f"no optbuild.toml in {tmp_path}"):
        lock_file(tmp_path)


def test_the_graph_of_a_target_holds_its_steps_only(tmp_path):
    proj = _project(tmp_path / "proj")
    dot = graph_text(proj.root, ["chain:mid"])
    assert "chain:mid" in dot and "chain:src" in dot and "chain:side" not in dot
    assert graph_text(proj.root, ["chain:mid"], "mermaid").startswith("flowchart")


def test_the_project_s_own_kinds_are_listed_and_marked(tmp_path):
    proj = _project(tmp_path / "proj")
    rows = {row.kind: row for row in kinds(proj.root)}
    assert "quantize" in rows and "[project:" not in rows["quantize"].summary
    assert any("[project:" in row.summary for row in rows.values())
    with pytest.raises(OptbuildError, match="unknown step kind 'quantise'; did you mean 'quantize'"):
        reference(proj.root, "quantise")
