"""Run statistics: what one run did with the caches, and the record of recent runs.

``run_stats`` counts a build's local hits and misses (and takes the remote session's
counters); the scheduler emits them as the "cache" event and appends them to
``cache/stats.jsonl``, as ``cache push`` / ``pull`` do. ``describe_stats`` is the line
people read after a build; ``read_stats`` feeds ``optbuild cache stats``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.builder.status import Status
from optbuild.common.units import human_size

if TYPE_CHECKING:
    from optbuild.store.remote import RemoteSession

STATS_FILE = "stats.jsonl"
STATS_MAX_BYTES = 512 << 10  # the stats file is trimmed to its newer half beyond this


def run_stats(outcomes: Mapping[str, Any], session: RemoteSession | None) -> dict[str, Any]:
    """Hits and misses per cache level for one run (the "cache" event and stats line).

    A step this host cannot run is counted apart, not as a miss: no cache entry was
    missing that a build here could have made, so it must not lower the hit rate.
    """
    keyed = [o.status for o in outcomes.values() if o.key]
    unavailable = keyed.count(Status.UNAVAILABLE)
    hits = keyed.count(Status.CACHED)
    return {"local": {"hits": hits, "misses": len(keyed) - hits - unavailable, "unavailable": unavailable},
            "remote": session.summary() if session is not None else None}


def describe_stats(stats: dict[str, Any]) -> str:
    """One line for people: "cache: local 3 hits, 1 miss; remote s3://...: 1 hit, ..., 2 requests, ..."."""
    local = stats.get("local") or {}
    text = f"cache: local {_n(local.get('hits', 0), 'hit')}, {_n(local.get('misses', 0), 'miss')}"
    if local.get("unavailable"):
        text += f", {local['unavailable']} unavailable"
    remote = stats.get("remote")
    if remote:
        text += (f"; remote {remote['url']}: {_n(remote['hits'], 'hit')}, {_n(remote['misses'], 'miss')}, "
                 f"{_n(remote['errors'], 'error')}")
        if remote.get("rejected"):
            text += f", {remote['rejected']} rejected"
        text += f", {_n(remote.get('requests', 0), 'request')}"  # absent from an older optbuild's summary
        text += f", {human_size(remote['bytes_down'])} down, {human_size(remote['bytes_up'])} up"
        if remote.get("signature_mismatches"):
            text += f", {describe_mismatches(remote['signature_mismatches'])}"
        if remote.get("disabled"):
            text += " (remote disabled during the run)"
    return text


def describe_mismatches(count: int) -> str:
    """Signed remote entries left in place because this host could not verify them."""
    return (f"{count} signature mismatch{'' if count == 1 else 'es'} (signed entries on the remote "
            "that this host's signing key does not verify were left in place)")


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "es" if word.endswith("s") else "s")


def append_stats(cache_dir: Path, record: dict[str, Any]) -> None:
    """Add one line to cache/stats.jsonl (best effort; trimmed to stay small)."""
    path = Path(cache_dir) / STATS_FILE
    line = json.dumps({"time": time.time(), **record}, default=str, separators=(",", ":")) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:  # O_APPEND: concurrent lines stay whole
            f.write(line)
        if path.stat().st_size > STATS_MAX_BYTES:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            tmp = path.with_name(f".{STATS_FILE}.{os.getpid()}.tmp")
            tmp.write_text("".join(lines[len(lines) // 2:]), encoding="utf-8")
            os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache still builds


def read_stats(cache_dir: Path) -> list[dict[str, Any]]:
    records = []
    try:
        text = (Path(cache_dir) / STATS_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
