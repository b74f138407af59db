"""A remote hit settles on its entry: the steps after it are decided from the digests its
entry names while its outputs download, so that a fresh host restoring a long chain pays a
round trip a step, not a download and a store. What reads the outputs waits for them, and a
step whose download fails and that builds here with other outputs has the steps decided from
its entry decided again."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import pytest
from plugins.projects import CONFIG, ProjectDir
from plugins.remote import outputs, step_events, warnings

from optbuild.builder.outcome import Options, Outcome
from optbuild.builder.restore import Restorer
from optbuild.builder.status import Status
from optbuild.builder.walk import FETCHERS, Fetch, Settled, Walk
from optbuild.project.graph import StepGraph
from optbuild.project.recipe import load_project

LINKS = 70  # more than remotehit's LIST_REMOTE_FROM: a run that lists the remote once


def chain(first_input: str, links: int = LINKS) -> str:
    """``c1`` .. ``c<links>``, each joining the one before and a suffix."""
    return "".join(f'\n[steps.c{i}]\nkind = "join"\ninput = "{f"c{i - 1}" if i > 1 else first_input}"\n'
                   f'suffix = "-{i}"\n' for i in range(1, links + 1))


def digest_on_remote(project: ProjectDir, remote, step: str) -> str:
    """The digest of ``step``'s main output, as the remote's entry of its key names it."""
    key = json.loads(project.read("optbuild.lock"))["steps"][step]["key"]
    return json.loads(remote.read(remote.entry_path(key)))["outputs"]["data.txt"]["digest"]


def walk_of(project, outcomes: dict[str, Outcome], decide) -> Walk:
    """The walk of ``project`` deciding each step by ``decide``, its outcomes recorded in
    ``outcomes`` (the scheduler's part, reduced to that)."""
    def run_step(sid, action):
        result = action(project.steps[sid])
        return finish(sid, result) if isinstance(result, Outcome) else result

    def finish(sid, outcome):
        outcomes[sid] = outcome
        return outcome

    return Walk(project, StepGraph(project.steps), Options(), outcomes, decide, run_step, finish,
                contextlib.nullcontext, lambda: None)


def test_a_fresh_host_restores_a_long_chain_and_builds_the_step_that_reads_its_end(machines, s3_remote):
    a = machines("a", s3_remote.section(), chain("out"))
    assert a.build().ok
    tail = '\n[steps.tail]\nkind = "join"\ninput = "c70"\nsuffix = "-tail"\n'
    b = machines("b", s3_remote.section(), chain("out") + tail)

    result = b.build()
    assert result.ok
    assert step_events(result, "built") == ["chain:tail"]  # it waited for c70's outputs to download
    assert len(step_events(result, "restored")) == 4 + LINKS
    assert b.read("build/chain/tail/data.txt") == a.read("build/chain/c70/data.txt") + "-tail"
    assert {k: v for k, v in outputs(b).items() if not k.startswith("chain/tail/")} == outputs(a)
    again = b.build()
    assert again.ok and len(step_events(again, "cached")) == 5 + LINKS


def test_a_step_rebuilt_with_other_outputs_than_its_entry_has_its_dependents_decided_again(machines, file_remote):
    noisy = CONFIG.replace('[kinds]\n', '[kinds]\nnoise = "kinds.py:Noise"\n')
    steps = '\n[steps.noise]\nkind = "noise"\ninput = "out"\n' + chain("noise")
    a = machines("a", file_remote.section(), steps)
    a.write("optbuild.toml", noisy + file_remote.section(inline_max=0))  # its blobs apart from entries
    assert a.build().ok
    b = machines("b", file_remote.section(), steps)
    b.write("optbuild.toml", noisy + file_remote.section())
    blob = file_remote.blob_path(digest_on_remote(a, file_remote, "chain:noise"))
    data = bytearray(file_remote.read(blob))
    data[0] ^= 0x01  # B's download of it fails, so B builds it, with another token
    file_remote.write(blob, bytes(data))

    result = b.build()
    assert result.ok
    mine = b.read("build/chain/noise/data.txt")
    assert mine != a.read("build/chain/noise/data.txt")
    assert b.read("build/chain/c70/data.txt") == mine + "".join(f"-{i}" for i in range(1, LINKS + 1))
    assert any("decided again" in w and "chain:noise" in w for w in warnings(result.reporter.events))
    assert "chain:c1" in step_events(result, "built")
    again = b.build()  # what the lock file and the caches say now is what this build made
    assert again.ok and step_events(again, "built", "restored") == []


def test_the_steps_after_a_settled_hit_are_decided_while_its_outputs_download(tmp_path):
    """``src`` settles on its entry; ``c1``, which builds from its outputs, is decided before
    they are downloaded, and starts only after."""
    proj = ProjectDir.with_test_kinds(tmp_path / "p")
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/chain.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n' + chain("src", 2))
    project = load_project(proj.root)
    outcomes: dict[str, Outcome] = {}
    c1_decided, downloaded = threading.Event(), threading.Event()

    def download(spec) -> Outcome:
        if not c1_decided.wait(10):
            return Outcome(Status.FAILED, "k", error="c1 was not decided while src downloaded")
        time.sleep(0.3)  # a download that takes a while
        downloaded.set()
        return Outcome(Status.RESTORED, "k", source="remote")

    def build(spec) -> Outcome:
        return Outcome(Status.BUILT if downloaded.is_set() else Status.FAILED, "k")

    def decide(spec):
        if spec.id == "chain:src":
            return Fetch(lambda spec: Settled(Outcome(Status.RESTORED, "k", source="remote"), download))
        c1_decided.set()
        return build if spec.id == "chain:c1" else Outcome(Status.CACHED, "k")

    walk_of(project, outcomes, decide).run(list(project.steps), 2)
    assert {sid: o.status for sid, o in outcomes.items()} == {
        "chain:src": Status.RESTORED, "chain:c1": Status.BUILT, "chain:c2": Status.CACHED}


def test_remote_work_is_submitted_no_faster_than_the_fetch_threads_take_it(tmp_path):
    """Forty steps side by side, each a remote hit settled on its entry, then downloaded:
    never more lookups and downloads submitted at once than there are fetch threads (each
    wait scans all that is submitted: thousands of steps made a fresh host's restore
    quadratic), and every step restored."""
    proj = ProjectDir.with_test_kinds(tmp_path / "p")
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/wide.toml", "".join(f'[steps.s{i}]\nkind = "text"\npath = "../data/input.txt"\n'
                                            for i in range(40)))
    project = load_project(proj.root)
    outcomes: dict[str, Outcome] = {}
    submitted: list[int] = []

    def in_flight() -> None:
        submitted.append(len(walk._fetching) + len(walk._downloading))

    def download(spec) -> Outcome:
        in_flight()
        time.sleep(0.005)
        return Outcome(Status.RESTORED, "k", source="remote")

    def fetch(spec) -> Settled:
        in_flight()
        return Settled(Outcome(Status.RESTORED, "k", source="remote"), download)

    walk = walk_of(project, outcomes, lambda spec: Fetch(fetch))
    walk.run(list(project.steps), 2)
    assert len(submitted) == 80 and max(submitted) <= FETCHERS
    assert {o.status for o in outcomes.values()} == {Status.RESTORED} and len(outcomes) == 40


