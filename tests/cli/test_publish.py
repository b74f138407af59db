"""optbuild deploy --to DIR (issue 25, item 2): deploy steps published into a Triton model
repository so that a server sees the old version or the new one, never a mix: a killed publish
leaves the old version current, two publishes at once end consistent, a rollback restores the
previous version and its configuration, and a rerun with nothing changed touches nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from plugins.projects import ProjectDir
from plugins.steps import tiny_onnx

from optbuild.app.publish import problems, served_config
from optbuild.common.digest import hash_file

RECIPE = '[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n[steps.serve]\nkind = "deploy"\ninput = "src"\n'
PUBLISH = ("import sys; from pathlib import Path; from optbuild.app.publish import Release, publish; "
           "publish(Release('net', Path(sys.argv[1]), {'step': 'net:serve', 'key': sys.argv[1]}), Path(sys.argv[2]), 2)")


def deploy_project(root: Path) -> ProjectDir:
    proj = ProjectDir(root)
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n[build]\njobs = 1\n')
    proj.write("recipes/net.toml", RECIPE)
    tiny_onnx(proj.root / "recipes/net.onnx", dims=["batch", 4])
    return proj


def snapshot(folder: Path) -> dict[str, int]:
    """Every path under ``folder`` with its mtime (ns)."""
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in [folder, *folder.rglob("*")]}


def served(repo: Path, model: str = "net") -> list[str]:
    """The model's version folders, and any other entry, as a watching server would list them."""
    return sorted(p.name for p in (repo / model).iterdir())


def assert_consistent(repo: Path, model: str = "net") -> None:
    """Every version is whole (its files are those its optbuild.json lists) and config.pbtxt is
    the one the served version was published with, pinned to it."""
    numbers = sorted(int(p.name) for p in (repo / model).iterdir() if p.name.isdigit())
    for number in numbers:
        version = repo / model / str(number)
        record = json.loads((version / "optbuild.json").read_text())
        files = {p.name: hash_file(p)[0] for p in version.iterdir() if p.name != "optbuild.json"}
        assert files == record["files"], number
    assert problems(repo / model) == []


def test_a_deploy_step_is_published_with_what_was_used_and_a_rerun_touches_nothing(tmp_path):
    proj = deploy_project(tmp_path / "p")
    repo = tmp_path / "models"
    first = proj.cli("deploy", "--to", str(repo))
    assert first.returncode == 0, first.stderr
    assert "net: published, version 1" in first.stdout
    assert served(repo) == [".optbuild-highest", ".optbuild.lock", "1", "config.pbtxt"]
    assert sorted(p.name for p in (repo / "net/1").iterdir()) == ["model.onnx", "optbuild.json"]
    assert (repo / "net/config.pbtxt").read_text().endswith("\nversion_policy { specific { versions: 1 } }\n")
    record = json.loads((repo / "net/1/optbuild.json").read_text())
    assert record["step"] == "net:serve" and record["from"] == "built here" and len(record["key"]) > 32
    assert record["inputs"]["input"]["step"] == "net:src" and record["inputs"]["input"]["built_on"]
    before = snapshot(repo)
    again = proj.cli("deploy", "--to", str(repo))
    assert again.returncode == 0 and "net: unchanged, version 1" in again.stdout
    assert snapshot(repo) == before


def test_a_new_model_is_a_new_version_older_ones_beyond_keep_go_and_a_rollback_restores_one(tmp_path):
    proj = deploy_project(tmp_path / "p")
    repo = tmp_path / "models"
    configs = []
    for width in (4, 5, 6):
        tiny_onnx(proj.root / "recipes/net.onnx", dims=["batch", width])
        assert proj.cli("deploy", "--to", str(repo), "--keep", "2").returncode == 0
        configs.append((repo / "net/config.pbtxt").read_text())
        assert_consistent(repo)
    assert served(repo) == [".optbuild-highest", ".optbuild.lock", "2", "3", "config.pbtxt"]
    assert "dims: 6" in configs[2]
    back = proj.cli("deploy", "--to", str(repo), "--rollback", "net")
    assert back.returncode == 0 and "net: rolled back to version 2" in back.stdout
    assert served(repo) == [".optbuild-highest", ".optbuild.lock", "2", "config.pbtxt"]
    assert (repo / "net/config.pbtxt").read_text() == configs[1]
    nothing = proj.cli("deploy", "--to", str(repo), "--rollback", "net")
    assert nothing.returncode == 2 and "nothing to roll back to" in nothing.stderr


def release(folder: Path, size: int, config: str) -> Path:
    """A deploy step's output as publish reads it: <folder>/net/1/model.onnx and config.pbtxt."""
    (folder / "1").mkdir(parents=True)
    with open(folder / "1/model.onnx", "wb") as f:
        f.writelines(os.urandom(1 << 20) for _ in range(size >> 20))
    (folder / "config.pbtxt").write_text(config)
    return folder


def test_a_publish_killed_in_the_middle_leaves_the_old_version_current(tmp_path):
    repo = tmp_path / "models"
    old = release(tmp_path / "old", 1 << 20, 'name: "net"\n')
    subprocess.run([sys.executable, "-c", PUBLISH, str(old), str(repo)], check=True)
    before = snapshot(repo / "net/1")
    new = release(tmp_path / "new", 256 << 20, 'name: "net" max_batch_size: 4\n')
    proc = subprocess.Popen([sys.executable, "-c", PUBLISH, str(new), str(repo)])
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".optbuild-tmp-") for p in (repo / "net").iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the publish ended before it was killed"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    numbers = [p for p in served(repo) if p.isdigit()]
    assert numbers == ["1"] and snapshot(repo / "net/1") == before
    assert (repo / "net/config.pbtxt").read_text() == served_config('name: "net"\n', 1)
    subprocess.run([sys.executable, "-c", PUBLISH, str(new), str(repo)], check=True)
    # the leftover swept; version 2 was taken by the killed publish and is never reused
    assert served(repo) == [".optbuild-highest", ".optbuild.lock", "1", "3", "config.pbtxt"]
    assert_consistent(repo)


def test_two_publishes_at_once_end_in_a_consistent_repository(tmp_path):
    repo = tmp_path / "models"
    a = release(tmp_path / "a", 64 << 20, 'name: "net"\n')
    b = release(tmp_path / "b", 64 << 20, 'name: "net" max_batch_size: 2\n')
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISH, str(r), str(repo)]) for r in (a, b, a, b)]
    assert [p.wait() for p in procs] == [0, 0, 0, 0]
    # each publish made a version or found its own current; keep 2: the last two, a and b
    numbers = [p for p in served(repo) if p.isdigit()]
    assert len(numbers) == 2 and served(repo) == [".optbuild-highest", ".optbuild.lock", *numbers, "config.pbtxt"]
    assert int(numbers[1]) == int(numbers[0]) + 1
    assert_consistent(repo)
    keys = {json.loads((repo / "net" / n / "optbuild.json").read_text())["key"] for n in numbers}
    assert keys == {str(a), str(b)}
