"""The dask executor's configuration and the task's handling of what it is sent: no cluster
needed (fast)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from daskfarm import make_project

from optbuild import api
from optbuild.builder.report import Reporter
from optbuild.common.digest import digest_bytes
from optbuild.common.errors import OptbuildError
from optbuild.distributed.task import run_on

pytestmark = pytest.mark.timeout(30)

SMALL = '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'


def build(proj):
    ws = api.open_workspace(proj.root)
    try:
        return api.build(ws, reporter=Reporter())
    finally:
        ws.close()


def free_address() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"tcp://127.0.0.1:{port}"


def test_executor_settings_are_validated_where_they_are_written(tmp_path):
    proj = make_project(tmp_path / "p", build='executor = "dusk"\nscheduler = "127.0.0.1:8786"\n', recipe=SMALL)
    problems = "\n".join(proj.problems())
    assert "optbuild.toml:11: build.executor: Input should be 'local', 'dask' or 'auto'" in problems
    assert "optbuild.toml:12: build.scheduler: '127.0.0.1:8786' is not a Dask scheduler address (expected tcp://HOST:PORT)" in problems


def test_the_dask_executor_needs_a_scheduler_and_a_remote_cache(tmp_path, file_remote):
    proj = make_project(tmp_path / "p", build='executor = "dask"\n', remote=file_remote.section(), recipe=SMALL)
    with pytest.raises(OptbuildError, match=r"--scheduler tcp://HOST:PORT, or \[build\] scheduler in"):
        build(proj)
    proj = make_project(tmp_path / "q", build=f'executor = "dask"\nscheduler = "{free_address()}"\n', recipe=SMALL)
    with pytest.raises(OptbuildError, match=r"needs a remote cache \(\[remote\] url"):
        build(proj)
    assert not (proj.root / "build" / "farm").exists()  # nothing built (the folder's own marker aside)


def test_an_unreachable_scheduler_is_a_clear_error(tmp_path, file_remote, monkeypatch):
    from optbuild.distributed import builder

    monkeypatch.setattr(builder, "CONNECT_TIMEOUT_S", 1)
    address = free_address()
    proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{address}"\n',
                        remote=file_remote.section(), recipe=SMALL)
    with pytest.raises(OptbuildError, match=f"cannot reach the Dask scheduler at {address}"):
        build(proj)
    # a plan still works: it warns, and plans for this host
    ws = api.open_workspace(proj.root)
    try:
        plan = api.build(ws, reporter=Reporter(), dry_run=True)
    finally:
        ws.close()
    assert plan.steps("would-build") == ["farm:src"]
    assert any("cannot reach the Dask scheduler" in e.get("message", "") for e in plan.reporter.events)


def test_a_tls_scheduler_without_dask_s_tls_settings_is_a_clear_error(tmp_path, file_remote):
    proj = make_project(tmp_path / "p", build='executor = "dask"\nscheduler = "tls://127.0.0.1:1"\n',
                        remote=file_remote.section(), recipe=SMALL)
    with pytest.raises(OptbuildError, match=r"tls://127.0.0.1:1 is a TLS address, and Dask's configuration gives "
                                            r"this host no certificate: set distributed.comm.tls.ca-file, "
                                            r"distributed.comm.tls.client.cert"):
        build(proj)


def test_with_executor_auto_an_unreachable_scheduler_means_a_build_on_this_host(tmp_path, file_remote, monkeypatch):
    from optbuild.distributed import builder

    monkeypatch.setattr(builder, "CONNECT_TIMEOUT_S", 1)
    address = free_address()
    proj = make_project(tmp_path / "p", build=f'executor = "auto"\nscheduler = "{address}"\n',
                        remote=file_remote.section(), recipe=SMALL)
    result = build(proj)
    assert result.ok and result.steps("built") == ["farm:src"]
    (warning,) = [e["message"] for e in result.reporter.events if e.get("event") == "warning"]
    assert warning.startswith(f"cannot reach the Dask scheduler at {address}")
    assert warning.endswith("building on this host (--executor auto)")


def test_the_command_line_names_the_executor_and_the_scheduler(tmp_path, file_remote, monkeypatch):
    from optbuild.cli import main
    from optbuild.distributed import builder

    monkeypatch.setattr(builder, "CONNECT_TIMEOUT_S", 1)
    proj = make_project(tmp_path / "p", build="", remote=file_remote.section(), recipe=SMALL)
    monkeypatch.chdir(proj.root)
    assert main(["build", "--scheduler", "127.0.0.1:1"]) == 2  # checked as [build] scheduler is
    assert main(["build", "--scheduler", free_address()]) == 2  # implies dask: unreachable is an error
    assert not (proj.root / "build" / "farm").exists()
    assert main(["build", "--executor", "auto", "--scheduler", free_address()]) == 0  # ... or local


def _node(remote, name: str = "n1", fields: dict | None = None, key_env: str | None = None):
    """A node's own configuration: its remote (and signing key, from its environment)."""
    from optbuild.distributed.nodeconfig import NodeConfig
    from optbuild.store.remote import RemoteStore

    return NodeConfig(name, fields or {"gpu.count": 0}, RemoteStore(remote.url, timeout_s=5, signing_key_env=key_env))


