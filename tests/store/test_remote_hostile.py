"""A hostile or broken remote cache (issue #8): garbage entries, unsafe output names, a
stalled server claiming huge blobs, hosts with the wrong signing key, symbolic links in a
shared folder. Each must end in a warning and a local build, never a crash, a hang, a
write outside the remote or the loss of good signed entries. Real remotes on loopback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from plugins.remote import (
    Remote,
    cache_event,
    cli,
    local_store,
    outputs,
    step_events,
    warnings,
)

from optbuild import api
from optbuild.builder.report import Reporter
from optbuild.builder.runstats import describe_stats
from optbuild.store.entry import MAX_JSON_DEPTH
from optbuild.store.remote import SIGNATURE_PREFIX, Rejected, sign
from optbuild.store.remote.filesystem import transfer_callback

ALL = ["chain:mid", "chain:out", "chain:side", "chain:src"]
KEY_ENV = "OPTBUILD_TEST_SIGNING_KEY"
FARM_KEY = "key-of-the-build-farm"


def key_of(project, step: str) -> str:
    return json.loads(project.read("optbuild.lock"))["steps"][step]["key"]


def plant(remote: Remote, key: str, body: bytes, signing_key: str | None = None) -> None:
    """Store ``body`` as the remote entry of ``key``, signed with ``signing_key`` if given
    (a writer holding the key, or a buggy one: the parser must still survive it)."""
    head = b"" if signing_key is None else SIGNATURE_PREFIX + sign(body, signing_key.encode()).encode() + b"\n"
    remote.write(remote.entry_path(key), head + body)


def offline_build(project, targets: list[str]) -> api.BuildResult:
    """``optbuild build --no-remote TARGETS``, through the API (its events are kept)."""
    ws = api.open_workspace(project.root, remote=False)
    try:
        return api.build(ws, targets, reporter=Reporter())
    finally:
        ws.close()


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (not following links), with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


# --- (3) garbage entries: a warning and a local build on every path, with or without a key ---
GARBAGE = {
    "chain:src": b"[" * 100_000,  # json.loads would raise RecursionError
    "chain:mid": b'{"outputs":' * 50_000 + b"1" + b"}" * 50_000,
    "chain:out": b"\xff\xfe\x00\x00 not JSON at all",
    "chain:side": b'["format", 2, {"outputs": [[[[[[]]]]]]}]',  # JSON, but no entry
}


@pytest.mark.parametrize("where, signed", [("s3", False), ("file", True)])
def test_garbage_entries_are_rejected_on_every_path(machines, request, monkeypatch, where, signed):
    remote: Remote = request.getfixturevalue(f"{where}_remote")
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    section = remote.section(signing_key_env=KEY_ENV) if signed else remote.section()
    a = machines("a", section)
    assert a.build().ok
    signing_key = FARM_KEY if signed else None
    b = machines("b", section)
    reasons = []
    for body in GARBAGE.values():  # each on the root step, the one a dry run can look up
        plant(remote, key_of(a, "chain:src"), body, signing_key)
        plan = b.build(dry_run=True)  # `optbuild plan`
        assert plan.ok and step_events(plan, "would-build") == ALL
        reasons += [w for w in warnings(plan.reporter.events) if "entry of chain:src rejected" in w]
    assert len(reasons) == 4 and f"nests deeper than {MAX_JSON_DEPTH} levels" in reasons[0], reasons

    for step, body in GARBAGE.items():
        plant(remote, key_of(a, step), body, signing_key)
    pulled = cli(b, "cache", "pull")
    assert pulled.returncode == 1
    assert all(f"missing  {step}" in pulled.stderr for step in ALL), pulled.stderr
    assert f"entry of chain:src rejected: it nests deeper than {MAX_JSON_DEPTH} levels" in pulled.stderr
    assert list(local_store(b).iter_entries()) == []

    audit = cli(b, "cache", "audit")
    assert audit.returncode == 1 and "PROBLEMS FOUND" in audit.stdout
    assert audit.stdout.count("\n  entry ") == 4, audit.stdout

    fetch_only = cli(b, "build", "--no-build")
    assert fetch_only.returncode == 1
    assert "its remote entry was rejected (it nests deeper than" in fetch_only.stderr
    assert list(local_store(b).iter_entries()) == []

    built = b.build()
    assert built.ok and step_events(built, "built") == ALL
    assert sum("rejected" in w for w in warnings(built.reporter.events)) == 4
    assert cache_event(built.reporter.events)["remote"]["rejected"] == 4
    assert remote.audit(KEY_ENV if signed else None).ok  # B's build replaced the garbage


# --- (4) unsafe output names: rejected, never stored locally ------------------------------------
@pytest.mark.parametrize("name", ["n" * 256 + ".txt", "/".join(["d"] * 2999 + ["data.txt"]),
                                  "data\n.txt", "\x1b[2Jdata.txt"],
                         ids=["long-name", "3000-deep", "newline", "escape"])
def test_an_entry_with_an_unsafe_output_name_is_rejected_and_not_stored(machines, file_remote, name):
    a = machines("a", file_remote.section())
    b = machines("b", file_remote.section())
    assert a.build(["chain:src"]).ok
    key = key_of(a, "chain:src")
    head, doc = file_remote.read_entry(key)
    doc["outputs"] = {name: doc["outputs"]["data.txt"]}
    doc["primary"] = None
    file_remote.write_entry(key, head, doc)

    result = b.build(["chain:src"])
    assert result.ok and step_events(result, "built") == ["chain:src"]
    assert any("entry of chain:src rejected" in w and "output name" in w for w in warnings(result.reporter.events))
    stored = dict(local_store(b).iter_entries())
    assert list(stored) == [key] and list(stored[key].outputs) == ["data.txt"]  # B's own build
    assert [p.name for p in (b.root / "build/chain/src").iterdir()] == ["data.txt"]

    offline = offline_build(b, ["chain:src"])
    assert offline.ok and step_events(offline, "cached") == ["chain:src"]


# --- (5) a stalled remote claiming a huge blob: bounded by timeout_s, whatever the size ----------
def test_a_stalled_remote_claiming_a_huge_blob_does_not_hold_the_build(machines, file_remote):
    timeout = 1
    a = machines("a", file_remote.section(inline_max=0))
    b = machines("b", file_remote.section(timeout_s=timeout))
    assert a.build(["chain:src"]).ok
    key = key_of(a, "chain:src")
    head, doc = file_remote.read_entry(key)
    digest = doc["outputs"]["data.txt"]["digest"]
    doc["outputs"]["data.txt"]["size"] = 1 << 50  # a petabyte: the old allowance was 34 years
    file_remote.write_entry(key, head, doc)
    fifo = file_remote.blob_path(digest)  # opening it blocks, like a read from a hung network mount
    os.remove(fifo)
    os.mkfifo(fifo)
    done: dict = {}
    builder = threading.Thread(target=lambda: done.setdefault("result", b.build(["chain:src"])), daemon=True)
    started = time.perf_counter()
    try:
        builder.start()
        builder.join(timeout + 15)
        elapsed = time.perf_counter() - started
        assert not builder.is_alive(), "the build hung on the stalled remote"
    finally:  # let the abandoned reader thread go, if it still waits
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            assert exc.errno in (errno.ENXIO, errno.ENOENT)  # no reader left, or replaced
    result = done["result"]
    assert result.ok and step_events(result, "built") == ["chain:src"]
    assert any(f"no response for {timeout}s" in w for w in warnings(result.reporter.events))
    assert elapsed < timeout + 5


def test_a_download_growing_past_its_recorded_size_is_stopped_as_bytes_arrive():
    """What a driver without a Content-Length (chunked) reports: set_size(None), then bytes."""
    seen: list[int] = []
    callback = transfer_callback(seen.append, expected=10)
    callback.set_size(None)
    callback.relative_update(8)
    with pytest.raises(Rejected, match="larger than the 10 bytes recorded"):
        callback.relative_update(8)
    assert seen == [0, 8]


# --- (8) the wrong signing key, or none, never replaces good signed entries -----------------------
def test_a_host_with_another_key_or_none_leaves_signed_entries_alone(machines, s3_remote, monkeypatch):
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    signed = s3_remote.section(signing_key_env=KEY_ENV, inline_max=0)  # a blob of its own for each output and log
    farm = machines("farm", signed)
    assert farm.build().ok
    keys = {step: key_of(farm, step) for step in ALL}
    good = {step: s3_remote.read(s3_remote.entry_path(key)) for step, key in keys.items()}
    plant(s3_remote, keys["chain:side"], b'{"unsigned": "garbage"}')  # may be replaced

    monkeypatch.setenv(KEY_ENV, "a-key-someone-mistyped")
    wrong = machines("wrong", signed)
    result = wrong.build()
    assert result.ok and step_events(result, "built") == ALL
    messages = warnings(result.reporter.events)
    mismatch = "is signed with another key than this host's ($OPTBUILD_TEST_SIGNING_KEY), or its key id was altered"
    assert sum(mismatch in w and "left in place, and this host's entry is stored beside it" in w
               for w in messages) == 3, messages
    assert cache_event(result.reporter.events)["remote"]["signature_mismatches"] == 3
    for step in ("chain:mid", "chain:out", "chain:src"):
        assert s3_remote.read(s3_remote.entry_path(keys[step])) == good[step]
    head, _doc = s3_remote.read_entry(keys["chain:side"])
    assert head  # the garbage was replaced by an entry signed with the wrong host's key
    assert "3 signature mismatches" in describe_stats(cache_event(result.reporter.events))
    stats = cli(wrong, "cache", "stats")
    assert "warning: 3 signature mismatches" in stats.stdout
    assert json.loads(cli(wrong, "cache", "stats", "--json").stdout)["totals"]["remote"]["signature_mismatches"] == 3
    again = machines("wrong-again", signed)  # the wrong key's entries lie beside the farm's: no build loop
    result = again.build()
    assert result.ok and step_events(result, "restored") == ALL
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    result = machines("farm-again", signed).build()  # side's entry is now the wrong key's: built once, beside it
    assert result.ok and step_events(result, "restored") == ["chain:mid", "chain:out", "chain:src"]
    assert step_events(result, "built") == ["chain:side"]
    result = machines("farm-third", signed).build()
    assert result.ok and step_events(result, "restored") == ALL

    monkeypatch.delenv(KEY_ENV)
    unsigned = machines("unsigned", s3_remote.section())
    s3_remote.delete(s3_remote.blob_path(json.loads(good["chain:src"].split(b"\n", 1)[1])["log"]))
    result = unsigned.build(["chain:src"])  # the entry lacks a blob: built here, not written back
    assert result.ok and step_events(result, "built") == ["chain:src"]
    assert any("not replacing the signed entry of chain:src with an unsigned one" in w
               for w in warnings(result.reporter.events))
    assert s3_remote.read(s3_remote.entry_path(keys["chain:src"])) == good["chain:src"]


UNCHECKED = "its entries are signed, but this host has no signing key, so it cannot check their signatures"


@pytest.mark.parametrize("where", ["s3", "file"])
def test_a_host_without_a_key_that_reads_signed_entries_says_once_that_it_cannot_check_them(
        machines, request, monkeypatch, where):
    remote = request.getfixturevalue(f"{where}_remote")
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    assert machines("farm", remote.section(signing_key_env=KEY_ENV)).build().ok
    monkeypatch.delenv(KEY_ENV)
    result = machines("keyless", remote.section()).build()
    assert result.ok and step_events(result, "restored") == ALL  # used, as before: unchecked
    told = [w for w in warnings(result.reporter.events) if UNCHECKED in w]
    assert len(told) == 1, told  # once a build, not once an entry
    assert "set [remote] signing_key_env in optbuild.toml to the NAME of the environment variable" in told[0]
    assert told[0].startswith(f"remote {remote.url}")
    audit = cli(machines("auditor", remote.section()), "cache", "audit")
    assert audit.stderr.count(UNCHECKED) == 1, audit.stderr


# --- (16a) --no-build names an unreachable remote as such ---------------------------------------
def test_no_build_says_the_remote_could_not_be_reached(machines, s3_server, closed_port):
    section = f'[remote]\nurl = "s3://nowhere/cache"\nendpoint_url = "{closed_port}"\ntimeout_s = 5\n'
    b = machines("b", section)
    run = cli(b, "build", "--no-build")
    assert run.returncode == 1
    assert "chain:src  (never built; the remote cache could not be reached (EndpointConnectionError" in run.stderr
    plan = b.build(dry_run=True)
    src = next(e for e in plan.reporter.events if e.get("step") == "chain:src")
    assert any("the remote cache could not be reached" in r for r in src["reasons"]), src


# --- (17) symbolic links in a file:// remote never lead a transfer outside it -------------------
@pytest.mark.parametrize("linked", ["cas", "ac", "tmp"])
def test_symlinks_in_a_shared_folder_never_redirect_transfers(machines, file_remote, tmp_path, linked):
    a = machines("a", file_remote.section(inline_max=0))
    b = machines("b", file_remote.section())
    assert a.build(["chain:src"]).ok
    root = Path(file_remote.root)
    key = key_of(a, "chain:src")
    _head, doc = file_remote.read_entry(key)
    outside = tmp_path / "home-of-someone"
    folder = {"cas": root / "cas" / doc["outputs"]["data.txt"]["digest"][:2],
              "ac": root / "ac" / key[:2], "tmp": root / "tmp"}[linked]
    if folder.exists():
        shutil.move(str(folder), str(outside))
    else:
        outside.mkdir()
    folder.symlink_to(outside, target_is_directory=True)
    before = tree(outside)

    result = b.build(["chain:mid"])  # mid is not on the remote: B builds it and uploads it
    assert result.ok
    built = step_events(result, "built")
    assert built == (["chain:mid"] if linked == "tmp" else ["chain:mid", "chain:src"])  # src read through the link: no
    messages = warnings(result.reporter.events)
    assert any("leads outside the remote's folder" in w for w in messages), messages
    assert cache_event(result.reporter.events)["remote"]["rejected"] >= 1
    assert tree(outside) == before  # nothing written, replaced or renamed out there


# --- a forged signature costs key holders one build, and the warning blames the entry -----------
FORGERIES = {  # what someone with write access and no key makes of a signature line
    "hmac zeroed": lambda prefix, kid: prefix + b" " + kid + b" " + b"0" * 64 + b"\n",
    "line zeroed": lambda prefix, kid: prefix + b" " + b"0" * len(kid) + b" " + b"0" * 64 + b"\n",
    "line removed": lambda prefix, kid: b"",
}
BLAMED = {
    "hmac zeroed": "remote entry for chain:mid is badly signed: replaced",
    "line zeroed": "the remote entry of chain:mid is signed with another key than this host's "
                   "($OPTBUILD_TEST_SIGNING_KEY), or its key id was altered: it is left in place, and "
                   "this host's entry is stored beside it",
    "line removed": "remote entry for chain:mid is unsigned: replaced",
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_signature_costs_key_holders_one_build_not_one_per_build(machines, s3_remote, monkeypatch,
                                                                          forgery):
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    signed = s3_remote.section(signing_key_env=KEY_ENV, inline_max=0)  # a blob of its own for each output and log
    farm = machines("farm", signed)
    assert farm.build().ok
    key = key_of(farm, "chain:mid")
    head, doc = s3_remote.read_entry(key)
    prefix, kid, _mac = head.rstrip(b"\n").split(b" ")
    s3_remote.write_entry(key, FORGERIES[forgery](prefix, kid), doc)

    first = machines("first", signed).build()
    assert first.ok and step_events(first, "built") == ["chain:mid"]  # rebuilt: same bytes, so out is restored
    messages = warnings(first.reporter.events)
    assert any(BLAMED[forgery] in w for w in messages), messages
    assert not any("key differs" in w for w in messages)
    assert cache_event(first.reporter.events)["remote"]["entries_up"] == 1  # its signed entry, not "refused"

    again = machines("again", signed).build()
    assert again.ok and step_events(again, "restored") == ALL
    assert warnings(again.reporter.events) == []


# --- cache audit checks each entry against its blobs; what no check can see without a signature ---
def rewire(remote: Remote, project, step: str, to_step: str) -> str:
    """Point ``step``'s remote entry at ``to_step``'s output blob (digest and size), as someone
    with write access to an unsigned remote can; returns the blob's digest."""
    _head, target = remote.read_entry(key_of(project, to_step))
    head, doc = remote.read_entry(key_of(project, step))
    doc["outputs"]["data.txt"] = target["outputs"]["data.txt"]
    remote.write_entry(key_of(project, step), head, doc)
    return target["outputs"]["data.txt"]["digest"]


