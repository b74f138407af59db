"""The build server (optbuild.cli.buildserver): off unless asked; where on, a build after the
first goes through it, with the client's environment, folder and terminal, and a client
whose world differs (environment, TMPDIR, mount namespace, limits, modules) builds in its
own process; Ctrl-C and a killed client cancel as locally; a stopped or silent server is
named and passed by, and `server stop` ends it; a project that does not load starts none;
only its own user can reach it, through a private folder. Every test stops the servers it
started (and kills them if they do not stop)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from plugins.edits import compile_to_pycache, edit_within_the_same_second
from plugins.processes import parents, process_state, reaped, server_processes, wait_gone, wait_state
from plugins.projects import ProjectDir
from test_signals import INTERRUPTED, assert_cancelled, assert_left_clean, nap_project, wait_for_pids

from optbuild.cli.buildserver import client, protocol, session
from optbuild.cli.buildserver import server as served

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: abstract sockets, /proc"),
              pytest.mark.timeout(180)]

SERVED = {"OPTBUILD_SERVER": "1", "OPTBUILD_DEBUG_SERVER": "1", "OPTBUILD_SERVER_IDLE_S": "120"}
# Files a server loads must be older than this when it loads them (signatures.RACY_NS) to vouch
# for what it imported: a project written by a test waits that long before its server starts.
RACY_S = 2.1

PROBE_KINDS = '''
import os
from pathlib import Path

from optbuild.steps.base import Step, StepParams


class ProbeParams(StepParams):
    tag: str = ""


class Probe(Step):
    """Writes what it sees: $PROBE, and the pids of its parents."""

    Params = ProbeParams
    primary_output = "data.txt"

    def run(self, ctx):
        (ctx.out_dir / "data.txt").write_text(f"{os.environ.get('PROBE')} {self.params.tag}")
'''


def probe_project(root: Path) -> ProjectDir:
    proj = ProjectDir(root)
    proj.root.mkdir(parents=True)
    proj.write("probe.py", PROBE_KINDS)
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[kinds]\nprobe = "probe.py:Probe"\n')
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "one"\n')
    return proj


def optbuild(cwd: Path, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optbuild", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **SERVED, **(env or {})})


def popen(cwd: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A client as a shell with job control starts one: in a process group of its own, whose
    parent (this process) is in another group of the session. SIGTSTP would not stop a
    process of an orphaned group (this runner's may be one: started by a shell gone since)."""
    return subprocess.Popen([sys.executable, "-m", "optbuild", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **SERVED, **(env or {})},
                            process_group=0)


