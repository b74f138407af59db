"""What `optbuild cache` and `optbuild deploy` do, a Python user does without the CLI:
optbuild.app's gc, push, pull, verify, stats and deploy selection, over a workspace from
optbuild.api, against a real local cache and a file:// remote, returning typed results."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from plugins.projects import ProjectDir

from optbuild import api, app
from optbuild.common.errors import OptbuildError

CHAIN = ["chain:src", "chain:mid", "chain:out"]


@contextmanager
def workspace(project: ProjectDir, **options) -> Iterator[api.Workspace]:
    ws = api.open_workspace(project.root, **options)
    try:
        yield ws
    finally:
        ws.close()


def test_push_then_pull_on_another_host_moves_the_results_and_records_both(machines, file_remote):
    a = machines("a", file_remote.section())
    with workspace(a, remote=False) as ws:
        assert api.build(ws).ok  # built here only
        with pytest.raises(OptbuildError, match=r"^no remote cache: set \[remote\] url"):
            app.push(ws)

    with workspace(a) as ws:
        pushed = app.push(ws, ["chain:out"])  # with its ancestors
    assert pushed.ok and pushed.report.done == CHAIN and pushed.summary["bytes_up"] > 0
    assert len(file_remote.keys()) == 3

    b = machines("b", file_remote.section())
    with workspace(b) as ws:
        pulled = app.pull(ws)
        assert pulled.report.done == CHAIN and pulled.report.missing == ["chain:side"]  # never pushed
        assert not pulled.ok and pulled.summary["bytes_down"] > 0
        assert sorted(entry.step for _key, entry in app.entries(ws)) == sorted(CHAIN)
        assert app.verify(ws).ok
        again = app.pull(ws, ["chain:out"])
        assert again.ok and again.report.present == CHAIN and again.report.done == []
        assert [record["command"] for record in app.stats(ws).records] == ["pull", "pull"]
    assert not (b.root / "build").exists()  # a pull fills the cache and restores nothing


def test_a_read_only_remote_refuses_a_push_with_the_clis_message(machines, file_remote):
    a = machines("a", file_remote.section(write=False))
    with workspace(a) as ws, pytest.raises(OptbuildError, match=r"is read-only here \(\[remote\] write = false\)"):
        app.push(ws)


def test_gc_keeps_what_the_lock_file_names_until_told_otherwise(machines):
    project = machines("gc")
    assert project.build().ok
    with workspace(project) as ws:
        kept = app.gc(ws, 0, policy=app.gc_policy(ws, grace_s=0))
        assert kept.report.entries_evicted == 0 and kept.report.locked.entries == 4
        assert not kept.report.ok  # the kept entries alone exceed 0 bytes

        recent = app.gc(ws, 0, policy=app.gc_policy(ws, include_locked=True))
        assert recent.report.entries_evicted == 0 and recent.report.recent.entries == 4

        evicted = app.gc(ws, 0, policy=app.gc_policy(ws, include_locked=True, grace_s=0))
        assert evicted.report.entries_evicted == 4 and evicted.report.ok
        assert app.entries(ws) == []


def test_a_damaged_lock_file_makes_gc_spare_a_week_and_say_why(machines):
    project = machines("damaged")
    assert project.build().ok
    project.write("optbuild.lock", "{ not json")
    with workspace(project) as ws:
        policy = app.gc_policy(ws, grace_s=0)
        assert policy.min_age_s == app.cache.GC_GRACE_DAYS * 86400 and policy.keep == frozenset()
        assert policy.warning is not None and "optbuild.lock is damaged" in policy.warning
        assert app.gc(ws, 0, policy=policy).report.recent.entries == 4


def test_deploy_selection_refuses_a_project_without_a_deploy_step_before_building(machines):
    project = machines("nodeploy")
    with workspace(project) as ws, pytest.raises(OptbuildError, match="no deploy step in the project"):
        app.select_deploys(ws)
    assert not (project.root / "build").exists()
