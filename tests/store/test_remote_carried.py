"""Small blobs carried inside their remote entry: a fresh host restores a small step with the
one request that reads its entry (counted: ``RemoteStats.requests``), the bytes checked against
their digest as any blob's, and what is larger still travels as a blob of its own. Real remotes
on loopback."""

from __future__ import annotations

import base64
import json

from plugins.remote import cache_event, local_store, outputs, step_events, warnings

from optbuild.builder import remotehit

ALL = ["chain:mid", "chain:out", "chain:side", "chain:src"]
WIDER = "".join(f'\n[steps.x{i}]\nkind = "join"\ninput = "src"\nsuffix = "-x{i}"\n' for i in range(8))


def key_of(project, step: str) -> str:
    return json.loads(project.read("optbuild.lock"))["steps"][step]["key"]


def blobs_on(remote) -> set[str]:
    """The digests of the blobs the remote holds as blobs of their own."""
    try:
        paths = remote.fs.find(f"{remote.root}/cas")
    except FileNotFoundError:
        return set()
    return {p.rsplit("/", 2)[-2] + p.rsplit("/", 2)[-1] for p in paths}


def test_a_fresh_host_restores_small_steps_from_their_entries_alone(machines, any_remote):
    a = machines("a", any_remote.section())
    assert a.build().ok
    assert blobs_on(any_remote) == set()  # every output and log travelled inside its entry
    audit = any_remote.audit()
    assert audit.ok and audit.entries == 4, audit

    b = machines("b", any_remote.section())
    result = b.build()
    assert result.ok and step_events(result, "restored") == ALL
    remote = cache_event(result.reporter.events)["remote"]
    assert remote["hits"] == 4 and remote["blobs_down"] == 0 and remote["bytes_down"] > 0
    # one request a step, the read of its entry: src's alone, then mid's and side's in one batch
    # (one request each), then out's; 4 steps are too few to list the remote (LIST_REMOTE_FROM)
    assert remote["requests"] == 4
    assert outputs(b) == outputs(a)
    store = local_store(b)
    assert store.verify().ok
    local_entry = json.loads(store.entry_path(key_of(b, "chain:out")).read_text())
    assert local_entry["format"] == 2 and "inline" not in local_entry  # the local cache holds the blobs
    noop = b.build()
    assert noop.ok and step_events(noop, "cached") == ALL
    assert cache_event(noop.reporter.events)["remote"]["requests"] == 0  # a local hit never asks the remote


def test_a_fresh_host_restores_many_small_steps_with_a_listing_and_a_read_an_entry(machines, any_remote,
                                                                                   monkeypatch):
    a = machines("a", any_remote.section(), WIDER)  # src, and 10 steps reading it (mid, side, x0-x7), out
    assert a.build().ok
    steps = len(any_remote.keys())
    assert steps == 12 and blobs_on(any_remote) == set()
    monkeypatch.setattr(remotehit, "LIST_REMOTE_FROM", 1)  # 12 steps count as many: the remote is listed
    b = machines("b", any_remote.section(), WIDER)
    result = b.build()
    assert result.ok and len(step_events(result, "restored")) == steps
    remote = cache_event(result.reporter.events)["remote"]
    # 1 listing of ac/ (at the first local miss) and one read an entry: src's alone, the 10
    # steps reading it in one batch (each path a request), out's alone. No listing of cas/: every
    # blob travelled in its entry, none needs to be seen there before settling on it.
    assert remote["requests"] == 1 + steps and remote["hits"] == steps and remote["blobs_down"] == 0


def test_blobs_larger_than_inline_max_travel_as_blobs_of_their_own(machines, any_remote):
    a = machines("a", any_remote.section(inline_max=10))  # src "hello" carried, out "hello-mid-out" not
    assert a.build().ok
    store = local_store(a)
    sizes = {d: store.blob_path(d).stat().st_size
             for _key, entry in store.iter_entries() if entry is not None for d in entry.blob_digests()}
    larger = {d for d, size in sizes.items() if size > 10}
    assert larger and larger != set(sizes)  # some of each
    assert blobs_on(any_remote) == larger

    b = machines("b", any_remote.section())
    result = b.build()
    assert result.ok and step_events(result, "restored") == ALL
    assert cache_event(result.reporter.events)["remote"]["blobs_down"] == len(larger)
    assert outputs(b) == outputs(a)


def test_a_carried_blob_altered_on_the_remote_is_refused_built_here_and_replaced(machines, any_remote):
    a = machines("a", any_remote.section())
    assert a.build().ok
    key = key_of(a, "chain:mid")
    head, doc = any_remote.read_entry(key)
    digest = doc["outputs"]["data.txt"]["digest"]
    doc["inline"][digest] = base64.b64encode(b"hello-MID").decode()  # same size, other bytes
    any_remote.write_entry(key, head, doc)

    b = machines("b", any_remote.section())
    result = b.build()
    assert result.ok and step_events(result, "built") == ["chain:mid"]
    assert any("chain:mid" in w and "is corrupt" in w for w in warnings(result.reporter.events))
    assert outputs(b) == outputs(a)
    assert any_remote.audit().ok  # b's write-through replaced the altered entry
    fresh = machines("fresh", any_remote.section()).build()
    assert fresh.ok and step_events(fresh, "restored") == ALL