@pytest.fixture(autouse=True)
def sockets_in_the_build_folder(monkeypatch):
    """Servers' sockets and lock files under the test's own folder, not the user's
    $XDG_RUNTIME_DIR (a test that wants it there sets it)."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


@pytest.fixture(autouse=True)
def job_control():
    """Clients start with SIGTSTP at its default, as a shell with job control starts them: the
    test runner may run with it ignored, which they would inherit."""
    previous = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTSTP, previous)


def status(root: Path) -> dict | None:
    return protocol.request(os.path.realpath(root), {"op": "status"})


def wait_for_server(root: Path, not_pid: int | None = None, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = status(root)
        if found is not None and found["pid"] != not_pid:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no build server came up for {root}")


def started_server(proj: ProjectDir, servers: list[Path]) -> dict:
    """The server that a first build of ``proj`` starts (its files made old enough first for
    the server to vouch for what it loads); the servers fixture ends it."""
    servers.append(proj.root)
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build").returncode == 0
    return wait_for_server(proj.root)


def served_by(stderr: str) -> int | None:
    for line in stderr.splitlines():
        if "server: build served by pid " in line:
            return int(line.rsplit(" ", 1)[1])
    return None


def fork_server_pids(found: dict) -> list[int]:
    return [f["pid"] for f in found.get("fork_servers", [])]


def test_the_second_build_goes_through_the_server_with_the_clients_env_and_folder(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    time.sleep(RACY_S)
    # from the parent folder, -C relative to the client's folder (python -m puts the current
    # folder on sys.path: a client started from another folder is another interpreter setup)
    first = optbuild(tmp_path, "-C", "proj", "build", env={"PROBE": "a"})
    assert first.returncode == 0, first.stderr
    assert "none runs: building in this process" in first.stderr and served_by(first.stderr) is None
    assert "started a build server for this project's next builds" in first.stderr
    server = wait_for_server(proj.root)
    assert proj.read("build/r/p/data.txt") == "a one"

    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    second = optbuild(tmp_path, "-C", "proj", "build", env={"PROBE": "a"})
    assert second.returncode == 0, second.stderr
    assert served_by(second.stderr) == server["pid"]
    assert "built    r:p" in second.stderr and "ok: 1 built" in second.stderr  # the server wrote to our stderr
    assert proj.read("build/r/p/data.txt") == "a two"
    log = Path(server["log"]).read_text()
    assert "build 1 for pid" in log and "(in " + str(tmp_path) + ")" in log

    # an error is reported as locally, through the server
    bad = optbuild(tmp_path, "-C", "proj", "build", "r:nothing", env={"PROBE": "a"})
    assert served_by(bad.stderr) == server["pid"]
    assert bad.returncode == 2 and "error:" in bad.stderr
    assert status(proj.root)["builds"] == 2


def test_a_build_the_server_runs_loads_only_the_recipes_a_change_reaches(tmp_path, servers):
    """As an in-process build does (``common/noopreach.py``), the server finding the reach itself."""
    proj = probe_project(tmp_path / "proj")
    proj.write("recipes/s.toml", '[steps.p]\nkind = "probe"\ntag = "other"\n')
    servers.append(proj.root)
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build", env={"PROBE": "a"}).returncode == 0  # starts the server
    server = wait_for_server(proj.root)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    second = optbuild(proj.root, "build", env={"PROBE": "a"})
    assert second.returncode == 0 and served_by(second.stderr) == server["pid"], second.stderr
    assert "ok: 1 cached, 1 built" in second.stderr and proj.read("build/r/p/data.txt") == "a two"
    assert "r:p: recipes/r.toml changed: loading 1 of 2 recipes" in Path(server["log"]).read_text()


@pytest.mark.parametrize("variable", ["PROBE", "TMPDIR"])
def test_a_client_whose_steps_would_see_another_environment_builds_in_its_own_process(tmp_path, servers, variable):
    """Steps see the client's environment; a server started under another one may hold what
    it read from it at start (the temporary folder, a library's settings): it declines."""
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    (tmp_path / "tmp1").mkdir()
    (tmp_path / "tmp2").mkdir()
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build", env={"PROBE": "a", "TMPDIR": str(tmp_path / "tmp1")}).returncode == 0
    server = wait_for_server(proj.root)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    other = {"PROBE": "a", "TMPDIR": str(tmp_path / "tmp1"), variable: str(tmp_path / "tmp2")}
    declined = optbuild(proj.root, "build", env=other)
    assert declined.returncode == 0, declined.stderr
    assert served_by(declined.stderr) is None
    assert f"the client's setup differs (environment: {variable})" in declined.stderr
    assert proj.read("build/r/p/data.txt") == f"{other['PROBE']} two"
    assert wait_gone([server["pid"]], 20)  # the next server is started under the client's environment
    assert wait_for_server(proj.root, not_pid=server["pid"])["pid"] != server["pid"]


def test_a_server_whose_temporary_folder_is_gone_builds_as_a_fresh_process_would(tmp_path, servers):
    """A fresh process whose $TMPDIR does not exist uses /tmp; so does the server, which used
    to keep the folder it found first and fail every build once it was gone, saying nothing."""
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    gone = tmp_path / "tmp"
    gone.mkdir()
    env = {"PROBE": "a", "TMPDIR": str(gone)}
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build", env=env).returncode == 0
    server = wait_for_server(proj.root)
    gone.rmdir()
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    served = optbuild(proj.root, "build", env=env)
    assert served.returncode == 0, served.stderr
    assert served_by(served.stderr) == server["pid"] and proj.read("build/r/p/data.txt") == "a two"


def test_a_client_in_another_mount_namespace_builds_in_its_own_process(tmp_path, servers):
    """Its files may differ at the same paths: here its cache is read-only (a bind mount in
    its own namespace); the server, which could write there, must not build for it."""
    if subprocess.run(["unshare", "-m", "mount", "--bind", "/", "/"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("unshare -m and mount are not allowed here (test_world_names_the_mount_namespace_and_root "
                    "covers the comparison)")
    proj = probe_project(tmp_path / "proj")
    server = started_server(proj, servers)
    entries = sorted((proj.root / "cache").rglob("*.json"))
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    read_only = ("mount --bind cache cache && mount -o remount,bind,ro cache && "
                 f"exec {sys.executable} -m optbuild build")
    unshared = subprocess.run(["unshare", "-m", "sh", "-c", read_only], cwd=proj.root, capture_output=True,
                              text=True, timeout=120, check=False, env={**os.environ, **SERVED})
    assert served_by(unshared.stderr) is None and "the client's setup differs (mount namespace)" in unshared.stderr
    assert unshared.returncode == 1 and "is read-only here" in unshared.stderr  # as in-process, and said so
    assert sorted((proj.root / "cache").rglob("*.json")) == entries
    assert wait_gone([server["pid"]], 20)


def test_world_names_the_mount_namespace_and_root(tmp_path):
    """Read from this process's /proc: what a client in another namespace or root differs by."""
    found = protocol.world()
    mnt, root = os.stat("/proc/self/ns/mnt"), os.stat("/")
    assert found == {"mount_namespace": [mnt.st_dev, mnt.st_ino], "root": [root.st_dev, root.st_ino]}
    ours = protocol.identity()
    assert protocol.differences(ours, ours) == []
    chrooted = {**ours, "root": [root.st_dev, root.st_ino + 1]}
    unshared = {**ours, "mount_namespace": [mnt.st_dev, mnt.st_ino + 1]}
    assert protocol.differences(ours, chrooted) == ["root"]
    assert protocol.differences(ours, unshared) == ["mount namespace"]
    secret = {**ours, "env": {**ours["env"], "API_TOKEN": "s3cr3t"}}
    assert protocol.differences(ours, secret) == ["environment: API_TOKEN"]  # its name, never its value


def napping_through_a_server(tmp_path: Path, servers: list[Path]) -> tuple[ProjectDir, dict, subprocess.Popen]:
    """A project whose server built its source, and a client whose build of two 60 s naps
    runs in that server; the naps' pids go to tmp_path / "pids"."""
    proj = nap_project(tmp_path / "proj", seconds=60)
    servers.append(proj.root)
    (tmp_path / "pids").mkdir()
    env = {"NAP_PIDS": str(tmp_path / "pids")}  # one environment: a client under another is declined
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build", "naps:src", env=env).returncode == 0
    server = wait_for_server(proj.root)
    return proj, server, popen(proj.root, "build", env=env)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["Ctrl-C", "SIGTERM", "SIGHUP (its terminal closed)"])
def test_a_signal_to_the_client_cancels_the_build_in_the_server_with_the_local_exit_status(
        tmp_path, servers, signum, code):
    proj, server, started = napping_through_a_server(tmp_path, servers)
    with reaped(started) as proc:
        workers = wait_for_pids(tmp_path / "pids", 2, proc)
        sent = time.monotonic()
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 10
    assert proc.returncode == code, stderr
    assert served_by(stderr) == server["pid"]
    assert INTERRUPTED in stderr and "Traceback" not in stderr
    assert_cancelled(stderr)
    assert wait_gone(workers, 10)
    assert_left_clean(proj)
    assert status(proj.root)["pid"] == server["pid"]  # the server lives on, and serves
    again = optbuild(proj.root, "build", "naps:src", env={"NAP_PIDS": str(tmp_path / "pids")})
    assert again.returncode == 0 and served_by(again.stderr) == server["pid"]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGQUIT], ids=["killed", "Ctrl-backslash"])
