"""The dask executor on a loopback cluster: a scheduler and three `optbuild worker` nodes
with recorded fingerprints (two GPU generations, a CPU-only host), a moto S3 server as the
CAS. Host-keyed steps land on the matching node only, the rest spread; outputs and keys are
those of a local build; a second build is all cached."""

from __future__ import annotations

import io
import json
import os

import daskfarm
import pytest
from daskfarm import FINGERPRINTS, Cluster, build, make_project
from plugins.remote import outputs

from optbuild import api
from optbuild.builder import lockfile
from optbuild.builder.report import PlainReporter
from optbuild.common.fingerprint import Fingerprint

pytestmark = pytest.mark.timeout(60)

RECIPE = """\
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.ampere]
kind = "bound"
input = "src"
field = "gpu.0.compute_capability"
value = "8.0"

[steps.hopper]
kind = "bound"
input = "src"
field = "gpu.0.compute_capability"
value = "9.0"

[steps.cpu]
kind = "bound"
input = "src"
field = "gpu.count"
value = "0"

[steps.both]
kind = "join"
input = "ampere"
other = "hopper"
suffix = "!"
""" + "".join(f'\n[steps.j{i}]\nkind = "join"\ninput = "src"\nsuffix = "-{i}"\nsleep = 0.4\n' for i in range(6))

STEPS = sorted(["farm:src", "farm:ampere", "farm:hopper", "farm:cpu", "farm:both",
                *(f"farm:j{i}" for i in range(6))])


def dask_project(tmp_path, farm: Cluster, remote, name: str = "coordinator", recipe: str = RECIPE):
    return daskfarm.dask_project(tmp_path, farm, remote, recipe, name)


def test_host_keyed_steps_land_on_their_node_and_match_a_local_build(tmp_path, farm, farm_remote):
    proj = dask_project(tmp_path, farm, farm_remote)
    result = build(proj, download="all")  # every output here, to compare with a local build
    assert result.ok, (result.reporter.events, farm.logs())
    assert sorted(result.steps("built")) == STEPS
    lock = lockfile.read(proj.root / "optbuild.lock")
    nodes = {sid: record["node"] for sid, record in lock.items()}
    # each host-keyed step ran on the only node whose fingerprint its key was computed for
    assert nodes["farm:ampere"] == "ampere" and nodes["farm:hopper"] == "hopper" and nodes["farm:cpu"] == "cpu"
    # each forked from a node's fork server, which imported optbuild and the tools once
    assert all(lock[s]["metrics"]["forked"] for s in ("farm:ampere", "farm:hopper", "farm:cpu"))
    assert lock["farm:ampere"]["host"] == {"gpu.0.compute_capability": "8.0"}
    assert lock["farm:cpu"]["host"] == {"gpu.count": 0}
    # the rest spread over the nodes
    assert len({nodes[f"farm:j{i}"] for i in range(6)}) >= 2, nodes
    events = [e for e in result.reporter.events if e.get("event") == "step" and e["status"] == "built"]
    assert {e["step"]: e["node"] for e in events} == nodes
    console = io.StringIO()
    PlainReporter(console).show(next(e for e in events if e["step"] == "farm:ampere"))
    assert console.getvalue().startswith("  built    farm:ampere  ") and console.getvalue().endswith("s on ampere\n")
    assert farm_remote.audit().ok

    # a local build of the same project, one recorded host at a time: the same keys and bytes
    local = make_project(tmp_path / "local", recipe=RECIPE)
    for name in ("ampere", "hopper", "cpu"):
        done = build(local, host=Fingerprint(FINGERPRINTS[name]), skip_unavailable=True)
        assert not done.steps("failed"), done.reporter.events
    local_lock = lockfile.read(local.root / "optbuild.lock")
    # (no single host builds `both`: it takes the outputs of an Ampere step and a Hopper step)
    assert sorted(local_lock) == [s for s in STEPS if s != "farm:both"]
    assert {s: r["key"] for s, r in local_lock.items()} == {s: lock[s]["key"] for s in local_lock}
    assert outputs(local) == {p: b for p, b in outputs(proj).items() if not p.startswith("farm/both/")}
    assert outputs(proj)["farm/ampere/data.txt"] == b"hello@gpu.0.compute_capability=8.0"

    # a second build: all cached, nothing sent to the nodes
    again = build(proj, download="all")
    assert again.ok and sorted(again.steps("cached")) == STEPS

    # another coordinator with an empty local cache: everything comes from the remote
    other = dask_project(tmp_path, farm, farm_remote, name="other")
    third = build(other, download="all")
    assert third.ok and sorted(third.steps("restored")) == STEPS
    assert outputs(other) == outputs(proj)


