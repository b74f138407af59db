"""`optbuild diff [REV|LOCKFILE]` says, per step, what differs between the project's lock
file and the one at a git revision (HEAD by default) or another lock file: parameters,
tools, host fields, metrics, and the key and output digests that follow from them; the
steps that did not change are counted in one line. `--json` prints the same as a document."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from plugins.projects import CONFIG, PIPELINE, ProjectDir

from optbuild.builder import lockfile

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV})
    return proc.stdout.strip()


def _project(root) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/chain.toml", PIPELINE)
    return proj


def _built(proj: ProjectDir) -> ProjectDir:
    assert proj.build().ok
    return proj


def _change_mid_and_side(proj: ProjectDir) -> None:
    """mid's suffix changes (its key and output too, and so out's input); side joins a
    second input, so its metric `parts` goes from 1 to 2."""
    recipe = proj.read("recipes/chain.toml").replace('suffix = "-mid"', 'suffix = "-MID"')
    proj.write("recipes/chain.toml", recipe.replace('suffix = "-side"', 'suffix = "-side"\nother = "src"'))


def _committed(tmp_path) -> ProjectDir:
    """A git repository whose subfolder proj/ is a project, built, its lock file committed."""
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("build/\ncache/\n")
    proj = _built(_project(tmp_path / "proj"))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "built")
    return proj


def _lock(proj: ProjectDir) -> dict:
    return json.loads(proj.read("optbuild.lock"))


def test_diff_against_a_git_revision_shows_each_changed_step(tmp_path):
    proj = _committed(tmp_path)
    _change_mid_and_side(proj)
    _built(proj)
    run = proj.cli("diff", "HEAD")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    sha = git(tmp_path, "rev-parse", "--short=7", "HEAD")
    assert lines[:2] == [f"--- proj/optbuild.lock at HEAD ({sha})", "+++ optbuild.lock (working tree)"]
    mid = lines.index("~ chain:mid  (join)")
    assert lines[mid + 1].split() == ["param", "suffix", "-mid", "->", "-MID"]
    assert lines[mid + 2].split()[0] == "key"
    assert lines[mid + 3].split()[:2] == ["output", "data.txt"]
    records = _lock(proj)["steps"]
    assert records["chain:mid"]["key"][:12] in lines[mid + 2]  # digests shortened
    assert records["chain:mid"]["key"] not in run.stdout
    out = lines.index("~ chain:out  (join)")  # its input (mid's output) changed, not its params
    assert [line.split()[0] for line in lines[out + 1:out + 4]] == ["input", "key", "output"]
    assert lines[out + 1].split()[1] == "input.data.txt"  # field `input`, output data.txt
    side = lines.index("~ chain:side  (join)")
    assert ["metric", "parts", "1", "->", "2"] in [line.split() for line in lines[side + 1:]]
    src = records["chain:src"]["outputs"]["data.txt"][:12]  # a new input: upstream steps are content
    assert ["input", "other.data.txt", "(none)", "->", src] in [line.split() for line in lines[side + 1:]]
    assert lines[-1] == "1 step unchanged"  # src
    assert "chain:src" not in run.stdout
    assert proj.cli("diff").stdout == run.stdout  # HEAD is the default


def test_json_output(tmp_path):
    proj = _committed(tmp_path)
    _change_mid_and_side(proj)
    _built(proj)
    run = proj.cli("diff", "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["format"] == 1
    assert doc["base"] == {"git": "HEAD", "commit": git(tmp_path, "rev-parse", "HEAD"), "path": "proj/optbuild.lock"}
    assert doc["differs"] is True
    assert doc["unchanged"] == ["chain:src"]
    assert sorted(doc["steps"]) == ["chain:mid", "chain:out", "chain:side"]
    mid = doc["steps"]["chain:mid"]
    assert mid["status"] == "changed" and mid["kind"] == "join"
    assert mid["changes"][0] == {"what": "param", "name": "suffix", "old": "-mid", "new": "-MID"}
    key = next(c for c in mid["changes"] if c["what"] == "key")
    assert key["new"] == _lock(proj)["steps"]["chain:mid"]["key"]  # full digests in JSON
    side = doc["steps"]["chain:side"]["changes"]
    assert {"what": "metric", "name": "parts", "old": 1, "new": 2} in side
    src = _lock(proj)["steps"]["chain:src"]["outputs"]["data.txt"]
    assert {"what": "input", "name": "other.data.txt", "new": src} in side  # absent before: no "old"


def test_diff_against_a_lock_file_outside_any_git_repository(tmp_path):
    proj = _built(_project(tmp_path / "proj"))
    shutil.copy(proj.root / "optbuild.lock", tmp_path / "before.lock")
    _change_mid_and_side(proj)
    _built(proj)
    run = proj.cli("diff", str(tmp_path / "before.lock"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"--- {tmp_path / 'before.lock'}"
    assert "~ chain:mid  (join)" in run.stdout and "-mid -> -MID" in run.stdout
    relative = proj.cli("diff", "../before.lock")  # a relative path: from the current folder
    assert relative.stdout.splitlines()[1:] == run.stdout.splitlines()[1:]


def test_a_step_added_and_a_step_removed(tmp_path):
    proj = _built(_project(tmp_path / "proj"))
    shutil.copy(proj.root / "optbuild.lock", tmp_path / "four.lock")
    proj.write("recipes/chain.toml", PIPELINE + '\n[steps.extra]\nkind = "join"\ninput = "out"\n')
    _built(proj)
    run = proj.cli("diff", str(tmp_path / "four.lock"))
    assert run.stdout.splitlines()[2:] == ["+ chain:extra  (join)  added", "4 steps unchanged"]
    shutil.copy(proj.root / "optbuild.lock", tmp_path / "five.lock")
    proj.write("recipes/chain.toml", PIPELINE)
    (proj.root / "optbuild.lock").unlink()  # the lock keeps records of removed steps: start anew
    _built(proj)
    run = proj.cli("diff", str(tmp_path / "five.lock"), "--json")
    doc = json.loads(run.stdout)
    assert doc["steps"] == {"chain:extra": {"status": "removed", "kind": "join",
                                            "key": json.loads((tmp_path / "five.lock").read_text())
                                            ["steps"]["chain:extra"]["key"]}}
    assert "- chain:extra  (join)  removed" in proj.cli("diff", str(tmp_path / "five.lock")).stdout


def test_no_differences(tmp_path):
    proj = _built(_project(tmp_path / "proj"))
    shutil.copy(proj.root / "optbuild.lock", tmp_path / "same.lock")
    run = proj.cli("diff", str(tmp_path / "same.lock"), "--exit-code")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[2:] == ["no differences (4 steps)"]
    assert json.loads(proj.cli("diff", str(tmp_path / "same.lock"), "--json").stdout)["steps"] == {}


def test_exit_code_says_whether_something_differs(tmp_path):
    proj = _built(_project(tmp_path / "proj"))
    shutil.copy(proj.root / "optbuild.lock", tmp_path / "before.lock")
    _change_mid_and_side(proj)
    _built(proj)
    assert proj.cli("diff", str(tmp_path / "before.lock")).returncode == 0  # as `git diff`
    assert proj.cli("diff", str(tmp_path / "before.lock"), "--exit-code").returncode == 1


def test_a_lock_file_written_before_metrics_were_recorded_still_diffs(tmp_path):
    proj = _built(_project(tmp_path / "proj"))
    old = _lock(proj)
    for record in old["steps"].values():
        del record["metrics"]
    (tmp_path / "old.lock").write_text(json.dumps(old))
    _change_mid_and_side(proj)
    _built(proj)
    doc = json.loads(proj.cli("diff", str(tmp_path / "old.lock"), "--json").stdout)
    whats = {c["what"] for step in doc["steps"].values() for c in step["changes"]}
    assert "metric" not in whats  # unknown before, not absent
    assert {"param", "key", "output", "input"} <= whats


def test_errors(tmp_path):
    proj = _built(_project(tmp_path / "proj"))
    run = proj.cli("diff")
    assert run.returncode == 2
    assert run.stderr == f"error: {proj.root} is not in a git repository: name a lock file to compare " \
                         "with instead (optbuild diff PATH)\n"
    (tmp_path / "damaged.lock").write_text('{"format": 1, "steps": ')
    run = proj.cli("diff", str(tmp_path / "damaged.lock"))
    assert run.returncode == 2
    assert run.stderr.startswith(f"error: {tmp_path / 'damaged.lock'} is damaged: not valid JSON:")

    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "nothing yet")
    run = proj.cli("diff", "no-such-rev")
    assert (run.returncode, run.stderr) == (2, "error: unknown revision 'no-such-rev' (and no file of that name)\n")
    run = proj.cli("diff")
    sha = git(tmp_path, "rev-parse", "--short=7", "HEAD")
    assert run.returncode == 2
    assert run.stderr == f"error: proj/optbuild.lock is not in HEAD ({sha}): no lock file was committed there\n"
    (proj.root / "optbuild.lock").rename(tmp_path / "kept.lock")
    proj.write("optbuild.lock", "not json")
    git(tmp_path, "add", "proj/optbuild.lock")
    git(tmp_path, "commit", "-qm", "damaged")
    (tmp_path / "kept.lock").rename(proj.root / "optbuild.lock")
    run = proj.cli("diff", "HEAD")
    assert run.returncode == 2
    assert run.stderr.startswith(f"error: proj/optbuild.lock at HEAD ({git(tmp_path, 'rev-parse', '--short=7', 'HEAD')})"
                                 " is damaged: not valid JSON:")


def test_the_lock_keeps_small_metrics_only():
    metrics = {"cosine": 0.9991, "ok": True, "n": 3, "none": None, "nan": float("nan"), "shape": [1, 3, 224],
               "long": "x" * 1000, "nested": {"a": 1}, "big": list(range(100)), "deep": [[1]]}
    assert lockfile.record_metrics(metrics) == {"cosine": 0.9991, "ok": True, "n": 3, "none": None,
                                                "nan": "nan", "shape": [1, 3, 224]}
    assert len(lockfile.record_metrics({f"m{i:03}": i for i in range(1000)})) == lockfile.MAX_METRICS
