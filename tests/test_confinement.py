"""Names and folder settings can never make a build or a clean write or delete outside
the build and cache folders."""

from __future__ import annotations

import pytest

from optbuild.errors import ProjectError
from optbuild.recipe import load_project

SOURCE = '[steps.recipes]\nkind = "text"\npath = "../data/input.txt"\n'


def test_a_recipe_file_named_dot_dot_is_refused_and_nothing_is_replaced(project):
    """`...toml` is recipe `..`: build/../recipes would have been the recipes folder."""
    bad = project.write("recipes/...toml", SOURCE)
    run = project.cli("build")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"error: {bad}: invalid recipe name '..'" in run.stderr
    assert sorted(p.name for p in (project.root / "recipes").iterdir()) == ["...toml", "chain.toml"]
    assert not (project.root / "build").exists()


@pytest.mark.parametrize("name", ["..", ".hidden", "-flag", "a" * 101, "white space"])
def test_unsafe_step_names_are_refused_naming_file_line_and_field(project, name):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml") + f'\n[steps."{name}"]\nkind = "text"\n'
                  'path = "../data/input.txt"\n')
    with pytest.raises(ProjectError) as info:
        load_project(project.root)
    (problem,) = info.value.problems
    assert str(problem).startswith(f"{project.root / 'recipes/chain.toml'}:21: steps.{name}: invalid step name")


@pytest.mark.parametrize("table, setting, why", [
    ("project", 'build_dir = "."', "project.build_dir: '.' is the project folder"),
    ("project", 'build_dir = ".."', "project.build_dir: '..' contains the project folder"),
    ("project", 'build_dir = "recipes"', "project.build_dir: 'recipes' holds the project file"),
    ("cache", 'dir = "."', "cache.dir: '.' is the project folder"),
    ("cache", 'dir = "build/cache"', "must not lie inside one another"),
])
def test_build_and_cache_folders_that_would_delete_the_project_are_refused(project, table, setting, why):
    config = project.read("optbuild.toml")
    header = f"[{table}]\n"
    project.write("optbuild.toml", config.replace(header, header + setting + "\n") if header in config
                  else config + "\n" + header + setting + "\n")
    before = sorted(p.relative_to(project.root) for p in project.root.rglob("*"))
    for command in ("build", "clean"):
        run = project.cli(command, "--cache") if command == "clean" else project.cli(command)
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert "optbuild.toml:" in run.stderr and why in run.stderr, run.stderr
    assert sorted(p.relative_to(project.root) for p in project.root.rglob("*")) == before


def test_outputs_are_never_written_through_a_symlink_out_of_the_build_folder(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (project.root / "build").mkdir()
    (project.root / "build/chain").symlink_to(outside)
    result = project.build()
    error = result.outcomes["chain:src"].error
    assert f"refusing to write the outputs of chain:src to {project.root / 'build/chain/src'}" in error
    assert f"it is not inside {project.root / 'build'}" in error
    assert not any(outside.iterdir())
    (project.root / "build/chain").unlink()
    assert project.build().ok