def test_a_step_no_node_can_build_is_unavailable_naming_what_it_needs(tmp_path, farm, farm_remote):
    recipe = RECIPE + '\n[steps.volta]\nkind = "bound"\ninput = "src"\nfield = "gpu.0.compute_capability"\nvalue = "7.0"\n'
    proj = dask_project(tmp_path, farm, farm_remote, recipe=recipe)
    result = build(proj, ["farm:volta"])
    assert result.steps("unavailable") == ["farm:volta"]
    error = result.outcomes["farm:volta"].error
    assert "no node of the Dask cluster" in error and "gpu.0.compute_capability = 7.0" in error
    assert "ampere: needs" in error and "cpu: needs" in error
    assert result.steps("built") == ["farm:src"]


def test_a_failing_step_reports_its_error_and_log_from_the_node(tmp_path, farm, farm_remote):
    recipe = '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n[steps.bad]\nkind = "join"\ninput = "src"\nfail = true\n'
    proj = dask_project(tmp_path, farm, farm_remote, recipe=recipe)
    result = build(proj)
    assert result.steps("failed") == ["farm:bad"]
    error = result.outcomes["farm:bad"].error
    assert "asked to fail" in error and "(on node " in error
    assert (proj.root / "build/.logs/farm/bad.log").read_text().count("asked to fail") >= 1
    stored = [json.loads(farm_remote.read(farm_remote.entry_path(k)))["step"] for k in farm_remote.keys()]  # noqa: SIM118
    assert stored == ["farm:src"]


def test_with_a_signing_key_a_node_without_it_builds_nothing(tmp_path, farm, farm_remote, monkeypatch):
    monkeypatch.setenv("OPTBUILD_TEST_SIGNING", "farm-secret")  # here, not on the nodes
    recipe = '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
    proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{farm.address}"\n',
                        remote=farm_remote.section(signing_key_env="OPTBUILD_TEST_SIGNING"), recipe=recipe)
    result = build(proj)
    assert result.steps("failed") == ["farm:src"]
    error = result.outcomes["farm:src"].error
    assert "could not build on node" in error and "refused: the build accepts only signed entries and this node holds no signing key" in error
    assert farm_remote.keys() == []


def test_a_node_with_other_tool_versions_than_the_key_says_builds_nothing(tmp_path, farm, farm_remote):
    from optbuild.common.toolchain import Toolchain

    recipe = ('[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n'
              '[steps.mid]\nkind = "join"\ninput = "src"\n')
    proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{farm.address}"\n',
                        remote=farm_remote.section(), recipe=recipe)
    result = build(proj, toolchain=Toolchain({"pydantic": "0.0.1"}))  # what the coordinator keys with
    assert result.steps("built") == ["farm:src"] and result.steps("failed") == ["farm:mid"]
    error = result.outcomes["farm:mid"].error
    assert "has other tool versions than the coordinator (pydantic" in error and "0.0.1 in its key" in error
    assert farm_remote.keys() == [result.outcomes["farm:src"].key]


def test_with_no_jobs_given_a_dask_build_runs_as_many_steps_at_once_as_the_farm_has_slots(tmp_path, farm, farm_remote):
    recipe = '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n'
    proj = dask_project(tmp_path, farm, farm_remote, recipe=recipe)
    proj.write("optbuild.toml", proj.read("optbuild.toml").replace("jobs = 6", "jobs = 0"))

    def jobs(result: api.BuildResult) -> int:
        assert result.ok, result.reporter.events
        return next(e["jobs"] for e in result.reporter.events if e.get("event") == "start")

    assert jobs(build(proj)) == 6  # 3 nodes x 2 threads, not this host's CPUs
    assert jobs(build(proj, executor="local")) == os.cpu_count()
    assert jobs(build(proj, jobs=3)) == 3


def test_a_node_uses_the_blobs_it_holds_instead_of_fetching_them_again(tmp_path, farm, farm_remote):
    from optbuild.common.digest import digest_bytes

    first = ('[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n'
             '[steps.first]\nkind = "bound"\ninput = "src"\nfield = "gpu.count"\nvalue = "0"\n')
    proj = dask_project(tmp_path, farm, farm_remote, recipe=first)
    assert build(proj).ok
    hello = digest_bytes(b"hello")  # src's output, which the cpu node fetched to build `first`
    assert (farm.folder / "cache-cpu" / "cas" / hello[:2] / hello[2:]).is_file()
    farm_remote.write(farm_remote.blob_path(hello), b"HELLO")  # the remote's copy now fails its check
    proj.write("recipes/farm.toml", first + first.split("\n\n")[1].replace("first", "second") + "sleep = 0.01\n")
    result = build(proj)
    assert result.ok, result.reporter.events  # a node without it would refuse the corrupt blob
    assert result.steps("built") == ["farm:second"]
    assert lockfile.read(proj.root / "optbuild.lock")["farm:second"]["node"] == "cpu"
