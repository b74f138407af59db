"""optbuild deploy (issue 30, items 2-5): it never writes or deletes outside --to, what Triton
serves is consistent after a publish or rollback killed at any point and a rerun repairs it,
one repository takes several publishers without one silently replacing another's model, and
every file it is handed is bounded.

A kill "at a point" runs the publish in a child process whose named function ends the process
(os._exit) on its n-th call: the state on disk is exactly what a SIGKILL there leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugins.steps import tiny_onnx
from test_publish import assert_consistent, deploy_project, release, served

from optbuild.app import publish
from optbuild.app.publish import Release, problems, served_config, served_version
from optbuild.common.errors import OptbuildError

KILLED_AT = """\
import os, sys
from pathlib import Path
from optbuild.app import publish
action, folder, repo, name, nth = sys.argv[1:6]
real, calls = getattr(publish, name), []
def dies(*args, **kwargs):
    calls.append(1)
    if len(calls) == int(nth):
        os._exit(9)
    return real(*args, **kwargs)
setattr(publish, name, dies)
if action == "publish":
    publish.publish(publish.Release("net", Path(folder), {"step": "net:serve", "key": folder}), Path(repo), 3)
else:
    publish.rollback(Path(repo), "net")
"""


def killed(action: str, folder: Path | None, repo: Path, at: str, nth: int = 1) -> None:
    """Run a publish of ``folder`` (or a rollback) that dies on the ``nth`` call of ``at``."""
    run = subprocess.run([sys.executable, "-c", KILLED_AT, action, str(folder), str(repo), at, str(nth)], check=False)
    assert run.returncode == 9, f"the {action} finished before {at} call {nth}"


def put(folder: Path, repo: Path, step: str = "net:serve", keep: int = 3, replace: bool = False):
    return publish.publish(Release("net", folder, {"step": step, "key": str(folder)}), repo, keep, replace=replace)


def three_releases(tmp_path: Path) -> list[Path]:
    return [release(tmp_path / f"r{i}", 1 << 20, f'name: "net" max_batch_size: {i}\n') for i in (1, 2, 3)]


def outside_with_versions(root: Path) -> dict[str, bytes]:
    """A folder outside the repository that looks like a model's: 1, 2, 3 with a file each."""
    for n in ("1", "2", "3"):
        (root / n).mkdir(parents=True)
        (root / n / "keep.txt").write_text(f"mine {n}")
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --- item 2: never outside --to -------------------------------------------------------------

def test_a_symlinked_model_folder_is_refused_and_what_it_points_to_is_untouched(tmp_path):
    proj = deploy_project(tmp_path / "p")
    repo, outside = tmp_path / "models", tmp_path / "outside/keepme"
    kept = outside_with_versions(outside)
    repo.mkdir()
    (repo / "net").symlink_to("../outside/keepme")
    run = proj.cli("deploy", "--to", str(repo), "--keep", "1")
    assert run.returncode == 2
    assert f"refusing to publish into {repo / 'net'}: it is a symbolic link" in run.stderr
    assert files_under(outside) == kept and sorted(p.name for p in outside.iterdir()) == ["1", "2", "3"]
    assert proj.cli("deploy", "--to", str(repo), "--rollback", "net").returncode == 2
    assert files_under(outside) == kept


def test_a_symlinked_version_folder_is_refused_and_never_renamed_or_deleted(tmp_path):
    repo, outside = tmp_path / "models", tmp_path / "outside"
    kept = outside_with_versions(outside)
    first = release(tmp_path / "a", 1 << 20, 'name: "net"\n')
    put(first, repo)
    (repo / "net/9").symlink_to(outside / "3")
    with pytest.raises(OptbuildError, match="its version folder 9 is a symbolic link"):
        put(release(tmp_path / "b", 1 << 20, 'name: "net" max_batch_size: 2\n'), repo, keep=1)
    with pytest.raises(OptbuildError, match="its version folder 9 is a symbolic link"):
        publish.rollback(repo, "net")
    assert files_under(outside) == kept
    assert served(repo) == [".optbuild-highest", ".optbuild.lock", "1", "9", "config.pbtxt"]


