"""``optbuild cache push`` / ``pull``: moving a workspace's results to and from the remote.

These are workflows over a whole workspace (its graph, lock file and local cache), so they
live here, beside ``api``, and drive the store layer's ``RemoteSession`` (which knows
entries and blobs, never recipes or steps).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from optbuild.builder import lockfile
from optbuild.builder.outcome import Options
from optbuild.builder.report import Reporter
from optbuild.builder.scheduler import Scheduler
from optbuild.builder.status import Status
from optbuild.store.remote import RemoteSession

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.common.fingerprint import Fingerprint


@dataclass
class TransferReport:
    done: list[str] = field(default_factory=list)  # pushed / pulled
    present: list[str] = field(default_factory=list)  # already there
    missing: list[str] = field(default_factory=list)  # not available to transfer
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.failed)


def pull(ws: Workspace, session: RemoteSession, targets: Iterable[str] = (), *,
         host: Fingerprint | None = None) -> TransferReport:
    """Fetch into the local cache what the remote has for ``targets`` (and their ancestors),
    without building anything; with ``host`` (a recorded Fingerprint), the keys are those
    of that host. Keys of steps downstream of a remote hit are planned from the remote
    entry, so a whole chain is found without building its head.
    """
    report = TransferReport()
    selected = ws.graph.select(list(targets))
    planner = Scheduler(ws.project, ws.graph, ws.store, ws.hasher, Reporter(), host=host,
                        options=Options(jobs=1, dry_run=True), remote=session)
    planned = planner.run(selected)
    for sid in selected:
        outcome = planned[sid]
        if outcome.status == Status.CACHED:
            report.present.append(sid)
        elif outcome.source == "remote" and outcome.entry is not None and outcome.key is not None:
            with ws.store.shared_gc_lock(), ws.store.lock(outcome.key):
                if ws.store.get_action(outcome.key) is not None:
                    report.present.append(sid)
                elif session.fetch(outcome.entry, ws.store, sid) is not None:
                    report.done.append(sid)
                else:
                    report.failed.append(sid)
        else:
            report.missing.append(sid)
    ws.hasher.flush()
    return report


def push(ws: Workspace, session: RemoteSession, targets: Iterable[str] = (), *,
         everything: bool = False) -> TransferReport:
    """Upload what the local cache holds for ``targets`` (their keys as recorded in the lock
    file; all recorded steps when none), or with ``everything`` every local entry."""
    report = TransferReport()
    if everything:
        items = [(entry.step, key) for key, entry in ws.store.iter_entries() if entry is not None]
    else:
        records = lockfile.read(ws.project.lock_file)
        targets = list(targets)
        steps = ws.graph.select(targets) if targets else sorted(records)
        items = []
        for sid in steps:
            if sid in records and "key" in records[sid]:
                items.append((sid, records[sid]["key"]))
            else:
                report.missing.append(sid)
    for sid, key in items:
        with ws.store.shared_gc_lock():
            entry = ws.store.get_action(key)
            if entry is None:
                report.missing.append(sid)
                continue
            result = session.push(entry, ws.store, sid, skip_if_present=True)
        {"uploaded": report.done, "present": report.present}.get(result, report.failed).append(sid)
    return report