def test_a_client_that_dies_cancels_its_build_and_leaves_nothing_half_written(tmp_path, servers, signum):
    """Ctrl-\\ (SIGQUIT) keeps its default in the client, as in a local build: it dies at once."""
    proj, server, started = napping_through_a_server(tmp_path, servers)
    with reaped(started) as proc:
        workers = wait_for_pids(tmp_path / "pids", 2, proc)
        proc.send_signal(signum)
        proc.communicate(timeout=30)
    assert proc.returncode == -signum  # as the shell reports it: "Killed", "Quit"
    assert wait_gone(workers, 10), "the steps of a dead client's build still run"
    found = status(proj.root)  # answered once the cancelled build is cleaned up
    assert found is not None and found["pid"] == server["pid"] and found["builds"] == 1
    assert_left_clean(proj)


def test_ctrl_z_stops_the_build_in_the_server_and_fg_resumes_it(tmp_path, servers):
    proj, server, started = napping_through_a_server(tmp_path, servers)
    with reaped(started) as proc:
        workers = wait_for_pids(tmp_path / "pids", 2, proc)
        forks = parents(workers)  # the fork servers of this build's environment
        proc.send_signal(signal.SIGTSTP)  # what the terminal sends on Ctrl-Z
        assert wait_state([proc.pid], "T"), "the client did not stop"
        assert wait_state(workers + forks, "T"), "the build's processes run on"
        assert process_state(server["pid"]) != "T"  # its threads wait on; they notice a client gone
        proc.send_signal(signal.SIGCONT)  # fg
        assert wait_state(workers, "S") and wait_state(forks, "S"), "the build did not resume"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and INTERRUPTED in stderr, stderr
    assert_left_clean(proj)
    again = optbuild(proj.root, "build", "naps:src", env={"NAP_PIDS": str(tmp_path / "pids")})  # its fork servers run again
    assert again.returncode == 0 and served_by(again.stderr) == server["pid"]


