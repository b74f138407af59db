"""The remote cache, against real servers on loopback: moto's S3-compatible server and a
file:// "shared mount". Two project copies with their own local caches play two hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from plugins.remote import (
    cache_event,
    cli,
    local_store,
    outputs,
    start_s3_server,
    step_events,
    warnings,
)

from optbuild import api
from optbuild.builder.report import Reporter
from optbuild.common.errors import ProjectError
from optbuild.common.fingerprint import Fingerprint

SLOW = '\n[steps.slow]\nkind = "join"\ninput = "src"\nsuffix = "-slow"\nsleep = {sleep}\n'
AFTER = '\n[steps.after]\nkind = "join"\ninput = "slow"\nsuffix = "-after"\n'
ALL = ["chain:mid", "chain:out", "chain:side", "chain:src"]


def key_of(project, step: str) -> str:
    return json.loads(project.read("optbuild.lock"))["steps"][step]["key"]


def assert_clean(*projects) -> None:
    """Each local cache re-read from disk: no corrupt blob or entry, no entry missing a blob."""
    for project in projects:
        report = local_store(project).verify()
        assert report.ok, str(report)


# --- sharing ------------------------------------------------------------------------------
def test_a_second_machine_restores_everything_and_runs_no_step(machines, any_remote):
    a = machines("a", any_remote.section())
    b = machines("b", any_remote.section())
    first = a.build()
    assert first.ok and step_events(first, "built") == ALL
    assert cache_event(first.reporter.events)["remote"]["entries_up"] == 4
    assert len(any_remote.keys()) == 4

    second = b.build()
    assert second.ok, second.reporter.events
    assert step_events(second, "running", "built") == []  # nothing executed on B
    assert step_events(second, "restored") == ALL
    stats = cache_event(second.reporter.events)
    assert stats["remote"]["hits"] == 4 and stats["remote"]["errors"] == 0
    assert stats["remote"]["bytes_down"] > 0 and stats["local"] == {"hits": 0, "misses": 4, "unavailable": 0}
    assert outputs(b) == outputs(a) and len(outputs(b)) == 4
    assert warnings(second.reporter.events) == []  # unsigned entries, no key: nothing to check, nothing said
    assert json.loads(b.read("optbuild.lock"))["steps"].keys() == set(ALL)
    assert_clean(b)
    assert any_remote.audit().ok

    again = b.build()  # now a plain local hit: the remote is not asked
    assert step_events(again, "cached") == ALL
    assert cache_event(again.reporter.events)["remote"]["hits"] == 0


def test_another_host_fingerprint_rebuilds_only_the_steps_declaring_it(machines, s3_remote):
    a = machines("a", s3_remote.section())
    b = machines("b", s3_remote.section())
    assert a.build().ok
    other_os = Fingerprint({"os.name": "Plan9"})  # `join` declares host field os.name
    result = b.build(host=other_os)
    assert result.ok
    assert step_events(result, "restored") == ["chain:src"]  # `text` declares no host field
    assert step_events(result, "built") == ["chain:mid", "chain:out", "chain:side"]
    assert len(s3_remote.keys()) == 7  # B wrote its three new keys through
    assert_clean(b)


def test_plan_shows_remote_hits_and_build_no_build_fetches_only(machines, s3_remote):
    a = machines("a", s3_remote.section(), SLOW.format(sleep=0))
    b = machines("b", s3_remote.section(), SLOW.format(sleep=0))
    assert a.build(["chain:out"]).ok  # side and slow are not on the remote
    plan = b.build(dry_run=True)
    assert step_events(plan, "restored") == ["chain:mid", "chain:out", "chain:src"]  # would be
    assert step_events(plan, "would-build") == ["chain:side", "chain:slow"]
    assert not (b.root / "cache" / "stats.jsonl").exists()  # dry runs record nothing

    run = cli(b, "build", "--no-build")
    assert run.returncode == 1
    assert "--no-build: 2 step(s) could not be restored from the local or the remote cache" in run.stderr
    assert "chain:side" in run.stderr and "chain:slow" in run.stderr
    assert (b.root / "build/chain/out/data.txt").read_text() == "hello-mid-out"  # what exists is restored
    assert b.build(["chain:out"], fetch_only=True).ok
    assert "cache: local 3 hits, 0 misses; remote s3://" in cli(b, "build", "chain:out").stderr
    assert not step_events(b.build(["chain:out"]), "running", "built")  # nothing ever ran on B


# --- faults: never fail a build -------------------------------------------------------------
def test_server_stopped_mid_build_builds_the_rest_locally(machines, s3_remote, tmp_path):
    server = start_s3_server()  # a second server on the same data, stopped during B's build
    extra = SLOW.format(sleep=2.0) + AFTER
    a = machines("a", s3_remote.section(), extra)
    b = machines("b", s3_remote.section(max_errors=2).replace(s3_remote.endpoint, server.endpoint), extra)
    assert a.build().ok
    slow_key = key_of(a, "chain:slow")
    s3_remote.delete(s3_remote.entry_path(slow_key))  # so B builds `slow` and we can stop mid-build
    marker = tmp_path / "started"
    proc = b.popen("build", "--json", env={"OPTBUILD_TEST_STARTED": str(marker)})
    deadline = time.time() + 60
    restored = b.root / "build/chain/out/data.txt"  # the steps beside `slow` came from the remote
    while not (marker.exists() and restored.exists()) and time.time() < deadline:
        time.sleep(0.02)
    server.stop()  # while `slow` sleeps: `after` finds the remote gone
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    built = sorted(e["step"] for e in events if e.get("event") == "step" and e["status"] == "built")
    assert built == ["chain:after", "chain:slow"]
    assert any("disabled for the rest of this run" in w for w in warnings(events))
    assert cache_event(events)["remote"]["errors"] >= 1
    assert outputs(b) == outputs(a)
    assert_clean(b)
    assert s3_remote.audit().ok  # nothing half-written on the server


@pytest.mark.parametrize("fault", ["hung", "refused"])
def test_an_unreachable_remote_warns_and_builds_locally(machines, s3_server, request, fault):
    endpoint = request.getfixturevalue("black_hole" if fault == "hung" else "closed_port")
    timeout = 0.5 if fault == "hung" else 5  # refused must fail on its own, long before 5 s
    section = f'[remote]\nurl = "s3://nowhere/cache"\nendpoint_url = "{endpoint}"\ntimeout_s = {timeout}\nmax_errors = 2\n'
    b = machines("b", section)
    started = time.perf_counter()
    result = b.build()
    elapsed = time.perf_counter() - started
    assert result.ok and step_events(result, "built") == ALL
    messages = warnings(result.reporter.events)
    assert len(messages) == 3 and "disabled for the rest of this run" in messages[-1]
    assert ("no response for 0.5s" in messages[0]) if fault == "hung" else ("EndpointConnectionError" in messages[0]), messages
    stats = cache_event(result.reporter.events)["remote"]
    assert stats["errors"] >= 2 and stats["disabled"]  # (an upload in flight may fail too)
    assert elapsed < 15


def test_a_flipped_blob_on_the_server_is_rejected_rebuilt_and_repaired(machines, any_remote):
    a = machines("a", any_remote.section(inline_max=0))  # every output a blob of its own
    b = machines("b", any_remote.section())
    assert a.build().ok
    entry = json.loads(any_remote.read(any_remote.entry_path(key_of(a, "chain:mid"))))
    blob = any_remote.blob_path(entry["outputs"]["data.txt"]["digest"])
    data = bytearray(any_remote.read(blob))
    data[0] ^= 0x01
    any_remote.write(blob, bytes(data))
    assert not any_remote.audit().ok

    result = b.build()
    assert result.ok
    assert step_events(result, "built") == ["chain:mid"]  # out's key is unchanged: still restored
    assert step_events(result, "restored") == ["chain:out", "chain:side", "chain:src"]
    assert any("corrupt" in w and "chain:mid" in w for w in warnings(result.reporter.events))
    assert outputs(b) == outputs(a)
    assert_clean(b)
    assert any_remote.audit().ok  # B's rebuild re-uploaded the good bytes


def test_an_entry_naming_a_missing_blob_is_a_miss_and_the_blob_is_restored(machines, s3_remote):
    a = machines("a", s3_remote.section(inline_max=0))
    b = machines("b", s3_remote.section())
    assert a.build().ok
    entry = json.loads(s3_remote.read(s3_remote.entry_path(key_of(a, "chain:out"))))
    s3_remote.delete(s3_remote.blob_path(entry["outputs"]["data.txt"]["digest"]))
    result = b.build()
    assert result.ok and step_events(result, "built") == ["chain:out"]
    assert any("lacks" in w for w in warnings(result.reporter.events))
    assert outputs(b) == outputs(a)
    assert_clean(b)
    assert s3_remote.audit().ok


def test_signed_entries_reject_unsigned_and_wrongly_signed_ones(machines, s3_remote, monkeypatch):
    monkeypatch.setenv("OPTBUILD_KEY", "key-of-the-build-farm")
    signed = s3_remote.section(signing_key_env="OPTBUILD_KEY")
    intruder = machines("intruder", s3_remote.section())  # no key: writes unsigned entries
    assert intruder.build(["chain:mid"]).ok
    b = machines("b", signed)
    result = b.build(["chain:mid"])
    assert result.ok and step_events(result, "built") == ["chain:mid", "chain:src"]  # none unsigned used
    rejected = [w for w in warnings(result.reporter.events) if "not signed" in w]
    assert len(rejected) == 2  # src built locally gives the same bytes, so mid's key matches too
    assert s3_remote.audit("OPTBUILD_KEY").ok  # B replaced them with signed entries

    # an entry altered after signing is badly signed: a key holder neither uses nor keeps it
    key = key_of(b, "chain:mid")
    head, doc = s3_remote.read_entry(key)
    assert head  # signed
    doc["built_on"] = "attacker"
    s3_remote.write_entry(key, head, doc)
    c = machines("c", signed)
    result = c.build(["chain:mid"])
    assert result.ok and step_events(result, "built") == ["chain:mid"]
    messages = warnings(result.reporter.events)
    assert any("entry of chain:mid rejected: it is badly signed: its signature does not match" in w for w in messages)
    assert any("remote entry for chain:mid is badly signed: replaced" in w for w in messages)
    assert not any("signature mismatch" in w or "key differs" in w for w in messages)  # nothing blames C's key
    assert s3_remote.read_entry(key)[1]["built_on"] != "attacker"
    assert s3_remote.audit("OPTBUILD_KEY").ok
    monkeypatch.setenv("OPTBUILD_KEY", "another-key")
    d = machines("d", s3_remote.section(signing_key_env="OPTBUILD_KEY", write=False))
    result = d.build(["chain:src"])
    assert result.ok and step_events(result, "built") == ["chain:src"]
    monkeypatch.setenv("OPTBUILD_KEY", "key-of-the-build-farm")
    e = machines("e", signed)
    result = e.build(["chain:mid"])
    assert result.ok and step_events(result, "restored") == ["chain:mid", "chain:src"]  # C's entry replaced the altered one
    assert outputs(e) == outputs(b)
    assert_clean(b, c, d, e)


@pytest.mark.parametrize("damage", ["dotdot", "absolute", "digest", "key"])
def test_a_malicious_entry_is_rejected_and_writes_nothing_outside(machines, file_remote, tmp_path, damage):
    a = machines("a", file_remote.section())
    b = machines("b", file_remote.section())
    assert a.build(["chain:src"]).ok
    key = key_of(a, "chain:src")
    doc = json.loads(file_remote.read(file_remote.entry_path(key)))
    output = doc["outputs"].pop("data.txt")
    if damage == "dotdot":
        doc["outputs"]["../../../escaped.txt"] = output
    elif damage == "absolute":
        doc["outputs"][str(tmp_path / "escaped.txt")] = output
    elif damage == "digest":
        doc["outputs"]["data.txt"] = {"digest": "../../../../etc/passwd", "size": 1}
    else:
        doc["outputs"]["data.txt"] = output
        doc["key"] = "0" * 31 + "/"
    file_remote.write(file_remote.entry_path(key), json.dumps(doc).encode())
    result = b.build(["chain:src"])
    assert result.ok and step_events(result, "built") == ["chain:src"]
    assert any("rejected" in w for w in warnings(result.reporter.events))
    assert not list(tmp_path.rglob("escaped.txt"))
    assert_clean(b)
    assert file_remote.audit().ok  # B's build replaced the bad entry


def test_two_builders_pushing_the_same_keys_at_once_leave_the_remote_consistent(machines, any_remote):
    extra = SLOW.format(sleep=0.3)
    a = machines("a", any_remote.section(), extra)
    b = machines("b", any_remote.section(), extra)
    procs = [m.popen("build", "--json") for m in (a, b)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert any_remote.audit().ok
    assert len(any_remote.keys()) == 5
    c = machines("c", any_remote.section(), extra)
    result = c.build()
    assert result.ok and step_events(result, "running", "built") == []
    assert outputs(c) == outputs(a) == outputs(b)


# --- commands -----------------------------------------------------------------------------
def test_push_pull_and_deploy_host_staging(machines, s3_remote, tmp_path):
    section = s3_remote.section(inline_max=0)  # blobs transferred one by one, with progress lines
    a = machines("a", section)
    assert cli(a, "build", "--no-remote").returncode == 0  # built locally only
    assert s3_remote.keys() == []
    assert "no remote cache" in cli(a, "cache", "push", "--no-remote").stderr
    pushed = cli(a, "cache", "push", "chain:out")
    assert pushed.returncode == 0, pushed.stderr
    assert "pushed 3" in pushed.stdout  # out with its ancestors mid and src
    assert "↑ chain:src data.txt" in pushed.stderr  # plain progress lines off a terminal
    assert "pushed 1, 3 on the remote already" in cli(a, "cache", "push").stdout
    assert len(s3_remote.keys()) == 4

    # a deploy host whose fingerprint differs: CI builds for it, a staging host pulls for it
    fingerprint = tmp_path / "deploy-host.json"
    fingerprint.write_text(json.dumps({"fields": {"os.name": "Plan9"}}))
    assert a.build(host=Fingerprint.load(fingerprint)).ok  # written through to the remote
    stage = machines("stage", section)
    pulled = cli(stage, "cache", "pull", "--fingerprint", str(fingerprint))
    assert pulled.returncode == 0, pulled.stderr
    assert "pulled 4" in pulled.stdout and "↓ chain:mid data.txt" in pulled.stderr
    assert not (stage.root / "build").exists()  # pull fills the cache, restores nothing
    ws = api.open_workspace(stage.root, remote=False)
    try:
        local = api.build(ws, host=Fingerprint.load(fingerprint), fetch_only=True, reporter=Reporter())
    finally:
        ws.close()
    assert local.ok and step_events(local, "cached") == ALL  # the deploy host needs no network

    fresh = machines("fresh", section)
    fresh.write("data/input.txt", "changed")
    pulled = cli(fresh, "cache", "pull")
    assert pulled.returncode == 1 and "missing  chain:src" in pulled.stderr

    stats = cli(a, "cache", "stats")
    assert stats.returncode == 0 and "push" in stats.stdout and "all 4 runs" in stats.stdout
    data = json.loads(cli(a, "cache", "stats", "--json").stdout)
    assert data["totals"]["remote"]["bytes_up"] > 0 and data["totals"]["local"]["hits"] == 1  # src, in the build for the deploy host
    audit = cli(a, "cache", "audit", "--rehash")
    assert audit.returncode == 0 and "checked 7 entries" in audit.stdout  # 4 + 3 for the deploy host


def test_overrides_and_configuration(machines, file_remote, tmp_path, monkeypatch):
    a = machines("a", file_remote.section())

    def remote_url(*args: str) -> str | None:
        result = cli(a, "build", *args)
        assert result.returncode == 0
        line = [x for x in result.stderr.splitlines() if x.startswith("cache:")]
        return line[0].split("; remote ")[1].split(": ")[0] if line and "; remote " in line[0] else None

    assert remote_url() == file_remote.url
    assert remote_url("--no-remote") is None
    other = tmp_path / "other-remote"
    other.mkdir()  # optbuild creates no remote folder
    assert remote_url("--remote", f"file://{other}") == f"file://{other}"
    monkeypatch.setenv("OPTBUILD_REMOTE", "off")
    assert remote_url() is None
    monkeypatch.setenv("OPTBUILD_REMOTE", str(other))
    assert remote_url() == str(other)
    assert remote_url("--remote", file_remote.url) == file_remote.url  # the flag wins
    monkeypatch.delenv("OPTBUILD_REMOTE")

    bad = machines("bad", '[remote]\nurl = "s3://b/c"\nsigning_key_env = "hunter2 is my key"\n'
                          'options = { secret = "x" }\n')
    with pytest.raises(ProjectError) as info:
        api.open_workspace(bad.root)
    text = str(info.value)
    assert "remote.signing_key_env" in text and "NAME of an environment variable" in text
    assert "credentials do not belong in optbuild.toml" in text

    monkeypatch.delenv("OPTBUILD_UNSET_KEY", raising=False)
    unused = tmp_path / "unused-remote"
    unset = machines("unset", f'[remote]\nurl = "file://{unused}"\nsigning_key_env = "OPTBUILD_UNSET_KEY"\n')
    result = unset.build()
    assert result.ok and step_events(result, "built") == ALL
    assert any("$OPTBUILD_UNSET_KEY, which is not set" in w for w in warnings(result.reporter.events))
    assert not unused.exists()  # nothing unsigned was written either


def test_a_cached_build_with_a_remote_does_not_import_fsspec(machines, s3_remote):
    a = machines("a", s3_remote.section())
    assert a.build().ok
    code = ("import sys; from optbuild.cli import main; rc = main(['build']); "
            "print(rc, 'fsspec' in sys.modules, 's3fs' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=a.root, capture_output=True, text=True, check=False,
                          env={**os.environ}, timeout=60)
    assert proc.stdout.split() == ["0", "False", "False"], proc.stderr


def test_a_file_remote_whose_folder_does_not_exist_is_an_error_and_is_never_created(machines, tmp_path):
    """An unmounted share: a folder made in its place would collect what belongs on the share,
    and the build would report the remote as working."""
    share = tmp_path / "unmounted-share"
    for url in (f"file://{share}/cache", f"{share}/cache"):  # a URL, or a plain path
        a = machines(f"a{len(url)}", f'[remote]\nurl = "{url}"\n')
        result = a.build()
        assert result.ok and step_events(result, "built") == ALL  # the remote is off; the build goes on
        first = warnings(result.reporter.events)[0]
        assert first.startswith(f"remote {url}: ") and "RemoteMissing" in first
        assert f"the remote cache's folder {share}/cache does not exist (is its share mounted?): create it" in first
        assert cache_event(result.reporter.events)["remote"]["disabled"]
        audit = cli(a, "cache", "audit")
        assert audit.returncode == 1 and f"the remote cache's folder {share}/cache does not exist" in audit.stdout
        assert not share.exists()

    (share / "cache").mkdir(parents=True)  # mounted
    result = machines("b", f'[remote]\nurl = "file://{share}/cache"\n').build()
    assert result.ok and warnings(result.reporter.events) == []
    assert cache_event(result.reporter.events)["remote"]["entries_up"] == 4
