"""Build without the bytes: on the dask executor, what a node builds goes up to the remote
cache once, the nodes read their inputs from there, and this host downloads only the outputs
asked for (the steps named, else each chain's last steps; `download = "all"` brings all).
Counted by the build's own transfer counts, on a loopback cluster and S3 server."""

from __future__ import annotations

import pytest
from daskfarm import build, dask_project
from plugins.remote import outputs

from optbuild.builder import lockfile, remotehit

pytestmark = pytest.mark.timeout(90)

CHAIN = """\
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.a]
kind = "join"
input = "src"
suffix = "-a"

[steps.b]
kind = "join"
input = "a"
suffix = "-b"

[steps.side]
kind = "join"
input = "src"
suffix = "-side"
"""


def project(tmp_path, farm, remote, name="coordinator"):
    return dask_project(tmp_path, farm, remote, CHAIN, name)


def output_digests(proj, *steps: str) -> dict[str, str]:
    """The digest of each named step's data.txt, as optbuild.lock records it."""
    lock = lockfile.read(proj.root / "optbuild.lock")
    return {sid: lock[sid]["outputs"]["data.txt"] for sid in steps}


def test_only_the_last_steps_outputs_come_to_this_host_and_each_crosses_up_once(tmp_path, farm, farm_remote):
    proj = project(tmp_path, farm, farm_remote)
    result = build(proj)
    assert result.ok, (result.reporter.events, farm.logs())
    assert sorted(result.steps("built")) == ["farm:a", "farm:b", "farm:side", "farm:src"]
    # the ends of the chains (b, side) are here; src and a stay on the remote, which the nodes read
    assert sorted(outputs(proj)) == ["farm/b/data.txt", "farm/side/data.txt"]
    assert outputs(proj)["farm/b/data.txt"] == b"hello-a-b"
    assert {sid for sid, o in result.outcomes.items() if o.remote_only} == {"farm:src", "farm:a"}
    digests = output_digests(proj, "farm:src", "farm:a", "farm:b", "farm:side")
    moved = result.transfers
    for sid, digest in digests.items():  # every output went up once, from the node that built it
        assert moved[digest]["up"] == 1, (sid, moved[digest])
        assert moved[digest]["down_max"] <= 1, (sid, moved[digest])  # no host fetched it twice
    assert moved[digests["farm:b"]]["down_here"] == 1 and moved[digests["farm:side"]]["down_here"] == 1
    assert moved[digests["farm:src"]]["down_here"] == 0 and moved[digests["farm:a"]]["down_here"] == 0
    # the lock file records every step, those left on the remote included
    assert set(lockfile.read(proj.root / "optbuild.lock")) == set(digests)

    # nothing changed: the steps left on the remote are found there, and nothing is downloaded
    again = build(proj)
    assert again.ok and sorted(again.steps("cached")) == ["farm:b", "farm:side"]
    assert sorted(again.steps("restored")) == ["farm:a", "farm:src"]
    assert all(t["down_here"] == 0 and t["up"] == 0 for t in again.transfers.values()), again.transfers

    # asked for all: everything comes here, from the remote, once
    every = build(proj, download="all")
    assert every.ok and sorted(every.steps("restored")) == ["farm:a", "farm:src"]
    assert sorted(outputs(proj)) == ["farm/a/data.txt", "farm/b/data.txt", "farm/side/data.txt", "farm/src/data.txt"]
    assert every.transfers[digests["farm:a"]]["down_here"] == 1


def test_a_named_step_comes_here_and_a_step_left_on_the_remote_leaves_no_stale_outputs(tmp_path, farm, farm_remote):
    proj = project(tmp_path, farm, farm_remote)
    assert build(proj, download="all").ok
    assert outputs(proj)["farm/a/data.txt"] == b"hello-a"
    proj.write("data/input.txt", "bye")
    # a named step comes here though another step reads it
    named = build(proj, ["farm:a", "farm:b"])
    assert named.ok, named.reporter.events
    assert outputs(proj)["farm/a/data.txt"] == b"bye-a" and outputs(proj)["farm/b/data.txt"] == b"bye-a-b"
    assert "farm/src/data.txt" not in outputs(proj)  # its old output went: build/ shows no stale file
    proj.write("data/input.txt", "again")
    assert build(proj).ok
    assert "farm/a/data.txt" not in outputs(proj)  # left on the remote this time: emptied, not stale
    assert outputs(proj)["farm/b/data.txt"] == b"again-a-b"


def test_outputs_a_host_built_itself_reach_the_nodes_though_their_entries_carry_them(tmp_path, farm, farm_remote):
    """A host building on its own writes small outputs inside their entries; a node reads a
    blob by its digest, so the coordinator stores such an output as a blob for the nodes."""
    laptop = project(tmp_path, farm, farm_remote, "laptop")
    assert build(laptop, ["farm:src"], executor="local").ok
    proj = project(tmp_path, farm, farm_remote)
    result = build(proj)
    assert result.ok, (result.reporter.events, farm.logs())
    assert result.steps("restored") == ["farm:src"] and not result.outcomes["farm:src"].remote_only
    assert sorted(result.steps("built")) == ["farm:a", "farm:b", "farm:side"]
    assert outputs(proj)["farm/b/data.txt"] == b"hello-a-b"


def test_a_local_build_brings_every_output(tmp_path, farm, farm_remote):
    """Without the bytes applies only where nodes build: a local build needs its inputs here."""
    proj = project(tmp_path, farm, farm_remote)
    local = build(proj, executor="local")
    assert local.ok and sorted(outputs(proj)) == [f"farm/{s}/data.txt" for s in ("a", "b", "side", "src")]
    assert not any(o.remote_only for o in local.outcomes.values())


@pytest.mark.parametrize("listed", [False, True], ids=["asked-per-blob", "listed-once"])
def test_an_output_evicted_from_the_remote_is_built_again_not_a_failed_transfer(tmp_path, farm, farm_remote,
                                                                               monkeypatch, listed):
    """An output left on the remote is trusted only while the remote still holds its blob:
    one evicted there (a gc on the remote) is built again for the step that reads it. A
    run of a few steps asks per blob; one of many lists the remote's blobs once."""
    monkeypatch.setattr(remotehit, "LIST_REMOTE_FROM", 1 if listed else 10_000)
    proj = project(tmp_path, farm, farm_remote)
    assert build(proj).ok
    evicted = output_digests(proj, "farm:a")["farm:a"]
    farm_remote.delete(farm_remote.blob_path(evicted))
    for node_cache in farm.folder.glob("cache-*"):  # nor does any node keep a copy
        (node_cache / "cas" / evicted[:2] / evicted[2:]).unlink(missing_ok=True)
    proj.write("recipes/farm.toml", CHAIN.replace('suffix = "-b"', 'suffix = "-B"'))  # b reads a again
    again = build(proj)
    assert again.ok, (again.reporter.events, farm.logs())
    assert "farm:a" in again.steps("built") and "farm:b" in again.steps("built")
    (warned,) = [e["message"] for e in again.reporter.events if e.get("event") == "warning"]
    assert f"entry of farm:a not used: it names blob {evicted[:8]}" in warned and "the remote lacks" in warned
    assert outputs(proj)["farm/b/data.txt"] == b"hello-a-B"
    assert farm_remote.read(farm_remote.blob_path(evicted)) == b"hello-a"  # put back by the node that built it
