"""Names and folder settings can never make a build or a clean write or delete outside
the build and cache folders."""

from __future__ import annotations

import re
import shutil

import pytest

from optbuild.common.errors import ProjectError
from optbuild.project.recipe import load_project

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
    assert project.build().ok
    shutil.rmtree(project.root / "build/chain")
    (project.root / "build/chain").symlink_to(outside)
    project.write("data/input.txt", "changed: the step builds again")
    result = project.build()
    error = result.outcomes["chain:src"].error
    assert f"refusing to write the outputs of chain:src to {project.root / 'build/chain/src'}" in error
    assert f"it is not inside {project.root / 'build'}" in error
    assert not any(outside.iterdir())
    (project.root / "build/chain").unlink()
    assert project.build().ok


# --- `clean` deletes only what optbuild made --------------------------------------------------
def set_folders(project, *settings: str) -> None:
    """Put ``settings`` (TOML lines for [project] or [cache]) into the project's optbuild.toml."""
    config = project.read("optbuild.toml")
    for setting in settings:
        table = "[cache]\n" if setting.startswith("dir") else "[project]\n"
        config = config.replace(table, table + setting + "\n") if table in config else config + "\n" + table + setting + "\n"
    project.write("optbuild.toml", config)


@pytest.mark.parametrize("setting, field", [('build_dir = "../victim"', "project.build_dir"),
                                            ('dir = "../victim"', "cache.dir")])
def test_a_folder_outside_the_project_needs_an_explicit_opt_in(project, tmp_path, setting, field):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("mine")
    set_folders(project, setting)
    for args in (("build",), ("clean", "--cache")):
        run = project.cli(*args)
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert re.search(rf"optbuild\.toml:\d+: {field}: '\.\./victim' lies outside the project folder", run.stderr)
        assert "set allow_outside = true in [project]" in run.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]


def test_clean_leaves_a_folder_optbuild_did_not_make_and_says_so(project, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("mine")
    set_folders(project, "allow_outside = true", 'build_dir = "../victim"', 'dir = "../victim-cache"')
    (tmp_path / "victim-cache").mkdir()
    (tmp_path / "victim-cache" / "precious.txt").write_text("mine too")

    run = project.cli("clean", "--cache")
    assert run.returncode == 1
    assert f"skipped {victim}: not deleted: nothing says optbuild made it (no .optbuild-folder in it" in run.stdout
    assert f"skipped {tmp_path / 'victim-cache'}: not deleted" in run.stdout
    assert (victim / "precious.txt").read_text() == "mine"
    assert (tmp_path / "victim-cache" / "precious.txt").read_text() == "mine too"


def test_clean_in_a_cache_folder_optbuild_wrote_into_deletes_only_what_optbuild_made(project, tmp_path):
    """A cache in an existing folder (allowed outside the project) puts its layout beside the
    user's files; clean takes the layout and nothing else. (A build folder is never an existing
    folder of a user's: tests/test_clean.py.)"""
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    (shared / "precious.txt").write_text("mine")
    set_folders(project, "allow_outside = true", 'dir = "../shared-cache"')
    assert project.cli("build").returncode == 0
    assert (shared / "cas").is_dir()

    run = project.cli("clean", "--cache")
    assert run.returncode == 0, run.stderr
    assert f"removed {shared / 'cas'}" in run.stdout
    assert f"skipped {shared / 'precious.txt'}: kept: optbuild did not make it" in run.stdout
    assert sorted(p.name for p in shared.iterdir()) == ["precious.txt"]


def test_the_folders_optbuild_makes_carry_its_marker_and_clean_removes_them(project):
    assert project.cli("build").returncode == 0
    for folder, kind in (("build", "build"), ("cache", "cache")):
        assert f"as a {kind} folder" in project.read(f"{folder}/.optbuild-folder")
    project.write("build/notes.txt", "a user's file in the build folder")

    run = project.cli("clean", "--cache")
    assert run.returncode == 0
    assert f"skipped {project.root / 'build/notes.txt'}: kept: optbuild has no record of writing it" in run.stdout
    assert sorted(p.name for p in (project.root / "build").iterdir()) == [".optbuild-folder", "notes.txt"]
    assert sorted(p.name for p in (project.root / "cache").iterdir()) == [".optbuild-folder"]  # still optbuild's

    (project.root / "build/notes.txt").unlink()
    assert project.cli("build").returncode == 0
    run = project.cli("clean")
    assert run.stdout.splitlines() == [f"removed {project.root / 'build'}"]
    assert not (project.root / "build").exists()


def test_a_build_folder_that_is_a_symbolic_link_is_emptied_and_the_link_kept(project):
    real = project.root / "outputs-disk"
    real.mkdir()
    (project.root / "build").symlink_to(real)
    assert project.cli("build").returncode == 0
    assert (real / "chain/out").is_dir()

    run = project.cli("clean")
    assert run.returncode == 0 and f"removed {project.root / 'build/chain'}" in run.stdout
    assert (project.root / "build").is_symlink() and list(real.iterdir()) == []


def test_a_cache_made_before_markers_existed_is_known_by_its_layout(project):
    """An earlier optbuild wrote no marker: its cache holds cas/ and ac/; clean takes what
    optbuild made there. (An earlier build folder: tests/test_clean.py.)"""
    assert project.cli("build").returncode == 0
    (project.root / "cache/.optbuild-folder").unlink()
    project.write("cache/.gitkeep", "")

    run = project.cli("clean", "--cache")
    assert run.returncode == 0, run.stdout
    assert not (project.root / "build").exists()
    assert sorted(p.name for p in (project.root / "cache").iterdir()) == [".gitkeep"]
    assert f"skipped {project.root / 'cache/.gitkeep'}: kept: optbuild did not make it" in run.stdout


def test_a_folder_marked_as_another_kind_is_not_cleaned_as_this_one(project, tmp_path):
    """A cache folder named as the build folder (settings swapped) is not emptied by `clean`."""
    assert project.cli("build").returncode == 0
    set_folders(project, 'build_dir = "old-cache"')
    (project.root / "cache").rename(project.root / "old-cache")
    run = project.cli("clean")
    assert run.returncode == 1 and f"skipped {project.root / 'old-cache'}: not deleted" in run.stdout
    assert (project.root / "old-cache/cas").is_dir()