def test_a_leftover_link_among_the_hidden_folders_is_unlinked_not_followed(tmp_path):
    repo, outside = tmp_path / "models", tmp_path / "outside"
    kept = outside_with_versions(outside)
    put(release(tmp_path / "a", 1 << 20, 'name: "net"\n'), repo)
    (repo / "net/.optbuild-old-0123456789ab").symlink_to(outside)  # what an older optbuild left
    put(release(tmp_path / "b", 1 << 20, 'name: "net" max_batch_size: 2\n'), repo)
    assert files_under(outside) == kept
    assert served(repo) == [".optbuild-highest", ".optbuild.lock", "1", "2", "config.pbtxt"]


@pytest.mark.parametrize("name", ["²", "٩", "01", "0"])
def test_a_version_folder_is_ascii_digits_without_a_leading_zero_and_others_are_left_alone(tmp_path, name):
    repo = tmp_path / "models"
    (repo / "net" / name).mkdir(parents=True)
    (repo / "net" / name / "theirs.txt").write_text("not optbuild's")
    assert put(release(tmp_path / "a", 1 << 20, 'name: "net"\n'), repo, keep=1).version == 1
    assert put(release(tmp_path / "b", 1 << 20, 'name: "net" max_batch_size: 2\n'), repo, keep=1).version == 2
    assert publish.versions(repo / "net") == [2]
    assert (repo / "net" / name / "theirs.txt").read_text() == "not optbuild's"


def test_a_rollback_of_a_model_that_is_not_there_creates_nothing(tmp_path):
    proj = deploy_project(tmp_path / "p")
    repo = tmp_path / "models"
    missing = proj.cli("deploy", "--to", str(repo), "--rollback", "nosuch")
    assert missing.returncode == 2 and "is not a model repository" in missing.stderr
    assert not repo.exists()
    repo.mkdir()
    nosuch = proj.cli("deploy", "--to", str(repo), "--rollback", "nosuch")
    assert nosuch.returncode == 2 and "has no model 'nosuch'" in nosuch.stderr
    assert list(repo.iterdir()) == []


# --- item 3: what Triton serves is consistent, a rerun repairs it ---------------------------

def test_a_publish_killed_after_its_version_appeared_serves_the_old_one_and_a_rerun_publishes(tmp_path):
    repo = tmp_path / "models"
    first, second, _ = three_releases(tmp_path)
    put(first, repo)
    killed("publish", second, repo, "_set_config", nth=2)  # 1: the repair's check, 2: the switch
    assert publish.versions(repo / "net") == [1, 2]  # version 2 renamed in ...
    assert served_version(repo / "net") == 1 and problems(repo / "net") == []  # ... but not served
    assert put(second, repo).what == "published"
    assert publish.versions(repo / "net") == [1, 3]  # 2 removed, its number not reused
    assert_consistent(repo)


def test_a_new_model_is_configured_before_its_first_version_appears(tmp_path):
    """Triton never finds the model's version without its configuration (it would make one up)."""
    repo = tmp_path / "models"
    first, _, _ = three_releases(tmp_path)
    killed("publish", first, repo, "_add_version")
    assert (repo / "net/config.pbtxt").read_text() == served_config((first / "config.pbtxt").read_text(), 1)
    assert publish.versions(repo / "net") == [] and problems(repo / "net") == []  # serves nothing, wrongly nothing
    assert put(first, repo).version == 2
    assert_consistent(repo)


def test_a_live_config_that_is_not_the_served_versions_is_repaired_by_a_rerun(tmp_path):
    repo = tmp_path / "models"
    first, second, _ = three_releases(tmp_path)
    put(first, repo)
    put(second, repo)
    (repo / "net/config.pbtxt").write_text((first / "config.pbtxt").read_text())  # an older optbuild's kill
    assert problems(repo / "net") != []
    again = put(second, repo)
    assert (again.what, again.version) == ("repaired", 2)
    assert_consistent(repo)
    assert put(second, repo).what == "unchanged"


