"""Steps run in children forked from a server that has imported their tools once
(optbuild.process.forkserver, optbuild.process.pool): as isolated as a fresh process per step."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from plugins.projects import CONFIG, FIXTURES, ProjectDir

from optbuild.process.pool import ProcessPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only")

KINDS = CONFIG.replace("[kinds]\n", '[kinds]\nprobe = "probekinds.py:Probe"\nthreaded = "probekinds.py:ThreadedProbe"\n'
                                   'onnx_probe = "probekinds.py:OnnxProbe"\nlazy_probe = "probekinds.py:LazyProbe"\n'
                                   'shared_probe = "probekinds.py:SharedProbe"\n')


def probe_project(root: Path, steps: str, *, config: str = KINDS) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    for module in ("probekinds.py", "threadstarter.py"):
        shutil.copy(FIXTURES / module, root / module)
    proj.write("optbuild.toml", config)
    proj.write("recipes/p.toml", steps)
    return proj


def probe(name: str, **params: object) -> str:
    lines = [f"[steps.{name}]", 'kind = "probe"', f'tag = "{name}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in params.items()]
    return "\n".join(lines) + "\n\n"


def seen(proj: ProjectDir, step: str) -> dict:
    return json.loads(proj.read(f"build/p/{step}/seen.json"))


def test_steps_run_in_children_of_one_server_that_preloaded_their_tools(tmp_path):
    proj = probe_project(tmp_path / "proj", probe("a") + probe("b", after="a"))
    assert proj.build().ok
    a, b = seen(proj, "a"), seen(proj, "b")
    assert a["ppid"] == b["ppid"] != os.getpid()  # forked by the same server, not by the builder
    assert a["pid"] != b["pid"]
    assert a["numpy_preloaded"] and b["numpy_preloaded"]
    assert a["kind_loaded_in"] == b["kind_loaded_in"] == a["ppid"]  # the kind imported once, by the server
    assert a["numpy_random"] != b["numpy_random"]  # each child draws fresh, as a new process would
    assert a["cwd"] == str(proj.root)


def test_with_preload_false_every_step_is_a_fresh_process_of_the_builder(tmp_path):
    config = KINDS.replace("[build]\n", "[build]\npreload = false\n")
    proj = probe_project(tmp_path / "proj", probe("a") + probe("b", after="a"), config=config)
    assert proj.build().ok
    assert seen(proj, "a")["ppid"] == seen(proj, "b")["ppid"] == os.getpid()
    assert not seen(proj, "a")["numpy_preloaded"]


def test_state_one_step_leaks_never_reaches_the_next(tmp_path):
    proj = probe_project(tmp_path / "proj", probe("leaky", leak=True) + probe("next", after="leaky"))
    assert proj.build().ok
    after = seen(proj, "next")
    assert after["ppid"] == seen(proj, "leaky")["ppid"]  # the same server forked both
    assert after["leaked_env"] is None and after["leaked_global"] is None
    assert not after["leaked_module"] and not after["leaked_path"]
    assert after["cwd"] == str(proj.root)


def test_a_native_crash_fails_only_its_step_and_the_server_forks_the_next(tmp_path):
    steps = probe("first") + probe("boom", after="first", crash=True) + probe("last", after="first", sleep=0.5)
    proj = probe_project(tmp_path / "proj", steps)
    result = proj.build(keep_going=True, jobs=1)
    assert not result.ok
    assert "step process died (signal 11): SIGSEGV, a crash inside a native library" in result.outcomes["p:boom"].error
    assert result.outcomes["p:last"].status == "built"
    assert seen(proj, "last")["ppid"] == seen(proj, "first")["ppid"]


def shared(name: str, **params: object) -> str:
    return probe(name, **params).replace('kind = "probe"', 'kind = "shared_probe"')


def test_a_kind_that_shares_its_process_runs_its_steps_in_one_worker_each_in_a_fresh_setting(tmp_path):
    steps = shared("a", leak=True) + shared("b", after="a") + shared("c", after="b", fail=True)
    proj = probe_project(tmp_path / "proj", steps)
    result = proj.build(keep_going=True)
    assert result.outcomes["p:c"].error.startswith("probe c was asked to fail")
    a, b = seen(proj, "a"), seen(proj, "b")
    assert a["pid"] == b["pid"] != os.getpid() and a["ppid"] == b["ppid"]  # one worker, a server's child
    assert a["numpy_random"] != b["numpy_random"]
    assert b["leaked_env"] is None and b["cwd"] == str(proj.root)  # each step gets the builder's
    assert b["leaked_global"] == 1  # what a kind that shares its process promises not to do
    log = proj.read("build/.logs/p/c.log")
    assert f"probe c runs in {a['pid']}" in log and "probe b" not in log  # the log is its own
    with pytest.raises(ProcessLookupError):  # the worker ended with the build
        os.kill(a["pid"], 0)


def test_a_crash_fails_only_its_step_and_a_new_worker_runs_the_next(tmp_path):
    steps = shared("first") + shared("boom", after="first", crash=True) + shared("last", after="boom")
    steps = steps.replace('after = "boom"', 'after = "first"\nsleep = 0.5')
    proj = probe_project(tmp_path / "proj", steps)
    result = proj.build(keep_going=True, jobs=1)
    assert "step process died (signal 11): SIGSEGV" in result.outcomes["p:boom"].error
    assert result.outcomes["p:last"].status == "built"
    assert seen(proj, "last")["pid"] != seen(proj, "first")["pid"]


def test_a_worker_that_ran_its_share_of_steps_exits_and_a_new_one_runs_the_next(tmp_path):
    proj = probe_project(tmp_path / "proj", shared("a") + shared("b", after="a") + shared("c", after="b"))
    pool = ProcessPool(proj.root)
    pool.worker_steps = 2
    assert proj.build(pool=pool).ok
    a, b, c = seen(proj, "a"), seen(proj, "b"), seen(proj, "c")
    assert a["pid"] == b["pid"] != c["pid"] and c["ppid"] == a["ppid"]


def test_a_preload_that_leaves_a_thread_running_is_refused_and_steps_start_fresh(tmp_path, caplog):
    proj = probe_project(tmp_path / "proj", '[steps.t]\nkind = "threaded"\n')
    with caplog.at_level(logging.WARNING, logger="optbuild"):
        assert proj.build().ok
    assert seen(proj, "t")["ppid"] == os.getpid()
    assert "preloading threadstarter for steps failed" in caplog.text
    assert "keep running after a fork" in caplog.text


def test_a_build_forks_from_the_server_started_before_it_and_ends_it(tmp_path):
    proj = probe_project(tmp_path / "proj", '[steps.o]\nkind = "onnx_probe"\n')
    pool = ProcessPool.speculative(str(proj.root))  # as `optbuild build` does, first thing
    server = pool._servers[0].proc
    assert proj.build(pool=pool).ok
    assert seen(proj, "o")["ppid"] == server.pid
    assert server.poll() is not None  # ended with the build


def test_a_kind_that_preloads_nothing_forks_from_a_bare_server_until_it_is_seen_importing_numpy(tmp_path):
    lazy = '[steps.a]\nkind = "lazy_probe"\n\n[steps.b]\nkind = "lazy_probe"\nafter = "a"\n\n' \
           '[steps.c]\nkind = "lazy_probe"\nafter = "b"\n'
    proj = probe_project(tmp_path / "proj", lazy)
    pool = ProcessPool.speculative(str(proj.root))  # numpy and onnx preloaded, as `optbuild build` starts it
    onnx_server = pool._servers[0].proc.pid
    assert proj.build(pool=pool).ok
    a, c = seen(proj, "a"), seen(proj, "c")
    assert not a["numpy_preloaded"] and a["ppid"] != onnx_server
    assert c["numpy_preloaded"] and c["ppid"] != a["ppid"]  # a's process said it imported numpy


def test_a_pool_started_for_another_project_is_ended_and_not_used(tmp_path):
    proj = probe_project(tmp_path / "proj", '[steps.o]\nkind = "onnx_probe"\n')
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "optbuild.toml").write_text("")
    pool = ProcessPool.speculative(str(tmp_path / "other"))
    server = pool._servers[0].proc
    assert proj.build(pool=pool).ok
    assert server.poll() is not None and seen(proj, "o")["ppid"] != server.pid


def test_two_recipes_whose_model_modules_share_a_name_each_export_their_own(tmp_path):
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("optbuild.toml", CONFIG)
    for name, width in (("a", 3), ("b", 5)):
        proj.write(f"recipes/{name}/model.py",
                   "import torch\n\ndef build():\n"
                   f"    return torch.nn.Linear({width}, 2), (torch.zeros(1, {width}),)\n")
        proj.write(f"recipes/{name}.toml", f'[steps.export]\nkind = "export"\nmodel = "{name}/model.py:build"\n')
    assert proj.build(jobs=1).ok
    import onnx

    for name, width in (("a", 3), ("b", 5)):
        graph = onnx.load(proj.root / "build" / name / "export" / "model.onnx").graph
        assert graph.input[0].type.tensor_type.shape.dim[1].dim_value == width


def _processes_of(builder: int) -> list[int]:
    """Fork servers started by ``builder`` and the children they forked (same command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"optbuild.process.forkserver" in argv and str(builder).encode() in argv:
                found.append(int(entry.name))
    return found


def test_a_killed_builder_leaves_no_server_and_no_step_running(tmp_path):
    proj = probe_project(tmp_path / "proj", probe("nap", sleep=60))
    marker = tmp_path / "started"
    builder = proj.popen("build", env={"OPTBUILD_TEST_STARTED": str(marker)})
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            assert builder.poll() is None, builder.communicate()
            time.sleep(0.05)
        step = json.loads(marker.read_text())
        assert step["pid"] in _processes_of(builder.pid)
        os.kill(builder.pid, signal.SIGKILL)
        builder.wait()
        deadline = time.monotonic() + 10
        while _processes_of(builder.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_of(builder.pid) == []
    finally:
        builder.kill()
        builder.communicate()


# --- a pool that outlives builds (a build server's, optbuild.cli.buildserver) ------------------------
def test_a_served_pool_outlives_builds_and_says_when_a_module_it_imported_changed(tmp_path):
    from optbuild.process.pool import ServedPool

    (tmp_path / "preloadme.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    pool = ServedPool(tmp_path, env=env, quiet_env=("PWD",))
    try:
        pool.prewarm(("preloadme",))
        [server] = pool._servers
        assert server.ready(__import__("threading").Event())
        pool.close()  # a build is done with it: the server stays
        assert server.proc.poll() is None
        assert server.why_stale(racy_ns=0) is None
        assert "changed within" in server.why_stale(racy_ns=10**12)  # too young to vouch for the import
        assert "environment" not in (pool.why_stale({**env, "PWD": "/elsewhere"}) or "")  # quiet_env
        assert "environment" in pool.why_stale({**env, "OMP_NUM_THREADS": "1"})
        (tmp_path / "preloadme.py").write_text("VALUE = 22\n")
        assert "preloadme.py changed since it was imported" in server.why_stale(racy_ns=0)
    finally:
        pool.shutdown()
    assert server.proc.poll() is not None


def test_a_fork_server_that_died_makes_a_served_pool_stale(tmp_path):
    from optbuild.process.pool import ServedPool
    from optbuild.steps.base import ONNX_TOOLS

    pool = ServedPool(tmp_path, env=dict(os.environ))
    try:
        pool.prewarm(ONNX_TOOLS)
        [server] = pool._servers
        assert server.ready(__import__("threading").Event())
        server.proc.kill()
        server.proc.wait()
        assert pool.why_stale(dict(os.environ)) == "a fork server ended"
    finally:
        pool.shutdown()
