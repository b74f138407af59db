"""The local cache's use cases: list, verify, audit the remote, gc, and the runs' statistics.

Each returns what the store found as a typed result; the CLI (``optbuild cache``) prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.builder import lockfile
from optbuild.builder.runstats import describe_mismatches, read_stats
from optbuild.builder.status import Status
from optbuild.common.errors import OptbuildError
from optbuild.common.units import parse_size
from optbuild.store.actions import GC_GRACE_S
from optbuild.store.remote import EventSink, RemoteAudit, RemoteSession

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.store.entry import ActionEntry
    from optbuild.store.gc import GcReport, VerifyReport

GC_GRACE_DAYS = 7  # with a damaged optbuild.lock, gc evicts only entries unused this long


def entries(ws: Workspace) -> list[tuple[str, ActionEntry | None]]:
    """Every (key, entry) of the local cache, by step id; a corrupt entry is None (listed first)."""
    return sorted(ws.store.iter_entries(), key=lambda kv: kv[1].step if kv[1] else "")


def verify(ws: Workspace, *, repair: bool = False) -> VerifyReport:
    """Re-read every blob and entry of the local cache; with ``repair``, delete what is corrupt."""
    return ws.store.verify(repair=repair)


def audit(ws: Workspace, sink: EventSink, *, rehash: bool = False) -> RemoteAudit:
    """Check the remote's entries, signatures and blobs (read-only); its warnings go to ``sink``."""
    if ws.remote is None:
        raise OptbuildError("no remote cache is configured")
    return RemoteSession(ws.remote, sink).audit(rehash=rehash)


# --- gc ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GcPolicy:
    """What gc must keep: the entries optbuild.lock names, and those used within ``min_age_s``
    (a running build may restore them). With a damaged lock file (``damage``, why) what it
    names is unknown, so the grace grows to ``GC_GRACE_DAYS``."""

    keep: frozenset[str]
    min_age_s: float
    lock_file: Path
    damage: str | None = None

    @property
    def warning(self) -> str | None:
        """The warning to give before a gc under a damaged lock file, else None."""
        if self.damage is None:
            return None
        return (f"{self.lock_file} is damaged ({self.damage}); gc keeps every "
                f"entry used in the last {GC_GRACE_DAYS} days")


@dataclass(frozen=True)
class GcResult:
    """What gc freed and kept (``report``), under which policy."""

    report: GcReport
    policy: GcPolicy


def gc_limit(ws: Workspace, max_size: str | int | None = None) -> int:
    """The byte bound of a gc: ``max_size`` ("5 GiB", or bytes), else ``[cache] max_size``;
    ValueError saying what is wrong with the size."""
    return parse_size(str(max_size or ws.project.config.cache.max_size))


def gc_policy(ws: Workspace, *, include_locked: bool = False, grace_s: float | None = None) -> GcPolicy:
    """Keep what optbuild.lock references (unless ``include_locked``) and what was used in the
    last ``grace_s`` seconds (default ``GC_GRACE_S``)."""
    lock = lockfile.LockState() if include_locked else lockfile.load(ws.project.lock_file)
    keep = frozenset(record["key"] for record in lock.steps.values() if "key" in record)
    min_age_s = GC_GRACE_S if grace_s is None else grace_s
    if lock.damage is not None:  # what it named is unknown: spare whatever was used lately
        min_age_s = max(min_age_s, GC_GRACE_DAYS * 86400)
    return GcPolicy(keep, min_age_s, ws.project.lock_file, lock.damage)


def gc(ws: Workspace, max_bytes: int | None = None, *, policy: GcPolicy | None = None,
       waiting: Callable[[list[int]], None] | None = None) -> GcResult:
    """Evict least-recently-used entries until the cache fits ``max_bytes`` (default: [cache]
    max_size), keeping what ``policy`` protects (default: ``gc_policy(ws)``). ``waiting`` is
    told the pids of the builds gc waits for, since a wait would otherwise look hung."""
    limit = gc_limit(ws) if max_bytes is None else max_bytes
    policy = policy or gc_policy(ws)
    report = ws.store.gc(limit, keep=policy.keep, min_age_s=policy.min_age_s, waiting=waiting)
    return GcResult(report, policy)


# --- stats -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheStats:
    """The runs recorded in the cache's stats.jsonl, oldest first, and their totals."""

    records: list[dict[str, Any]]
    totals: dict[str, Any]

    @property
    def mismatch_warning(self) -> str | None:
        """What the remote's signature mismatches mean, when there were any."""
        count = self.totals["remote"]["signature_mismatches"]
        return describe_mismatches(count) if count else None


def stats(ws: Workspace) -> CacheStats:
    """The hit rates and transfers of the runs (builds, pushes, pulls) this cache recorded."""
    records = read_stats(ws.store.root)
    totals: dict[str, Any] = {"runs": len(records), "local": {"hits": 0, "misses": 0, "unavailable": 0},
                              "remote": {"hits": 0, "misses": 0, "rejected": 0, "errors": 0, "requests": 0,
                                         "signature_mismatches": 0, "bytes_down": 0, "bytes_up": 0}}
    for record in records:
        for name, value in (local_counts(record) or {}).items():
            totals["local"][name] += value
        remote = record.get("remote")
        for name, value in (remote.items() if isinstance(remote, dict) else ()):
            if name in totals["remote"]:
                totals["remote"][name] += counter(value)
    return CacheStats(records, totals)


def local_counts(record: dict[str, Any]) -> dict[str, int] | None:
    """A run's local hits, misses and unavailable steps (None: the run used no local cache).

    A step this host cannot run is not a miss: no cache could have served a build of it.
    Records written before unavailable steps had a count of their own counted them as
    misses; their status counts say how many to move.
    """
    local = record.get("local")
    if not isinstance(local, dict):
        return None
    counts = {name: counter(local.get(name)) for name in ("hits", "misses", "unavailable")}
    if "unavailable" not in local:
        status_counts = record.get("counts")
        moved = min(counts["misses"], counter(status_counts.get(Status.UNAVAILABLE)) if isinstance(status_counts, dict) else 0)
        counts["misses"] -= moved
        counts["unavailable"] = moved
    return counts


def counter(value: Any) -> int:
    """A counter from stats.jsonl, which anyone may have edited: anything else counts 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
