"""Batched remote lookups (``RemoteSession.prefetch`` / ``prefetch_listing``) against real
remotes on loopback: the answers read together serve the per-step lookups that follow, which
keep every check of a lookup that reads its entry itself."""

from __future__ import annotations

import json

import pytest
from plugins.remote import local_store

from optbuild.builder import remotehit
from optbuild.store.remote import RemoteSession, RemoteStore

ABSENT = "ab" + "0" * 62


class Events:
    """An EventSink keeping what the session said."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, event) -> None:
        self.events.append(dict(event))

    def warnings(self) -> list[str]:
        return [e["message"] for e in self.events if e.get("event") == "warning"]


def session(remote, events: Events | None = None) -> RemoteSession:
    return RemoteSession(RemoteStore(remote.url, endpoint_url=remote.endpoint, timeout_s=5), reporter=events)


def built_remote(machines, remote, **section) -> list[str]:
    """The keys of the `chain` project (4 steps), built once on a host writing through
    (``section``: more of its [remote] settings)."""
    assert machines("a", remote.section(**section)).build().ok
    keys = remote.keys()
    assert len(keys) == 4
    return keys


def test_prefetched_answers_serve_the_lookups_without_asking_the_remote_again(machines, any_remote):
    keys = built_remote(machines, any_remote)
    remote = session(any_remote)
    remote.prefetch([*keys, ABSENT])
    for key in keys:  # gone from the remote since: only the prefetched answers can say them
        any_remote.delete(any_remote.entry_path(key))
    found = {key: remote.lookup(key, "step") for key in keys}
    assert all(entry is not None and entry.key == key for key, entry in found.items())
    assert remote.lookup(ABSENT) is None
    assert remote.stats.misses == 1 and remote.stats.errors == 0
    assert remote.lookup(keys[0]) is None  # an answer serves one lookup; then the remote is asked


def test_a_prefetched_entry_is_checked_as_a_read_one_rejected_and_the_step_built(machines, any_remote):
    keys = built_remote(machines, any_remote)
    head, doc = any_remote.read_entry(keys[0])
    any_remote.write_entry(keys[0], head, {**doc, "key": keys[1]})  # filed under another key
    events = Events()
    remote = session(any_remote, events)
    remote.prefetch(keys)
    assert remote.lookup(keys[0], "chain:src") is None
    assert remote.stats.rejected == 1 and "rejected" in (remote.miss_reason(keys[0]) or "")
    assert any("entry of chain:src rejected" in w for w in events.warnings())
    name = doc["primary"] or next(iter(doc["outputs"]))
    assert remote.lookup(keys[1], "s", main=name + ".other") is None  # the step's main output differs
    assert remote.stats.rejected == 2


def test_after_one_listing_an_unlisted_key_is_a_miss_without_a_read(machines, s3_remote):
    keys = built_remote(machines, s3_remote)
    remote = session(s3_remote)
    remote.prefetch_listing()
    late = "cd" + "1" * 62  # an entry pushed after the listing: missed in this run
    head, doc = s3_remote.read_entry(keys[0])
    s3_remote.write_entry(late, head, {**doc, "key": late})
    assert remote.lookup(late) is None and remote.stats.misses == 1
    assert remote.lookup(keys[0]) is not None  # a listed key is read
    assert session(s3_remote).lookup(late) is not None  # the next run sees it
    remote.prefetch([*keys, late])  # prefetch reads only what the listing holds
    assert remote.lookup(late) is None and remote.stats.misses == 2


def test_fetch_downloads_an_entrys_blobs_together_verified(machines, any_remote):
    keys = built_remote(machines, any_remote, inline_max=0)  # none carried in its entry
    remote = session(any_remote)
    remote.prefetch(keys)
    local = local_store(machines("b"))
    entries = [remote.lookup(key) for key in keys]
    for entry in entries:
        assert remote.fetch(entry, local, entry.step) is not None
    blobs = {d for entry in entries for d in entry.blob_digests()}
    assert any(len(entry.blob_digests()) > 1 for entry in entries)  # output and log: downloaded together
    assert remote.stats.blobs_down == len(blobs)
    assert local.verify().ok and all(local.blob_ok(d) for d in blobs)
    assert json.loads(local.entry_path(keys[0]).read_text())["key"] == keys[0]


@pytest.fixture
def entry_reads(monkeypatch) -> tuple[list[list[str]], list[str]]:
    """(the keys of each batch of entries read, the keys of each entry read by itself), as the
    remote store is asked for them; the reads themselves still run."""
    batches: list[list[str]] = []
    singles: list[str] = []
    read_entries, read_entry = RemoteStore._read_entries, RemoteStore._read_entry

    def batch(self, keys, touch):
        batches.append(sorted(keys))
        return read_entries(self, keys, touch)

    def single(self, key, slot, touch):
        singles.append(key)
        return read_entry(self, key, slot, touch)

    monkeypatch.setattr(RemoteStore, "_read_entries", batch)
    monkeypatch.setattr(RemoteStore, "_read_entry", single)
    return batches, singles


@pytest.mark.parametrize("dry_run", [False, True], ids=["build", "plan"])
def test_the_entries_of_steps_ready_together_are_read_in_one_batch(machines, any_remote, entry_reads, dry_run):
    """mid and side both read src: once src is restored (or, in a plan, found), their two
    lookups wait for one batch that reads both entries, and ask the remote nothing more."""
    built_remote(machines, any_remote)
    batches, singles = entry_reads
    batches.clear(), singles.clear()  # those of the build that filled the remote
    b = machines("b", any_remote.section())
    result = b.build(dry_run=dry_run)
    assert result.ok and all(outcome.status == "restored" for outcome in result.outcomes.values())
    keys = {sid: outcome.key for sid, outcome in result.outcomes.items()}
    assert batches == [sorted([keys["chain:mid"], keys["chain:side"]])]
    # a file system that is not asynchronous (file://) reads a batch's entries one by one
    assert sorted(set(singles) - set(batches[0])) == sorted([keys["chain:src"], keys["chain:out"]])
    assert len(singles) == len(set(singles))  # none read twice


@pytest.mark.parametrize("dry_run", [False, True], ids=["build", "plan"])
def test_a_run_of_many_steps_lists_the_remote_once_and_reads_no_entry_it_lacks(machines, any_remote, entry_reads,
                                                                               monkeypatch, dry_run):
    monkeypatch.setattr(remotehit, "LIST_REMOTE_FROM", 1)  # the chain's 4 steps count as many
    batches, singles = entry_reads
    b = machines("b", any_remote.section(write=False))  # no write-through, which reads what lies where it writes
    result = b.build(dry_run=dry_run)  # the remote holds nothing
    assert result.ok and result.outcomes["chain:src"].status == ("would-build" if dry_run else "built")
    assert batches == [] and singles == []
