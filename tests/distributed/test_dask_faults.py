"""Faults of the dask executor: a node, or the coordinator, killed (SIGKILL) in the middle
of a step."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from daskfarm import make_project, start_cluster

from optbuild import api
from optbuild.builder import lockfile
from optbuild.builder.report import Reporter
from optbuild.common.digest import FileHasher
from optbuild.store.local import LocalStore

pytestmark = pytest.mark.timeout(60)

RECIPE = """\
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.engine]
kind = "bound"
input = "src"
field = "gpu.0.compute_capability"
value = "9.0"
sleep = 2.0
"""


def test_a_node_killed_mid_step_the_step_is_retried_on_another_matching_node(tmp_path, s3_server, s3_remote):
    marker = tmp_path / "started"
    cluster = start_cluster(tmp_path / "farm", {"h1": 1, "h2": 1, "cpu": 1}, s3_remote,
                            env={"OPTBUILD_TEST_STARTED": str(marker)},
                            fingerprints={"h1": "hopper", "h2": "hopper"})
    try:
        proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{cluster.address}"\n',
                            remote=s3_remote.section(), recipe=RECIPE)
        builder, box = _build_in_thread(proj)
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text().strip()):
            assert time.monotonic() < deadline and builder.is_alive(), cluster.logs()
            time.sleep(0.05)
        victim = int(marker.read_text().split()[0])  # the node running the step (its worker's parent)
        killed = next(name for name, proc in cluster.nodes.items() if proc.pid == victim)
        os.kill(victim, signal.SIGKILL)
        builder.join(45)
        assert not builder.is_alive()
        result = box["result"]
        assert result.ok, (result.reporter.events, cluster.logs())
        assert sorted(result.steps("built")) == ["farm:engine", "farm:src"]
        lock = lockfile.read(proj.root / "optbuild.lock")
        assert lock["farm:engine"]["node"] == ({"h1", "h2"} - {killed}).pop()
        assert len(marker.read_text().splitlines()) == 2  # started twice: once on each node
        # nothing partial, nothing corrupt: the remote holds the two entries, every blob intact
        assert len(s3_remote.keys()) == 2
        assert s3_remote.audit().ok
        assert LocalStore(proj.root / "cache", FileHasher(None)).verify().ok
        assert (proj.root / "build/farm/engine/data.txt").read_text() == "hello@gpu.0.compute_capability=9.0"
    finally:
        cluster.stop()


def _build_in_thread(proj) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        ws = api.open_workspace(proj.root)
        try:
            box["result"] = api.build(ws, reporter=Reporter())
        finally:
            ws.close()

    builder = threading.Thread(target=run)
    builder.start()
    return builder, box


def test_the_only_matching_node_killed_mid_step_fails_the_step_instead_of_waiting_forever(
        tmp_path, s3_server, file_remote, monkeypatch):
    from optbuild.distributed import builder

    monkeypatch.setattr(builder, "NODE_GONE_S", 1.0)
    marker = tmp_path / "started"
    cluster = start_cluster(tmp_path / "farm", {"hopper": 1, "cpu": 1}, file_remote,
                            env={"OPTBUILD_TEST_STARTED": str(marker)})
    try:
        proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{cluster.address}"\n',
                            remote=file_remote.section(), recipe=RECIPE)
        builder, box = _build_in_thread(proj)
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text().strip()):
            assert time.monotonic() < deadline and builder.is_alive(), cluster.logs()
            time.sleep(0.05)
        os.kill(int(marker.read_text().split()[0]), signal.SIGKILL)
        builder.join(30)
        assert not builder.is_alive()
        result = box["result"]
        assert result.steps("failed") == ["farm:engine"]
        error = result.outcomes["farm:engine"].error
        assert "no connected node can build it any more" in error and "gpu.0.compute_capability=9.0" in error
        assert file_remote.keys() == [result.outcomes["farm:src"].key]
        assert file_remote.audit().ok
    finally:
        cluster.stop()


def test_the_coordinator_killed_mid_step_leaves_nothing_corrupt_and_the_next_build_finishes(
        tmp_path, file_remote):
    marker = tmp_path / "started"
    cluster = start_cluster(tmp_path / "farm", {"hopper": 1, "cpu": 1}, file_remote,
                            env={"OPTBUILD_TEST_STARTED": str(marker)})
    try:
        proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{cluster.address}"\n',
                            remote=file_remote.section(), recipe=RECIPE)
        coordinator = proj.popen("build")
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text().strip()):
            assert time.monotonic() < deadline and coordinator.poll() is None, cluster.logs()
            time.sleep(0.05)
        coordinator.kill()
        coordinator.communicate(timeout=10)
        assert LocalStore(proj.root / "cache", FileHasher(None)).verify().ok
        assert file_remote.audit().ok
        builder, box = _build_in_thread(proj)
        builder.join(45)
        done = box["result"]
        assert done.ok, (done.reporter.events, cluster.logs())
        assert sorted(done.steps("cached") + done.steps("restored") + done.steps("built")) == ["farm:engine", "farm:src"]
        assert (proj.root / "build/farm/engine/data.txt").read_text() == "hello@gpu.0.compute_capability=9.0"
        assert LocalStore(proj.root / "cache", FileHasher(None)).verify().ok
        assert file_remote.audit().ok
    finally:
        cluster.stop()
