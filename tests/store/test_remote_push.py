"""Write-through (a build uploading what it builds) against real remotes on loopback: a step
built here costs its lookup and its upload, not a read of its entry besides, where the remote
makes a write that replaces nothing atomic; an entry another host stored meanwhile is decided
on as any entry met before an upload (``Writing.push``)."""

from __future__ import annotations

import json
import os

import pytest
from plugins.remote import cache_event, step_events, warnings

from optbuild.store.remote import RemoteSession, RemoteStore, encode_entry, filesystem, key_id

ALL = ["chain:mid", "chain:out", "chain:side", "chain:src"]
KEY_ENV = "OPTBUILD_TEST_SIGNING_KEY"
FARM_KEY = "key-of-the-build-farm"


@pytest.fixture(params=["s3", "file"])
def creating_remote(request, monkeypatch):
    """A remote whose writes can replace nothing: a folder (hard links), or moto, which honours
    ``If-None-Match: *`` as AWS does (so it counts as AWS here)."""
    remote = request.getfixturevalue(f"{request.param}_remote")
    monkeypatch.setattr(filesystem, "IF_NONE_MATCH_HOSTS", (*filesystem.IF_NONE_MATCH_HOSTS, ".127.0.0.1"))
    return remote


def key_of(project, step: str) -> str:
    return json.loads(project.read("optbuild.lock"))["steps"][step]["key"]


def requests(result) -> int:
    return cache_event(result.reporter.events)["remote"]["requests"]


def test_a_cold_build_costs_a_lookup_and_an_upload_a_step(machines, creating_remote):
    result = machines("a", creating_remote.section()).build()
    assert result.ok and step_events(result, "built") == ALL
    remote = cache_event(result.reporter.events)["remote"]
    # 8: src's lookup, mid's and side's in one batch (one a path), out's; the write of each
    # entry (a create: none is there) carrying its outputs and log. Before, 12: each push read
    # the entry again (the 4 misses the lookups had just seen) before writing it.
    assert remote["requests"] == 8 and remote["entries_up"] == 4 and remote["blobs_up"] == 0
    assert remote["misses"] == 4 and remote["errors"] == 0
    assert creating_remote.audit().ok and len(creating_remote.keys()) == 4
    fresh = machines("b", creating_remote.section()).build()
    assert fresh.ok and step_events(fresh, "restored") == ALL and requests(fresh) == 4


def test_an_s3_server_not_known_to_honour_conditional_writes_has_each_entry_read_first(machines, s3_remote):
    result = machines("a", s3_remote.section()).build()  # moto, as any S3-compatible server is taken
    assert result.ok and step_events(result, "built") == ALL
    # 12: the 4 lookups, then for each step its entry read (none) and written. A server that
    # ignored If-None-Match would replace an entry stored since the lookup without a word.
    assert requests(result) == 12 and s3_remote.audit().ok


def test_moto_and_aws_are_taken_to_honour_if_none_match_and_other_servers_not(monkeypatch, s3_server):
    aws = RemoteStore("s3://some-bucket/cache", options={"client_kwargs": {"region_name": "us-east-1"}})
    moto = RemoteStore("s3://some-bucket/cache", endpoint_url=s3_server.endpoint)
    for store in (aws, moto):
        assert not store.creates_entries()  # no client yet: nothing asked, nothing known
        store.filesystem()[0].connect()  # makes the client; asks nothing
    assert aws.creates_entries() and not moto.creates_entries()
    monkeypatch.setattr(filesystem, "IF_NONE_MATCH_HOSTS", (".127.0.0.1",))
    assert moto.creates_entries() and not aws.creates_entries()


