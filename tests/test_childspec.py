"""The scheduler and a step's process talk through typed messages (optbuild.process.spec):
the spec round-trips, and whatever a worker leaves behind (nothing, a crash, garbage) is a
clear step failure, never an exception out of the build."""

from __future__ import annotations

import ast
import json
import re
import stat
import sys
import textwrap
from pathlib import Path

import pytest

import optbuild.process.spec
from optbuild.builder.status import Status
from optbuild.process.runstep import read_result
from optbuild.process.spec import ArtifactSpec, ChildResult, ChildResultError, ChildSpec


def make_spec() -> ChildSpec:
    return ChildSpec(
        implementation="kinds.py:Join", step_id="chain:mid", params={"suffix": "-mid", "sleep": 0.5, "n": [1, 2]},
        base_dir="/p/recipes", project_root="/p",
        inputs={"input": ArtifactSpec(step="chain:src", dir="/p/build/chain/src",
                                      files={"data.txt": "/p/build/chain/src/data.txt"},
                                      primary="/p/build/chain/src/data.txt"),
                "other": ArtifactSpec(step="chain:side", dir="/d", files={})},
        out_dir="/tmp/x/out", result="/tmp/x/result.json", parent_pid=1234, state_dir=None)


def test_the_worker_spec_round_trips_through_json():
    spec = make_spec()
    assert ChildSpec.from_json(spec.to_json()) == spec
    assert ChildSpec.from_json(spec.to_json().encode()) == spec
    doc = json.loads(spec.to_json())  # the file a worker reads: plain JSON, nothing pickled
    assert doc["inputs"]["input"]["files"] == {"data.txt": "/p/build/chain/src/data.txt"}


@pytest.mark.parametrize("result", [
    ChildResult(ok=True, metrics={"size": 3, "ratio": 0.5}, run_s=1.25),
    ChildResult(ok=False, error="asked to fail", expected=True, repeats=True),
    ChildResult(ok=False, error="MemoryError: ", repeats=False),
])
def test_a_worker_result_round_trips_through_json(result):
    assert ChildResult.from_json(result.to_json()) == result


def test_metrics_json_cannot_hold_are_written_as_text():
    text = ChildResult(ok=True, metrics={"path": Path("/a/b")}).to_json()
    assert ChildResult.from_json(text).metrics == {"path": "/a/b"}


def test_the_padding_of_a_reserved_result_file_is_accepted():
    text = ChildResult(ok=True).to_json() + " " * 4096  # see optbuild.process.child's RESULT_RESERVE
    assert ChildResult.from_json(text).ok


@pytest.mark.parametrize(("data", "why"), [
    (b"", "not JSON"),
    (b"\xff\xfe garbage", "not JSON"),
    (b'{"ok": true', "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (b"[true]", "a JSON list, not an object"),
    (b"{}", "'ok' is missing"),
    (b'{"ok": "yes"}', "'ok' is missing or not true/false"),
    (b'{"ok": true, "metrics": 3}', "its 'metrics' is not an object but 3"),
    (b'{"ok": false, "error": ["x"]}', 'its \'error\' is not text but ["x"]'),
    (b'{"ok": true, "run_s": true}', "its 'run_s' is not a number but true"),
    (b'{"ok": true, "surprise": 1}', "unknown field 'surprise'"),
])
def test_garbage_is_not_a_worker_result(data, why):
    with pytest.raises(ChildResultError, match=re.escape(why)):
        ChildResult.from_json(data)


def test_read_result_turns_every_bad_ending_into_a_failed_result(tmp_path):
    path = tmp_path / "result.json"
    died = read_result(path, -6, tmp_path)
    assert not died.ok and died.error == "step process died (signal 6)" and not died.repeats
    assert read_result(path, 0, tmp_path).error == "step process died (exit code 0)"  # no result file
    path.write_text("garbage")
    garbage = read_result(path, 0, tmp_path)
    assert not garbage.ok and not garbage.expected and not garbage.repeats
    assert garbage.error.startswith("step process left an unreadable result (it is not JSON")
    path.write_text(ChildResult(ok=True, metrics={"n": 1}).to_json())
    assert read_result(path, 0, tmp_path) == ChildResult(ok=True, metrics={"n": 1})


def test_a_worker_that_writes_garbage_fails_its_step_clearly_and_is_not_remembered(project, tmp_path, monkeypatch):
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""\
        import json, sys
        spec = json.load(open(sys.argv[-1]))
        print("the worker is confused")
        open(spec["result"], "w").write('{"ok": "certainly"}')
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", str(fake))
        result = project.build(["chain:src"])
    outcome = result.outcomes["chain:src"]
    assert not result.ok and outcome.status == Status.FAILED
    assert "step process left an unreadable result (its 'ok' is missing or not true/false)" in outcome.error
    assert "the worker is confused" in outcome.error  # the log tail, as for a crash
    assert project.build(["chain:src"]).outcomes["chain:src"].status == Status.BUILT  # not remembered


def test_the_worker_spec_module_stays_light():
    """The worker imports it before anything else: standard library only."""
    tree = ast.parse(Path(optbuild.process.spec.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert all(m.split(".")[0] in sys.stdlib_module_names or m == "__future__" for m in modules), modules