def test_an_unsigned_entry_rewired_to_another_intact_blob_is_restored_and_audit_says_it_cannot_tell(
        machines, any_remote):
    """The blob is intact and of the size its (rewired) entry records: a restore verifies exactly
    that, so without a signature nothing can tell the lie. The audit says so, and names the blob
    two steps claim."""
    a = machines("a", any_remote.section(inline_max=0))
    assert a.build().ok
    digest = rewire(any_remote, a, "chain:out", "chain:side")

    b = machines("b", any_remote.section())
    assert b.build().ok and outputs(b)["chain/out/data.txt"] == b"hello-side"  # the lie, restored
    audit = cli(b, "cache", "audit", "--rehash")
    assert audit.returncode == 0 and "(sizes and digests): no problem found, unsigned" in audit.stdout
    assert "all intact" not in audit.stdout  # nothing vouches for an unsigned entry
    assert "note: the entries are not signed" in audit.stdout and "cannot be told from a true one" in audit.stdout
    assert f"note: blob {digest} is an output of chain:out, chain:side" in audit.stdout


def test_audit_names_each_entry_whose_blob_is_not_the_size_or_the_digest_it_records(machines, any_remote):
    a = machines("a", any_remote.section(inline_max=0))
    assert a.build().ok
    out_key, mid_key = key_of(a, "chain:out"), key_of(a, "chain:mid")
    head, doc = any_remote.read_entry(out_key)
    doc["outputs"]["data.txt"]["size"] += 1  # an entry that records another size than its blob's
    any_remote.write_entry(out_key, head, doc)
    _head, mid = any_remote.read_entry(mid_key)
    digest = mid["outputs"]["data.txt"]["digest"]
    any_remote.write(any_remote.blob_path(digest), b"hello-MID")  # same size, other bytes

    sized = cli(a, "cache", "audit")
    assert sized.returncode == 1 and "(sizes (--rehash: digests too)): PROBLEMS FOUND" in sized.stdout
    out_blob = doc["outputs"]["data.txt"]["digest"]
    size = doc["outputs"]["data.txt"]["size"]
    assert (f"entry {out_key} (chain:out) output data.txt: blob {out_blob} holds {size - 1} bytes, "
            f"the entry records {size}") in sized.stdout
    assert "is corrupt" not in sized.stdout  # sizes alone cannot see it

    rehashed = cli(a, "cache", "audit", "--rehash")
    assert rehashed.returncode == 1
    assert f"entry {mid_key} (chain:mid) output data.txt: blob {digest} is corrupt (its bytes hash to " in rehashed.stdout


def test_a_signed_entry_rewired_by_someone_without_the_key_is_refused(machines, s3_remote, monkeypatch):
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    signed = s3_remote.section(signing_key_env=KEY_ENV)
    a = machines("a", signed)
    assert a.build().ok
    rewire(s3_remote, a, "chain:out", "chain:side")

    b = machines("b", signed)
    result = b.build()
    assert result.ok and step_events(result, "built") == ["chain:out"]
    assert outputs(b)["chain/out/data.txt"] == b"hello-mid-out"
    assert any("remote entry for chain:out is badly signed: replaced" in w for w in warnings(result.reporter.events))
    audit = cli(b, "cache", "audit", "--rehash")
    assert audit.returncode == 0 and "not signed" not in audit.stdout