def store_meanwhile(monkeypatch, remote, step: str, signing_key: str | None) -> list[bytes]:
    """Have another host store its entry of ``step`` (signed with ``signing_key``) after this
    host looked it up and before it uploads its own; the bytes it stored."""
    stored: list[bytes] = []
    push = RemoteSession.push

    def racing(self, entry, local, label="", **options):
        if label == step and not stored:
            stored.append(encode_entry(entry, signing_key.encode() if signing_key else None))
            remote.write(remote.entry_path(entry.key), stored[0])
        return push(self, entry, local, label, **options)

    monkeypatch.setattr(RemoteSession, "push", racing)
    return stored


def test_a_host_without_a_key_leaves_a_signed_entry_stored_since_its_lookup(machines, creating_remote,
                                                                             monkeypatch):
    stored = store_meanwhile(monkeypatch, creating_remote, "chain:mid", FARM_KEY)
    host = machines("keyless", creating_remote.section())
    result = host.build()
    assert result.ok and step_events(result, "built") == ALL
    assert any("not replacing the signed entry of chain:mid with an unsigned one" in w
               for w in warnings(result.reporter.events))
    assert creating_remote.read(creating_remote.entry_path(key_of(host, "chain:mid"))) == stored[0]
    remote = cache_event(result.reporter.events)["remote"]
    # the 4 lookups and 3 creates; mid's create refused, then its entry read (and kept)
    assert remote["requests"] == 4 + 3 + 2 and remote["entries_up"] == 3


def test_a_host_with_another_key_stores_its_entry_beside_one_stored_since_its_lookup(machines, creating_remote,
                                                                                     monkeypatch):
    stored = store_meanwhile(monkeypatch, creating_remote, "chain:mid", FARM_KEY)
    monkeypatch.setenv(KEY_ENV, "a-key-someone-mistyped")
    host = machines("wrong", creating_remote.section(signing_key_env=KEY_ENV))
    result = host.build()
    assert result.ok and step_events(result, "built") == ALL
    assert cache_event(result.reporter.events)["remote"]["signature_mismatches"] == 1
    key = key_of(host, "chain:mid")
    assert creating_remote.read(creating_remote.entry_path(key)) == stored[0]  # the farm's, in place
    assert creating_remote.read(creating_remote.entry_path(key, key_id(b"a-key-someone-mistyped")))
    assert step_events(machines("wrong-again", creating_remote.section(signing_key_env=KEY_ENV)).build(),
                       "restored") == ALL  # its own entry, read beside the farm's


def test_an_unusable_entry_stored_since_the_lookup_is_replaced_as_ever(machines, creating_remote, monkeypatch):
    monkeypatch.setenv(KEY_ENV, FARM_KEY)
    store_meanwhile(monkeypatch, creating_remote, "chain:mid", None)  # unsigned: no one's good result here
    result = machines("farm", creating_remote.section(signing_key_env=KEY_ENV)).build()
    assert result.ok and step_events(result, "built") == ALL
    assert any("remote entry for chain:mid is unsigned: replaced" in w for w in warnings(result.reporter.events))
    assert creating_remote.audit(signing_key_env=KEY_ENV).ok
    # the 4 lookups and 4 creates, mid's refused, then its entry read and replaced
    assert requests(result) == 4 + 4 + 2


def test_a_share_without_hard_links_has_each_entry_read_first(machines, file_remote, monkeypatch):
    link = os.link

    def no_links(src, dst, **kwargs):  # the remote's folder only: the local cache links as ever
        if str(dst).startswith(file_remote.root):
            raise PermissionError(1, "Operation not permitted")  # as SMB, or a FUSE mount, may answer
        return link(src, dst, **kwargs)

    monkeypatch.setattr(os, "link", no_links)
    result = machines("a", file_remote.section()).build()
    assert result.ok and step_events(result, "built") == ALL and warnings(result.reporter.events) == []
    # the failed link costs its push a read besides, and the later pushes read first: 12 or
    # more (two uploads may both try a link before the first fails), each entry written
    assert requests(result) >= 12 and cache_event(result.reporter.events)["remote"]["entries_up"] == 4
    assert file_remote.audit().ok and len(file_remote.keys()) == 4
