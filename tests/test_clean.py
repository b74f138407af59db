"""`optbuild clean` deletes only what optbuild wrote, and a build never takes a user's folder as
its build folder: no name (a recipe's, a step's in optbuild.lock) makes a user's file go."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from optbuild.common.digest import digest_bytes
from optbuild.common.errors import OptbuildError
from optbuild.store import written
from optbuild.store.marker import MARKER, take_build_folder


def set_project(project, *settings: str) -> None:
    """Put ``settings`` (TOML lines) into the project's [project] table."""
    config = project.read("optbuild.toml")
    project.write("optbuild.toml", config.replace("[project]\n", "[project]\n" + "".join(s + "\n" for s in settings)))


def tree(folder) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_build_never_takes_a_users_folder_as_its_build_folder(project, tmp_path):
    """Reproduction: build_dir = "../Documents" (allowed outside the project) with a recipe
    Work.toml beside Documents/Work/thesis.txt: build then clean deleted the thesis."""
    documents = tmp_path / "Documents"
    (documents / "Work").mkdir(parents=True)
    (documents / "Work/thesis.txt").write_text("four years of work")
    set_project(project, "allow_outside = true", 'build_dir = "../Documents"')
    project.write("recipes/Work.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n')

    run = project.cli("build")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert (f"error: the build folder {documents} already exists and optbuild did not make it (it holds Work)"
            in run.stderr), run.stderr
    assert "Set [project] build_dir to a new or empty folder" in run.stderr

    run = project.cli("clean")
    assert run.returncode == 1
    assert f"skipped {documents}: not deleted: nothing says optbuild made it" in run.stdout
    assert tree(documents) == ["Work", "Work/thesis.txt"]
    assert (documents / "Work/thesis.txt").read_text() == "four years of work"


def test_an_empty_folder_is_taken_as_the_build_folder_and_clean_gives_it_back_empty(project, tmp_path):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    set_project(project, "allow_outside = true", 'build_dir = "../outputs"')
    assert project.cli("build").returncode == 0
    assert (outputs / ".optbuild-folder").is_file() and (outputs / "chain/out/data.txt").is_file()

    run = project.cli("clean")
    assert run.returncode == 0 and run.stdout.splitlines() == [f"removed {outputs}"]
    assert not outputs.exists()


def test_clean_never_trusts_the_step_names_of_optbuild_lock(project, tmp_path):
    """Reproduction: a crafted optbuild.lock naming steps `Documents:x` and `.ssh:y` made clean
    alone delete the folders of those names in a folder holding .optbuild/ (taken for an
    earlier optbuild's build folder), .ssh/id_rsa with them."""
    home = tmp_path / "home"
    for name in (".optbuild", ".logs", ".ssh", "Documents"):
        (home / name).mkdir(parents=True)
    (home / ".ssh/id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    (home / "Documents/thesis.txt").write_text("four years of work")
    set_project(project, "allow_outside = true", 'build_dir = "../home"')
    crafted = {"format": 1, "steps": {"Documents:x": {"key": "0" * 64}, ".ssh:y": {"key": "0" * 64}}}
    project.write("optbuild.lock", json.dumps(crafted))
    before = tree(home)

    run = project.cli("clean")
    assert run.returncode == 1 and f"skipped {home}: not deleted: nothing says optbuild made it" in run.stdout
    assert project.cli("build").returncode == 2  # not taken as a build folder either: it holds .ssh
    assert tree(home) == before


def test_in_its_own_build_folder_clean_keeps_what_the_lock_file_names_but_optbuild_did_not_write(project):
    assert project.cli("build").returncode == 0
    build = project.root / "build"
    project.write("build/.ssh/id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----")
    project.write("build/Documents/thesis.txt", "four years of work")
    project.write("build/chain/notes.txt", "beside the step folders")
    lock = json.loads(project.read("optbuild.lock"))
    lock["steps"].update({"Documents:x": {"key": "0" * 64}, ".ssh:y": {"key": "0" * 64}})
    project.write("optbuild.lock", json.dumps(lock))

    run = project.cli("clean")
    assert run.returncode == 0, run.stderr
    for step in ("src", "mid", "out", "side"):
        assert f"removed {build / 'chain' / step}" in run.stdout
    for kept in (".ssh", "Documents", "chain/notes.txt"):
        assert f"skipped {build / kept}: kept: optbuild has no record of writing it" in run.stdout
    assert tree(build) == [".optbuild-folder", ".ssh", ".ssh/id_rsa", "Documents", "Documents/thesis.txt",
                           "chain", "chain/notes.txt"]


def test_a_foreign_file_in_a_step_folder_stays_and_the_build_will_not_replace_it(project):
    assert project.build().ok
    step = project.root / "build/chain/out"
    project.write("build/chain/out/notes.txt", "a user's notes among the outputs")
    project.write("data/input.txt", "changed: every step builds again")

    result = project.build()
    error = result.outcomes["chain:out"].error
    assert (f"cannot write the outputs of chain:out: optbuild replaces its folder {step} whole, but did not "
            f"write {step / 'notes.txt'} there. Move that out of the build folder, then build again") in error
    assert result.outcomes["chain:side"].status == "built"  # the other steps build
    assert project.read("build/chain/out/notes.txt") == "a user's notes among the outputs"

    run = project.cli("clean")
    assert run.returncode == 0, run.stderr
    assert f"skipped {step / 'notes.txt'}: kept: optbuild has no record of writing it" in run.stdout
    assert f"removed {step / 'data.txt'}" in run.stdout
    assert tree(project.root / "build") == [".optbuild-folder", "chain", "chain/out", "chain/out/notes.txt"]


def test_an_output_changed_since_optbuild_wrote_it_stays(project):
    assert project.build().ok
    output = project.root / "build/chain/side/data.txt"
    output.unlink()  # replaced (a hard link edited in place would change the cache's blob)
    output.write_text("the user's own version")

    run = project.cli("clean")
    assert run.returncode == 0
    assert f"skipped {output}: kept: changed since optbuild wrote it" in run.stdout
    assert tree(project.root / "build") == [".optbuild-folder", "chain", "chain/side", "chain/side/data.txt"]


def test_a_record_cannot_lead_clean_out_of_the_build_folder_nor_to_a_file_it_did_not_write(project, tmp_path):
    assert project.build().ok
    outside = tmp_path / "outside.txt"
    outside.write_text("not the build's")
    project.write("build/mine.txt", "a user's file")
    build = project.root / "build"
    text = b"not the build's"
    recorded = (digest_bytes(text), len(text))
    written.write(build, "crafted", {"../outside.txt": recorded, str(outside): recorded, "mine.txt": recorded})

    run = project.cli("clean")
    assert run.returncode == 0
    assert outside.read_text() == "not the build's"
    assert f"skipped {build / 'mine.txt'}: kept: changed since optbuild wrote it" in run.stdout
    assert tree(build) == [".optbuild-folder", "mine.txt"]


def test_logs_go_by_their_records_and_a_users_file_in_logs_stays(project):
    project.write("recipes/bad.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
                  '[steps.boom]\nkind = "join"\ninput = "src"\nfail = true\n')
    assert not project.build().ok
    build = project.root / "build"
    assert (build / ".logs/bad/boom.log").is_file()
    project.write("build/.logs/bad/mine.log", "a user's log")

    run = project.cli("clean")
    assert run.returncode == 0
    assert re.search(rf"^removed {re.escape(str(build / '.logs/bad/boom.log'))}$", run.stdout, re.MULTILINE), run.stdout
    assert tree(build) == [".logs", ".logs/bad", ".logs/bad/mine.log", ".optbuild-folder"]


def test_an_earlier_optbuilds_build_folder_is_cleaned_once_a_build_has_recorded_it(project):
    """A build folder an earlier optbuild made holds no marker and no records: clean leaves it
    whole, a build takes it (it holds only what optbuild makes there) and records its outputs."""
    assert project.cli("build").returncode == 0
    build = project.root / "build"
    (build / ".optbuild-folder").unlink()
    for record in sorted((build / written.RECORDS).rglob("*.json")):
        record.unlink()
    project.write("cache/.gitkeep", "")

    run = project.cli("clean", "--cache")
    assert run.returncode == 1 and f"skipped {build}: not deleted: nothing says optbuild made it" in run.stdout
    assert (build / "chain/out/data.txt").is_file()
    assert sorted(p.name for p in (project.root / "cache").iterdir()) == [".gitkeep", ".optbuild-folder"]

    project.write("build/chain/out/notes.txt", "a user's notes")
    run = project.cli("build")  # restores into the folders it finds, and records them
    assert run.returncode == 1 and (build / ".optbuild-folder").is_file()
    assert f"did not write {build / 'chain/out/notes.txt'} there" in run.stderr  # its outputs are in the cache
    (build / "chain/out/notes.txt").unlink()
    assert project.cli("build").returncode == 0
    run = project.cli("clean")
    assert run.returncode == 0 and run.stdout.splitlines() == [f"removed {build}"]


@pytest.mark.parametrize("holds, taken", [
    ([], True),
    ([".optbuild/server.log"], True),  # the build server's log, written before the first build
    ([".optbuild/noop.json", "Work/src/data.txt"], True),  # an earlier optbuild's
    ([".logs/Work/src.log", "Work/src/data.txt"], True),  # an earlier optbuild's, after a failure
    (["Work/thesis.txt"], False),  # named like a recipe, but nothing says a build made it
    ([".optbuild/server.log", ".lockfile.lock", "Photos/cat.jpg"], False),
    ([".logs/Work/src.log", "Work/src/data.txt", "Photos/cat.jpg"], False),
])
def test_which_existing_folders_a_build_takes(tmp_path, holds, taken):
    folder = tmp_path / "Documents"
    folder.mkdir()
    for rel in holds:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text("x")
    if taken:
        take_build_folder(folder, ["Work"])
        assert (folder / MARKER).is_file()
    else:
        with pytest.raises(OptbuildError, match=f"the build folder {folder} already exists and optbuild did not make"):
            take_build_folder(folder, ["Work"])
        assert not (folder / MARKER).exists()


def test_records_are_never_written_through_a_link_out_of_the_build_folder(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    assert project.build().ok
    state = project.root / "build/.optbuild"
    shutil.rmtree(state)
    state.symlink_to(outside)
    project.write("data/input.txt", "changed: every step builds again")

    error = project.build().outcomes["chain:src"].error
    assert f"refusing to write the record of chain/src through {state}: it is a symbolic link" in error
    assert list(outside.iterdir()) == []


def test_a_failed_steps_log_never_replaces_a_file_optbuild_did_not_write(project):
    project.write("recipes/bad.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
                  '[steps.boom]\nkind = "join"\ninput = "src"\nfail = true\n')
    assert project.build().outcomes["bad:boom"].status == "failed"  # makes the build folder
    log = project.root / "build/.logs/bad/boom.log"
    log.unlink()
    log.write_text("a user's file where the log goes")

    error = project.build(retry_failed=True).outcomes["bad:boom"].error
    assert f"the full log was not kept: optbuild did not write the {log} that is there (move it away)" in error
    assert log.read_text() == "a user's file where the log goes"