@pytest.mark.parametrize("inline_max, one_at_a_time", [(None, True), (0, False)])
def test_restores_that_wait_on_no_network_run_at_most_one_a_core(machines, file_remote, monkeypatch,
                                                                 inline_max, one_at_a_time):
    """A restore whose outputs all travel in its entry is work for the interpreter alone:
    more of them at once than there are cores only contend for it. One that downloads blobs
    waits on the network: up to FETCHERS at once."""
    fan = "".join(f'\n[steps.f{i}]\nkind = "join"\ninput = "out"\nsuffix = "-{i}"\n' for i in range(LINKS))
    section = file_remote.section() if inline_max is None else file_remote.section(inline_max=inline_max)
    assert machines("a", section, fan).build().ok
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    running, seen, lock = [0], [0], threading.Lock()
    meet = threading.Barrier(2)  # two restores at once meet here; one at a time, the first waits in vain
    restore = Restorer.restore

    def counted(self, *args):
        with lock:
            running[0] += 1
            seen[0] = max(seen[0], running[0])
        try:
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait(timeout=2)
            return restore(self, *args)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(Restorer, "restore", counted)
    result = machines("b", section, fan).build()
    assert result.ok and len(step_events(result, "restored")) == 4 + LINKS
    assert (seen[0] == 1) == one_at_a_time  # on one core (os.cpu_count), as many as fetch threads