def test_a_stopped_client_killed_resumes_and_cancels_its_build(tmp_path, servers):
    proj, _, started = napping_through_a_server(tmp_path, servers)
    with reaped(started) as proc:
        workers = wait_for_pids(tmp_path / "pids", 2, proc)
        forks = parents(workers)  # the fork servers of this build's environment
        proc.send_signal(signal.SIGTSTP)
        assert wait_state(workers + forks, "T")
        proc.send_signal(signal.SIGKILL)  # kill -9 %1: it never says SIGCONT
        proc.communicate(timeout=30)
    assert wait_gone(workers, 10)
    assert wait_state(forks, "S"), "the fork servers were left stopped"
    assert status(proj.root)["builds"] == 1
    assert_left_clean(proj)


def test_a_client_under_another_nice_level_is_served_by_a_server_started_under_it(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    server = started_server(proj, servers)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    niced = subprocess.run([sys.executable, "-m", "optbuild", "build"], cwd=proj.root, capture_output=True,
                           text=True, timeout=120, check=False, env={**os.environ, **SERVED},
                           preexec_fn=lambda: os.nice(5))
    assert niced.returncode == 0, niced.stderr
    assert served_by(niced.stderr) is None and "the client's setup differs (limits)" in niced.stderr
    assert wait_gone([server["pid"]], 20)
    restarted = wait_for_server(proj.root, not_pid=server["pid"])
    assert os.getpriority(os.PRIO_PROCESS, restarted["pid"]) == os.getpriority(os.PRIO_PROCESS, 0) + 5


def test_a_changed_module_restarts_the_server(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    server = started_server(proj, servers)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    served = optbuild(proj.root, "build")
    assert served.returncode == 0 and served_by(served.stderr) == server["pid"]  # it loaded probe.py

    proj.write("probe.py", PROBE_KINDS.replace("{os.environ.get('PROBE')} ", "changed "))
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "three"\n')
    changed = optbuild(proj.root, "build")
    assert changed.returncode == 0, changed.stderr
    assert served_by(changed.stderr) is None and "probe.py changed" in changed.stderr
    assert proj.read("build/r/p/data.txt") == "changed three"
    assert wait_gone([server["pid"], *fork_server_pids(server)], 20)
    assert wait_for_server(proj.root, not_pid=server["pid"])["pid"] != server["pid"]


def test_an_idle_server_ends_and_its_fork_servers_with_it(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    assert optbuild(proj.root, "build", env={"OPTBUILD_SERVER_IDLE_S": "3"}).returncode == 0
    server = wait_for_server(proj.root)
    assert server["idle_limit_s"] == 3
    pids = [server["pid"], *fork_server_pids(server)]
    assert len(pids) == 2
    assert wait_gone(pids, 30)
    assert status(proj.root) is None
    assert "stopping: idle for 3 s" in Path(server["log"]).read_text()


def test_a_killed_server_takes_its_fork_servers_with_it_and_the_next_build_runs_locally(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    assert optbuild(proj.root, "build").returncode == 0
    server = wait_for_server(proj.root)
    os.kill(server["pid"], signal.SIGKILL)
    assert wait_gone([server["pid"], *fork_server_pids(server)], 10)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    again = optbuild(proj.root, "build")
    assert again.returncode == 0 and "none runs" in again.stderr


def test_a_long_server_log_is_moved_aside_when_the_next_server_starts(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    old = proj.write("build/.optbuild/server.log", "x" * (protocol.LOG_KEPT_BYTES + 1))
    assert optbuild(proj.root, "build").returncode == 0
    server = wait_for_server(proj.root)
    assert (proj.root / "build/.optbuild/server.log.1").stat().st_size == protocol.LOG_KEPT_BYTES + 1
    assert "x" * 100 not in old.read_text() and "serving " in old.read_text()
    assert str(old) == server["log"]


def test_server_status_and_stop(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    none = optbuild(proj.root, "server", "status")
    assert none.returncode == 1 and "no build server runs" in none.stdout
    assert optbuild(proj.root, "build").returncode == 0
    server = wait_for_server(proj.root)
    shown = optbuild(proj.root, "server", "status")
    assert shown.returncode == 0 and f"build server pid {server['pid']}" in shown.stdout
    stop = optbuild(proj.root, "server", "stop")
    assert stop.returncode == 0 and f"stopped the build server (pid {server['pid']})" in stop.stderr
    assert wait_gone([server["pid"], *fork_server_pids(server)], 10)


def test_off_by_default_and_the_project_or_the_environment_turns_it_on(tmp_path, monkeypatch):
    root = str(tmp_path)
    config = tmp_path / "optbuild.toml"
    config.write_text("[build]\njobs = 2\n")
    monkeypatch.delenv("OPTBUILD_SERVER", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert not protocol.enabled(root)
    assert not protocol.enabled(None)  # no project: nothing to serve
    monkeypatch.setenv("OPTBUILD_SERVER", "1")
    assert protocol.enabled(root)
    config.write_text("[build]\nserver = true\nserver_idle_s = 60\n")
    monkeypatch.setenv("OPTBUILD_SERVER", "0")  # the environment wins, either way
    assert not protocol.enabled(root)
    monkeypatch.delenv("OPTBUILD_SERVER")
    assert protocol.enabled(root) and protocol.idle_limit(root) == 60
    config.write_text("[build]\nserver = false\n")
    assert not protocol.enabled(root)
    monkeypatch.setenv("OPTBUILD_SERVER_IDLE_S", "5")
    assert protocol.idle_limit(root) == 5
    config.write_text('[build]\nserver = "yes"\n')  # not a boolean: off here, an error in the build
    assert not protocol.enabled(root)
    monkeypatch.setenv("OPTBUILD_SERVER", "1")  # a file that does not parse: reported in-process, whatever asks
    config.write_text("[build\nserver = true\n")
    assert not protocol.enabled(root)
    config.write_text(DEEP)
    assert not protocol.enabled(root)


def test_a_build_starts_no_server_unless_asked(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    quiet = {"OPTBUILD_SERVER": "", "CI": ""}  # unset, as far as optbuild reads them
    built = optbuild(proj.root, "build", env=quiet)
    assert built.returncode == 0, built.stderr
    assert "server" not in built.stderr
    proj.write("optbuild.toml", proj.read("optbuild.toml") + "\n[build]\nserver = true\n")
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')  # not a no-op
    time.sleep(RACY_S)
    asked = optbuild(proj.root, "build", env=quiet)
    assert asked.returncode == 0 and "started a build server" in asked.stderr
    wait_for_server(proj.root)
    assert server_processes(proj.root)


DEEP = "x = " + "[" * 5000 + "]" * 5000 + "\n"


@pytest.mark.parametrize("broken", ["deep nesting", "invalid step"])
def test_a_project_that_does_not_load_is_reported_as_plan_reports_it_and_starts_no_server(tmp_path, servers,
                                                                                        broken):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    if broken == "deep nesting":
        proj.write("optbuild.toml", proj.read("optbuild.toml") + DEEP)
    else:
        proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = 3\n')
    plan = optbuild(proj.root, "plan")
    build = optbuild(proj.root, "build")
    assert plan.returncode == build.returncode == 2, build.stderr
    error = [line for line in plan.stderr.splitlines() if line.startswith("error:")]
    assert error and all(line in build.stderr for line in error)
    assert "Traceback" not in build.stderr and "started a build server" not in build.stderr
    time.sleep(1)
    assert server_processes(proj.root) == []


# --- the peer check ---------------------------------------------------------------------------
def test_only_the_same_user_is_served(monkeypatch, tmp_path):
    assert protocol.same_user(os.getuid())
    assert not protocol.same_user(os.getuid() + 1)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    assert protocol.peer_uid(mine) == os.getuid()  # the real SO_PEERCRED answer
    monkeypatch.setattr(served, "peer_uid", lambda sock: os.getuid() + 1)
    server = served.Server.__new__(served.Server)
    server.refused = served._RefusedLog()
    with mine, theirs:
        protocol.send(theirs, {"op": "status"})
        server.handle(mine)  # refused: nothing read, nothing answered
        mine.close()
        try:
            answer = theirs.recv(100)
        except ConnectionResetError:  # closed with the request unread
            answer = b""
        assert answer == b""


def test_a_client_talks_only_to_a_server_of_its_own_user(monkeypatch, tmp_path, capsys):
    proj = probe_project(tmp_path / "proj")
    root = os.path.realpath(proj.root)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with squatter, protocol.PrivateDir(protocol.socket_dir(root), create=True) as folder:
        squatter.bind(folder.file(protocol.socket_name(root)))
        squatter.listen(1)
        monkeypatch.setattr(protocol, "peer_uid", lambda sock: os.getuid() + 1)
        monkeypatch.setenv("OPTBUILD_SERVER", "1")
        monkeypatch.chdir(proj.root)
        assert client.try_build(["build"], None) == (None, None)  # in-process, and no server started
    assert "belongs to uid" in capsys.readouterr().err


def test_refused_connections_are_counted_not_each_logged(monkeypatch, tmp_path):
    """Another user's client may connect as fast as it likes (72,909 times in 3 s once): the
    first is logged, then a count per interval."""
    log = tmp_path / "server.log"
    monkeypatch.setattr(served, "_LOGFILE", log.open("a"))
    monkeypatch.setattr(served, "peer_uid", lambda sock: os.getuid() + 1)
    server = served.Server.__new__(served.Server)
    server.refused = served._RefusedLog()
    for _ in range(2000):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with mine, theirs:
            server.handle(mine)
    server.refused.flush(force=True)
    served._LOGFILE.flush()
    lines = log.read_text().splitlines()
    assert len(lines) == 2, lines
    assert f"refused a connection from uid {os.getuid() + 1}" in lines[0]
    assert f"refused 1999 more connection(s) from uid {os.getuid() + 1}" in lines[1]


@pytest.mark.skipif(os.getuid() != 0, reason="needs another uid to connect as")
def test_another_user_cannot_even_reach_the_socket(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build").returncode == 0
    wait_for_server(proj.root)
    folder = Path(protocol.socket_dir(os.path.realpath(proj.root)))
    # from the folder's parent (the test's own folders are 0700 too), as uid and gid 65534
    probe = ("import os, socket, sys; os.setgid(65534); os.setuid(65534); "
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
             "try:\n s.connect(sys.argv[1])\nexcept PermissionError:\n sys.exit(13)\n")
    name = f"{folder.name}/{protocol.socket_name(os.path.realpath(proj.root))}"
    assert subprocess.run([sys.executable, "-c", probe, name], cwd=folder.parent, timeout=30,
                          check=False).returncode == 13


@pytest.mark.parametrize("runtime", ["XDG_RUNTIME_DIR", "the build folder"])
def test_the_socket_lives_in_a_private_folder(tmp_path, servers, monkeypatch, runtime):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    if runtime == "XDG_RUNTIME_DIR":
        (tmp_path / "run").mkdir(mode=0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
        expected = tmp_path / "run" / "optbuild"
    else:
        expected = proj.root / "build" / ".optbuild" / "server"
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build").returncode == 0
    server = wait_for_server(proj.root)
    folder = Path(protocol.socket_dir(os.path.realpath(proj.root)))
    assert folder == expected and folder.is_dir()
    st = folder.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_mode & 0o777 == 0o700 and st.st_uid == os.getuid()
    assert protocol.server_pid(os.path.realpath(proj.root)) == server["pid"]


@pytest.mark.parametrize("planted", ["open to others", "a link"])
def test_a_socket_folder_that_is_not_private_is_not_used(tmp_path, servers, planted):
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    folder = Path(protocol.socket_dir(os.path.realpath(proj.root)))
    folder.parent.mkdir(parents=True)
    if planted == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir()
        folder.chmod(0o755)
    built = optbuild(proj.root, "build")
    assert built.returncode == 0, built.stderr
    assert f"the build server's folder {folder} is not" in built.stderr and "building in this process" in built.stderr
    time.sleep(1)
    assert server_processes(proj.root) == []


def test_a_project_at_a_path_longer_than_a_unix_socket_address_is_served(tmp_path, servers):
    proj = probe_project(tmp_path / ("long-" + "x" * 60) / ("y" * 60) / "proj")
    servers.append(proj.root)
    assert len(protocol.socket_dir(str(proj.root))) > 108
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build").returncode == 0
    server = wait_for_server(proj.root)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    again = optbuild(proj.root, "build")
    assert again.returncode == 0 and served_by(again.stderr) == server["pid"]


# --- a hung server ------------------------------------------------------------------------------
def test_a_stopped_server_is_named_and_skipped_and_server_stop_ends_it(tmp_path, servers):
    proj = probe_project(tmp_path / "proj")
    server = started_server(proj, servers)
    os.kill(server["pid"], signal.SIGSTOP)  # the servers fixture continues it to end it, if need be
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    started = time.monotonic()
    built = optbuild(proj.root, "build", timeout=60)
    assert time.monotonic() - started < 20
    assert built.returncode == 0, built.stderr
    assert f"the build server (pid {server['pid']}) is stopped" in built.stderr
    assert f"kill -9 {server['pid']}" in built.stderr and proj.read("build/r/p/data.txt") == "None two"
    shown = optbuild(proj.root, "server", "status", timeout=30)
    assert f"build server pid {server['pid']} for" in shown.stdout and "is stopped" in shown.stdout
    stop = optbuild(proj.root, "server", "stop", timeout=60)
    assert stop.returncode == 0 and f"the build server (pid {server['pid']})" in stop.stderr
    assert wait_gone([server["pid"], *fork_server_pids(server)], 10)


SILENT = """
import signal, socket, sys, time
from optbuild.cli.buildserver import protocol
from optbuild.cli.buildserver.protocol import claim
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a server stuck in a build that never ends
folder, _ = claim(sys.argv[1])
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(folder.file(protocol.socket_name(sys.argv[1])))
listener.listen(16)
print("listening", flush=True)
time.sleep(300)
"""


def test_a_silent_server_is_given_up_on_and_server_stop_kills_it(tmp_path, servers):
    """A process that holds the project's server lock and socket, answers nothing and
    ignores SIGTERM: a build waits client.WAIT_LIMIT_S for it, not forever, and its pipes
    are not held open (capture_output returns); stop ends it with SIGKILL."""
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    root = os.path.realpath(proj.root)
    with reaped(subprocess.Popen([sys.executable, "-c", SILENT, root], stdout=subprocess.PIPE, text=True)) as stub:
        assert stub.stdout.readline() == "listening\n"
        started = time.monotonic()
        built = optbuild(proj.root, "build", timeout=90)
        assert client.WAIT_LIMIT_S < time.monotonic() - started < client.WAIT_LIMIT_S + 30
        assert built.returncode == 0 and proj.read("build/r/p/data.txt") == "None one", built.stderr
        assert f"the build server (pid {stub.pid}) has not answered in {client.WAIT_LIMIT_S:g} s" in built.stderr
        shown = optbuild(proj.root, "server", "status", timeout=30)
        assert shown.returncode == 0 and f"build server pid {stub.pid} for {root} did not answer" in shown.stdout
        stop = optbuild(proj.root, "server", "stop", timeout=60)
        assert stop.returncode == 0 and f"killed (SIGKILL) the build server (pid {stub.pid})" in stop.stderr
        stub.wait(10)
    assert stub.returncode == -signal.SIGKILL


# --- staleness, caches --------------------------------------------------------------------------
def test_a_server_declines_another_interpreter_a_changed_module_or_a_replaced_project(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    module = tmp_path / "mods" / "served_probe_module.py"
    module.parent.mkdir()
    module.write_text("X = 1\n")
    loaded = types.ModuleType("served_probe_module")
    loaded.__file__ = str(module)
    monkeypatch.setitem(sys.modules, "served_probe_module", loaded)  # as if the server had imported it
    server = served.Server(str(root), str(root / "build"), 10)
    server.watch_modules(time.time_ns() + 3 * 10**9)  # as if loaded 3 s after its last change
    assert server.stale is None
    ours = {"identity": protocol.identity()}
    assert server.why_stale(ours) is None
    other = {"identity": {**ours["identity"], "executable": "/usr/bin/python9"}}
    assert server.why_stale(other) == "the client's setup differs (executable)"
    module.write_text("X = 22\n")
    assert server.why_stale(ours) == f"{module} changed since it was loaded"
    module.write_text("X = 1\n")
    fresh = served.Server(str(root), str(root / "build"), 10)
    fresh.watch_modules(time.time_ns())  # just written: cannot vouch for what was imported
    assert fresh.stale.endswith("changed within 2 s of being loaded")
    root.rename(tmp_path / "gone")
    root.mkdir()
    server.sigs.clear()
    assert server.why_stale(ours) == "the project folder was removed or replaced"


def test_no_optbuild_cache_outlives_a_build(tmp_path):
    from optbuild.common import plugins, pyimports

    source = tmp_path / "m.py"
    source.write_text("import os\n")
    pyimports.parsed(source, pyimports.file_signature(source))
    plugins.declared("optbuild.test-nothing")
    assert pyimports.parsed.cache_info().currsize and plugins.declared.cache_info().currsize
    session.fresh_caches()
    assert pyimports.parsed.cache_info().currsize == 0 and plugins.declared.cache_info().currsize == 0


def test_what_a_module_remembered_for_the_process_is_forgotten_before_a_build(tmp_path):
    """A damaged lock file is reported once per process: once per build in a server too."""
    import logging

    from optbuild.builder import lockfile

    reports: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: reports.append(record.getMessage())  # whatever the CLI set up before

    def damaged_lock_reported() -> bool:
        (tmp_path / "optbuild.lock").write_text("{ not json")
        reports.clear()
        lockfile.read(tmp_path / "optbuild.lock")
        return any("optbuild.lock" in message for message in reports)

    level = lockfile.log.level
    lockfile.log.addHandler(handler)
    lockfile.log.setLevel(logging.WARNING)  # whatever level an imported library gave the root logger
    try:
        assert damaged_lock_reported()
        assert not damaged_lock_reported()  # once per process
        session.fresh_caches()
        assert damaged_lock_reported()
    finally:
        lockfile.log.removeHandler(handler)
        lockfile.log.setLevel(level)


def test_the_server_switches_do_not_change_the_no_op_stamp(monkeypatch):
    from optbuild.common import noopstamp

    salt = bytes(range(noopstamp.SALT_BYTES))
    before = noopstamp.env_digests(salt)
    for name in ("OPTBUILD_SERVER", "OPTBUILD_SERVER_IDLE_S", "OPTBUILD_DEBUG_SERVER"):
        monkeypatch.setenv(name, "1")
    assert noopstamp.env_digests(salt) == before
    monkeypatch.setenv("OPTBUILD_REMOTE", "file:///x")
    assert noopstamp.env_digests(salt) != before


def test_a_build_that_leaves_a_stalled_transfer_behind_ends_the_server(tmp_path, servers):
    """A remote read that never returns (here: an entry that is a FIFO no one writes) is given
    up after [remote] timeout_s, but its thread stays blocked; an in-process build takes it
    along when it exits, and so does the server, after that build."""
    proj = probe_project(tmp_path / "proj")
    servers.append(proj.root)
    remote = tmp_path / "remote"
    remote.mkdir()
    proj.write("optbuild.toml", proj.read("optbuild.toml") + f'\n[remote]\nurl = "file://{remote}"\ntimeout_s = 1\n')
    time.sleep(RACY_S)
    assert optbuild(proj.root, "build").returncode == 0
    server = wait_for_server(proj.root)
    proj.write("recipes/r.toml", '[steps.p]\nkind = "probe"\ntag = "two"\n')
    key = json.loads(optbuild(proj.root, "explain", "r:p", "--json", env={"OPTBUILD_SERVER": "0"}).stdout)["key"]
    entry = remote / "ac" / key[:2] / f"{key[2:]}.json"
    entry.parent.mkdir(parents=True)
    os.mkfifo(entry)
    stalled = optbuild(proj.root, "build")
    assert stalled.returncode == 0, stalled.stderr
    assert served_by(stalled.stderr) == server["pid"] and "no response for 1s" in stalled.stderr
    assert wait_gone([server["pid"], *fork_server_pids(server)], 20)
    log = Path(server["log"]).read_text()
    assert "stopping: the build left" in log and "thread(s) running (optbuild-remote" in log  # the read, the push


def test_a_same_second_same_size_edit_after_an_import_is_built_as_edited_through_the_server(tmp_path, servers):
    """CPython would take the helper's stale .pyc (same size, same whole-second mtime): the
    server's build must run the code its key names, as an in-process build does."""
    proj = ProjectDir(tmp_path / "proj")
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[kinds]\nscaled = "scaled.py:Scaled"\n')
    proj.write("scaled.py", SCALED_KIND)
    helper = proj.write("scale.py", "SCALE = 21.25\n")
    proj.write("recipes/r.toml", '[steps.s]\nkind = "scaled"\n')
    server = started_server(proj, servers)
    compile_to_pycache(proj.root, "scale")
    edit_within_the_same_second(helper, "21.25", "21.75")
    second = optbuild(proj.root, "build")
    assert second.returncode == 0, second.stderr
    assert served_by(second.stderr) == server["pid"]
    assert proj.read("build/r/s/data.txt") == "21.75", second.stderr


SCALED_KIND = '''
from optbuild.steps.base import Step, StepParams


class Scaled(Step):
    """Writes the SCALE of the project's scale.py."""

    Params = StepParams
    primary_output = "data.txt"

    def run(self, ctx):
        from scale import SCALE

        (ctx.out_dir / "data.txt").write_text(str(SCALE))
'''