@pytest.mark.parametrize(("at", "nth"), [("write_atomic", 1), ("_set_config", 2), ("_remove", 1)])
def test_a_rollback_killed_at_any_point_is_finished_by_its_retry_not_done_twice(tmp_path, at, nth):
    repo = tmp_path / "models"
    for folder in three_releases(tmp_path):
        put(folder, repo)
    killed("rollback", None, repo, at, nth)  # intent written / config switched / version 3 not yet removed
    assert problems(repo / "net") == []
    back = publish.rollback(repo, "net")
    assert (back.version, back.what, back.previous) == (2, "rolled back", 3)
    assert publish.versions(repo / "net") == [1, 2] and served_version(repo / "net") == 2
    assert_consistent(repo)
    assert not (repo / "net" / publish.INTENT).exists()


def test_a_publish_after_a_killed_rollback_finishes_it_first(tmp_path):
    repo = tmp_path / "models"
    first, second, third = three_releases(tmp_path)
    put(first, repo)
    put(second, repo)
    killed("rollback", None, repo, "_remove")
    assert put(third, repo).version == 3  # 2 rolled back, then 3 published (numbers never reused)
    assert publish.versions(repo / "net") == [1, 3]
    assert_consistent(repo)


# --- item 4: several publishers --------------------------------------------------------------

def test_a_version_number_is_never_reused_even_after_a_rollback(tmp_path):
    repo = tmp_path / "models"
    first, second, third = three_releases(tmp_path)
    put(first, repo)
    put(second, repo)
    assert publish.rollback(repo, "net").version == 1
    assert put(third, repo).version == 3
    assert put(second, repo).version == 4


def test_another_steps_model_is_refused_naming_both_unless_replace(tmp_path):
    repo = tmp_path / "models"
    first, second, _ = three_releases(tmp_path)
    put(first, repo, step="cnn:serve")
    with pytest.raises(OptbuildError, match=r"published by step cnn:serve; other:serve publishes another model"):
        put(second, repo, step="other:serve")
    assert served_version(repo / "net") == 1
    replaced = put(second, repo, step="other:serve", replace=True)
    assert (replaced.version, replaced.previous, replaced.step) == (2, 1, "other:serve")
    assert_consistent(repo)


def test_deploy_json_and_a_model_name_two_steps_publish_is_reported_by_plan_before_a_build(tmp_path):
    proj = deploy_project(tmp_path / "p")
    repo = tmp_path / "models"
    run = proj.cli("deploy", "--to", str(repo), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"ok": True, "to": str(repo), "changes": [
        {"model": "net", "what": "published", "version": 1, "previous": None, "step": "net:serve"}]}
    proj.write("recipes/other.toml", '[steps.src]\nkind = "onnx"\npath = "other.onnx"\n\n'
               '[steps.serve]\nkind = "deploy"\ninput = "src"\nmodel_name = "net"\n')
    tiny_onnx(proj.root / "recipes/other.onnx", dims=["batch", 7])  # a model that takes other inputs
    plan = proj.cli("plan")
    assert "warning: deploy steps net:serve, other:serve all publish model 'net'" in plan.stderr
    both = proj.cli("deploy", "--to", str(repo))
    assert both.returncode == 2 and "net:serve, other:serve all publish model 'net'" in both.stderr
    assert not (proj.root / "build/other").exists()  # refused before anything built
    alone = proj.cli("deploy", "other", "--to", str(repo))
    assert alone.returncode == 2
    assert "published by step net:serve; other:serve publishes another model under the name 'net'" in alone.stderr
    replaced = proj.cli("deploy", "other", "--to", str(repo), "--replace")
    assert replaced.returncode == 0 and "net: published, version 2" in replaced.stdout


# --- item 5: bounded inputs ------------------------------------------------------------------