def _doc(remote, files=None, inputs=None, implementation="optbuild.steps.source:OnnxSource", base_dir="recipes",
         **material):
    """A task whose key is that of its key material (``material`` replaces parts of it)."""
    from optbuild.process.action import Action

    blob = b"hello"
    digest = digest_bytes(blob)
    remote.write(remote.blob_path(digest), blob)
    entry = {"digest": digest, "size": len(blob)}
    files = {name: entry for name in (files or ["data/input.txt"])}
    inputs = {field: {"step": "r:up", "key": digest_bytes(b"r:up"), "primary": None, "outputs": {name: entry}}
              for field, name in (inputs or {}).items()}
    ingredients = Action(kind="onnx", version="1", params={}, tools={}, host={}, files={name: digest for name in files},
                         inputs={field: {name: digest for name in up["outputs"]} for field, up in inputs.items()}
                         ).material() | material
    return {"key": Action.from_material(ingredients).key, "step": "r:s", "implementation": implementation, "base_dir": base_dir,
            "files": files, "inputs": inputs, "primary_output": "data.txt", "ingredients": ingredients,
            "remote": remote.url}


@pytest.mark.parametrize("doc", [
    {"files": ["../escaped.txt"]},
    {"files": ["/tmp/escaped.txt"]},
    {"inputs": {"input": "../../escaped.txt"}},
    {"implementation": "project:../escaped.py:Kind", "class": "../escaped.py:Kind"},
    {"base_dir": "../.."},
], ids=["file-dotdot", "file-absolute", "upstream-dotdot", "kind-outside", "base-outside"])
def test_a_task_never_writes_outside_its_scratch_folder(tmp_path, file_remote, monkeypatch, doc):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    result = run_on(_doc(file_remote, **doc), _node(file_remote))
    assert result["ok"] is False and result.get("infra") and "refusing" in result["error"], result
    assert not list(scratch.iterdir())  # the scratch folder went, and nothing beside it came
    assert not Path("/tmp/escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()


def test_a_task_refuses_a_blob_that_does_not_match_its_digest(tmp_path, file_remote):
    doc = _doc(file_remote)
    digest = doc["files"]["data/input.txt"]["digest"]
    file_remote.write(file_remote.blob_path(digest), b"HELLO")  # same size, other bytes
    result = run_on(doc, _node(file_remote))
    assert result["ok"] is False and "corrupt" in result["error"], result


def _forged(doc: dict, change) -> dict:
    """A copy of ``doc`` that ``change`` altered, its key kept: what anyone who reaches the
    scheduler can send."""
    forged = json.loads(json.dumps(doc))
    change(forged)
    return forged


def test_a_node_refuses_a_task_that_is_not_what_its_key_says(tmp_path, file_remote):
    other = b"other"
    file_remote.write(file_remote.blob_path(digest_bytes(other)), other)
    swap = {"digest": digest_bytes(other), "size": len(other)}
    doc = _doc(file_remote, inputs={"input": "model.onnx"})
    cases = {
        "other input bytes": (_forged(doc, lambda d: d["files"]["data/input.txt"].update(swap)),
                              "input file data/input.txt changed"),
        "other upstream bytes": (_forged(doc, lambda d: d["inputs"]["input"]["outputs"]["model.onnx"].update(swap)),
                                 "upstream output (input) changed"),
        "other key material": (_forged(doc, lambda d: d["ingredients"]["params"].update(opset=13)),
                               "its key is not that of its key material"),
        "another kind's code": (_forged(doc, lambda d: d.update(implementation="optbuild.steps.export:Export")),
                                "'onnx' is implemented by optbuild.steps.source:OnnxSource here"),
        "another class of the kind's file": (
            _forged(_doc(file_remote, implementation="project:kinds.py:Kind", **{"class": "kinds.py:Kind"}),
                    lambda d: d.update(implementation="project:kinds.py:Shadow")),
            "the task runs kinds.py:Shadow of the project, its key names kinds.py:Kind"),
        "a key made for another GPU": (_doc(file_remote, host={"gpu.count": 1}),
                                       "its key was made for another host (gpu.count = 1 in its key, 0 here)"),
        "an upstream whose entry is not in the remote": (
            doc, "the entry of its input input (r:up, key "),  # the node cannot check its main output
    }
    for what, (forged, why) in cases.items():
        result = run_on(forged, _node(file_remote))
        assert result["ok"] is False and result["node"] == "n1", what
        assert result["error"].startswith("refused: ") and why in result["error"], (what, result["error"])
        assert result["error"].endswith("nothing was built or stored"), what
    assert file_remote.keys() == []


def test_a_task_names_the_remote_it_expects_but_cannot_choose_it(tmp_path, file_remote, monkeypatch):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    doc = _doc(file_remote)
    result = run_on(_forged(doc, lambda d: d.update(remote=f"file://{elsewhere}")), _node(file_remote))
    assert result["ok"] is False and f"this node stores into the remote cache {file_remote.url}" in result["error"]
    assert not list(elsewhere.iterdir())
    # a build that wants signed entries: a node without a key of its own refuses, whatever the task says
    monkeypatch.setenv("OPTBUILD_TEST_SIGNING", "the coordinator's")
    result = run_on(_forged(doc, lambda d: d.update(signed=True, signing_key_env="OPTBUILD_TEST_SIGNING")),
                    _node(file_remote))
    assert result["ok"] is False and "this node holds no signing key" in result["error"]
    assert file_remote.keys() == []


def _acceptor(tmp_path, file_remote, monkeypatch):
    """A DaskBuilder with only what ``_accept`` uses: a signed remote and a local store."""
    from types import SimpleNamespace

    from optbuild.common.digest import FileHasher
    from optbuild.distributed.builder import DaskBuilder
    from optbuild.store.local import LocalStore
    from optbuild.store.remote import RemoteSession, RemoteStore

    monkeypatch.setenv("OPTBUILD_TEST_SIGNING", "farm-secret")
    remote = RemoteSession(RemoteStore(file_remote.url, signing_key_env="OPTBUILD_TEST_SIGNING"))
    store = LocalStore(tmp_path / "cache", FileHasher(None))
    builder = DaskBuilder(SimpleNamespace(dask_scheduler="", remote=remote, store=store))
    spec = SimpleNamespace(id="r:s", kind="join", step=SimpleNamespace(primary_output="data.txt"))
    return builder, spec, store


def test_the_entry_a_node_returns_is_validated_as_a_fetched_remote_entry(tmp_path, file_remote, monkeypatch):
    from optbuild.common.errors import StepError
    from optbuild.distributed.taskspec import TaskResult
    from optbuild.store.entry import ActionEntry
    from optbuild.store.remote import encode_entry

    builder, spec, store = _acceptor(tmp_path, file_remote, monkeypatch)
    data = b"engine bytes"
    digest = digest_bytes(data)
    file_remote.write(file_remote.blob_path(digest), data)
    key = digest_bytes(b"the key")
    ingredients = {"kind": "join", "host": {"gpu.0.compute_capability": "9.0"}}
    entry = ActionEntry(key=key, step="r:s", kind="join", outputs={"data.txt": {"digest": digest, "size": len(data)}},
                        primary="data.txt", ingredients=ingredients, built_on="h1")

    def accept(entry_bytes: bytes, asked=ingredients):
        answer = TaskResult.read({"ok": True, "node": "h1", "entry": entry_bytes.decode()})
        return builder._accept(spec, key, asked, answer, download=True)

    for forged, why in [
        (encode_entry(entry, None), "not signed"),
        (encode_entry(entry, b"another key"), "signature does not match"),
        (encode_entry(entry.model_copy(update={"key": digest_bytes(b"other")}), b"farm-secret"), "filed under key"),
    ]:
        with pytest.raises(StepError, match=why):
            accept(forged)
    with pytest.raises(StepError, match="its key material differ"):
        accept(encode_entry(entry, b"farm-secret"), asked={**ingredients, "host": {"gpu.0.compute_capability": "8.0"}})
    assert store.get_action(key) is None  # nothing refused reached the local store
    accepted = accept(encode_entry(entry, b"farm-secret"))
    assert accepted.key == key and store.get_action(key) is not None and store.read_blob(digest) == data


def test_the_cli_stays_light_distributed_is_imported_only_when_used():
    import subprocess
    import sys

    for args in (["--help"], ["worker", "--help"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "optbuild", *args], capture_output=True,
                              text=True, check=True)
        imported = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
        assert imported and not [line for line in imported if "distributed" in line or "dask" in line.split("|")[-1]]


def test_worker_refuses_what_it_cannot_use(tmp_path, capsys, monkeypatch):
    from optbuild.cli import main

    def worker(*args: str, scheduler: str = "") -> str:
        assert main(["worker", "--scheduler", scheduler or free_address(), *args]) == 2
        return capsys.readouterr().err

    monkeypatch.delenv("OPTBUILD_REMOTE", raising=False)
    remote = ("--remote", f"file://{tmp_path}")
    (tmp_path / "bad.json").write_text("[1, 2")
    assert "cannot read the fingerprint" in worker(*remote, "--fingerprint", str(tmp_path / "bad.json"))
    assert "--nthreads must be at least 1" in worker(*remote, "--nthreads", "0")
    assert "a node needs the remote cache its builds use: --remote URL" in worker()
    assert "tls://127.0.0.1:1 is a TLS address, and Dask's configuration gives this host no certificate" in worker(
        *remote, scheduler="tls://127.0.0.1:1")
    monkeypatch.delenv("OPTBUILD_NODE_KEY", raising=False)
    assert "--signing-key-env names $OPTBUILD_NODE_KEY, which is not set" in worker(
        *remote, "--signing-key-env", "OPTBUILD_NODE_KEY")


def test_steps_sharing_an_input_send_it_to_the_remote_once(tmp_path, file_remote):
    """Several engine steps of one model start together: one upload of the model, not one each."""
    import threading
    from types import SimpleNamespace

    from optbuild.common.digest import FileHasher
    from optbuild.distributed.builder import DaskBuilder
    from optbuild.store.local import LocalStore
    from optbuild.store.remote import RemoteSession, RemoteStore

    store = LocalStore(tmp_path / "cache", FileHasher(None))
    remote = RemoteSession(RemoteStore(file_remote.url))
    builder = DaskBuilder(SimpleNamespace(dask_scheduler="", store=store, remote=remote))
    model = b"m" * (1 << 20)
    digest = store.put_bytes(model)
    start = threading.Barrier(8)

    def send() -> None:
        start.wait()
        builder._ensure(digest, len(model), "r:engine input model.onnx")

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert remote.stats.blobs_up == 1
    assert file_remote.read(file_remote.blob_path(digest)) == model


def test_an_answer_that_is_not_a_task_result_is_the_nodes_failure_said():
    from optbuild.distributed.taskspec import TaskResult

    for answer, where in [("garbage", "the result"), ({"ok": "yes"}, "ok"), ({"ok": True, "entry": 3}, "entry")]:
        result = TaskResult.read(answer)
        assert not result.ok and result.infra and f"not a task result ({where}:" in result.error
