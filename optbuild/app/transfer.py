"""Push and pull: moving a workspace's results to and from the remote cache.

These are workflows over a whole workspace (its graph, lock file and local cache): they drive
the store layer's ``RemoteSession``, which knows entries and blobs, never recipes or steps.
Each run is appended to the cache's stats.jsonl, as a build's is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from optbuild.builder import lockfile, runstats
from optbuild.builder.outcome import Options
from optbuild.builder.report import Reporter
from optbuild.builder.scheduler import Scheduler
from optbuild.builder.status import Status
from optbuild.common.errors import OptbuildError
from optbuild.common.fingerprint import Fingerprint
from optbuild.store.remote import EventSink, RemoteSession, RemoteStore, TransferProgress

if TYPE_CHECKING:
    from optbuild.api import Workspace

Direction = Literal["push", "pull"]


@dataclass
class TransferReport:
    """The steps a push or pull moved, found already there, could not find, or failed on."""

    done: list[str] = field(default_factory=list)  # pushed / pulled
    present: list[str] = field(default_factory=list)  # already there
    missing: list[str] = field(default_factory=list)  # not available to transfer
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.failed)


@dataclass(frozen=True)
class TransferResult:
    """A push's or pull's steps (``report``), the remote session's counters (``summary``:
    bytes_up, bytes_down, errors, signature_mismatches, ...) and its duration."""

    direction: Direction
    report: TransferReport
    summary: dict[str, Any]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.report.ok

    @property
    def mismatch_warning(self) -> str | None:
        """What the remote's signature mismatches mean, when there were any."""
        count = self.summary["signature_mismatches"]
        return runstats.describe_mismatches(count) if count else None


def push(ws: Workspace, targets: Iterable[str] = (), *, everything: bool = False,
         sink: EventSink | None = None, progress: TransferProgress | None = None) -> TransferResult:
    """Upload what the local cache holds for ``targets`` (their keys as recorded in the lock
    file; all recorded steps when none), or with ``everything`` every local entry. The remote's
    warnings go to ``sink``, each transfer's bytes to ``progress``."""
    session = RemoteSession(_remote(ws, "push"), sink, progress=progress)
    started = time.perf_counter()
    report = _push(ws, session, list(targets), everything)
    return _finish(ws, "push", session, report, started)


def pull(ws: Workspace, targets: Iterable[str] = (), *, host: Fingerprint | Path | None = None,
         sink: EventSink | None = None, progress: TransferProgress | None = None) -> TransferResult:
    """Fetch into the local cache what the remote has for ``targets`` (and their ancestors),
    without building anything; with ``host`` (a recorded Fingerprint, or the file
    ``optbuild fingerprint`` wrote it to), the keys are those of that host. Keys of steps
    downstream of a remote hit are planned from the remote entry, so a whole chain is found
    without building its head."""
    session = RemoteSession(_remote(ws, "pull"), sink, progress=progress)
    started = time.perf_counter()
    report = _pull(ws, session, list(targets), _fingerprint(host))
    return _finish(ws, "pull", session, report, started)


def _remote(ws: Workspace, direction: Direction) -> RemoteStore:
    """The workspace's remote, when it is there and open for ``direction``."""
    if ws.remote is None:
        raise OptbuildError("no remote cache: set [remote] url in optbuild.toml, $OPTBUILD_REMOTE or --remote URL")
    if direction == "push" and not ws.remote.write:
        raise OptbuildError(f"the remote {ws.remote.display_url} is read-only here ([remote] write = false)")
    if direction == "pull" and not ws.remote.read:
        raise OptbuildError(f"reading the remote {ws.remote.display_url} is off ([remote] read = false)")
    return ws.remote


def _fingerprint(host: Fingerprint | Path | None) -> Fingerprint | None:
    if not isinstance(host, Path):
        return host
    try:
        return Fingerprint.load(host)
    except (OSError, ValueError) as exc:
        raise OptbuildError(f"cannot read fingerprint {host}: {exc}") from None


def _finish(ws: Workspace, direction: Direction, session: RemoteSession, report: TransferReport,
            started: float) -> TransferResult:
    """Record the run in stats.jsonl, as a build is recorded, and say what it did."""
    summary = session.summary()
    runstats.append_stats(ws.store.root, {"command": direction, "ok": report.ok, "local": None, "remote": summary})
    return TransferResult(direction, report, summary, time.perf_counter() - started)


def _pull(ws: Workspace, session: RemoteSession, targets: list[str], host: Fingerprint | None) -> TransferReport:
    report = TransferReport()
    selected = ws.graph.select(targets)
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


def _push(ws: Workspace, session: RemoteSession, targets: list[str], everything: bool) -> TransferReport:
    report = TransferReport()
    if everything:
        items = [(entry.step, key) for key, entry in ws.store.iter_entries() if entry is not None]
    else:
        records = lockfile.read(ws.project.lock_file)
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