@pytest.mark.parametrize(("content", "message"), [
    ("[]", "holds a JSON list, not a fingerprint's fields"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    ("{" + '"a": {' * 200 + "}" * 201, "nested deeper than"),
    ("not json", "is not JSON"),
])
def test_a_fingerprint_file_that_is_not_one_is_one_clean_error(tmp_path, content, message):
    proj = deploy_project(tmp_path / "p")
    (tmp_path / "fp.json").write_text(content)
    run = proj.cli("deploy", "--to", str(tmp_path / "models"), "--fingerprint", str(tmp_path / "fp.json"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"--fingerprint {tmp_path / 'fp.json'}: not a fingerprint: " in run.stderr and message in run.stderr


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "huge"])
def test_a_fingerprint_path_that_is_no_regular_file_or_too_large_fails_at_once(tmp_path, kind):
    proj = deploy_project(tmp_path / "p")
    path = tmp_path / "fp.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text('{"a": "' + "x" * (2 << 20) + '"}')
    else:
        path = Path(kind)
    run = proj.cli("deploy", "--to", str(tmp_path / "models"), "--fingerprint", str(path), timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert ("is larger than" if kind == "huge" else "is not a regular file") in run.stderr


PUBLISH_BOTH = """\
import sys
from pathlib import Path
from optbuild.app import publish
small, big, repo = map(Path, sys.argv[1:4])
publish.publish(publish.Release("net", small, {"step": "net:serve"}), repo, 2)
try:
    publish.publish(publish.Release("net", big, {"step": "net:serve"}), repo, 2)
except Exception as exc:
    print(type(exc).__name__, exc)
print([p.name for p in (repo / "net").iterdir() if p.name.startswith(".optbuild-tmp")],
      publish.served_version(repo / "net"), publish.problems(repo / "net"))
"""


def test_a_full_repository_disk_names_its_file_system_and_leaves_the_served_version(tmp_path):
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("needs a user namespace to mount a small file system (unshare -rm)")
    repo = tmp_path / "models"
    repo.mkdir()
    small = release(tmp_path / "small", 1 << 20, 'name: "net"\n')
    big = release(tmp_path / "big", 4 << 20, 'name: "net" max_batch_size: 2\n')
    (tmp_path / "both.py").write_text(PUBLISH_BOTH)
    script = f"mount -t tmpfs -o size=2m none {repo} && {sys.executable} {tmp_path / 'both.py'} {small} {big} {repo}"
    run = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(Path(publish.__file__).parents[2])})
    assert run.returncode == 0, run.stderr
    assert f"DiskFullError no space left on device writing in {repo}/net (file system of {repo}, " in run.stdout
    assert "version 2 of net was not published; version 1 is still served" in run.stdout
    assert run.stdout.endswith("[] 1 []\n")  # no leftover; version 1 served, consistent


def test_a_served_config_pins_the_version_triton_loads(tmp_path):
    """Triton's own schema reads the published config.pbtxt: the step's config, with the
    version it serves (it ignores every other version folder)."""
    from google.protobuf import text_format

    from optbuild.steps.triton_schema import model_config_class

    config = text_format.Parse(served_config('name: "net"\nmax_batch_size: 4\n', 7), model_config_class()())
    assert (config.name, config.max_batch_size, list(config.version_policy.specific.versions)) == ("net", 4, [7])


def test_a_refused_model_refuses_the_whole_deploy_before_any_model_is_published(tmp_path):
    proj = deploy_project(tmp_path / "p")
    proj.write("recipes/other.toml", '[steps.src]\nkind = "onnx"\npath = "other.onnx"\n\n'
               '[steps.serve]\nkind = "deploy"\ninput = "src"\n')
    tiny_onnx(proj.root / "recipes/other.onnx", dims=["batch", 7])
    repo = tmp_path / "models"
    publish.publish(Release("other", release(tmp_path / "theirs", 1 << 20, 'name: "other"\n'),
                            {"step": "their:serve"}), repo, 2)
    run = proj.cli("deploy", "--to", str(repo))
    assert run.returncode == 2 and "published by step their:serve; other:serve publishes" in run.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["other"]  # net not published either
