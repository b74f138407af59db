"""optbuild cache ls | verify | gc | push | pull | stats | audit"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.cli.build import add_remote_flags, remote_override
from optbuild.common.units import human_size

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.app import GcResult
    from optbuild.common.events import Event


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    sub.add_parser("ls", help="list action entries")
    verify = sub.add_parser("verify", help="re-read every blob and entry; report corruption")
    verify.add_argument("--repair", action="store_true", help="delete what is corrupt")
    audit = sub.add_parser("audit", help="check the remote cache: entries, signatures, blobs (read-only)")
    audit.add_argument("--rehash", action="store_true",
                       help="also download every named blob and check its digest (slow on big remotes)")
    add_remote_flags(audit)
    gc = sub.add_parser("gc", help="evict least-recently-used entries down to a size")
    gc.add_argument("--max-size", default=None, help="e.g. '5 GiB' (default: [cache] max_size)")
    gc.add_argument("--include-locked", action="store_true",
                    help="may also evict what optbuild.lock references")
    gc.add_argument("--grace-minutes", type=float, default=None, metavar="N",
                    help="keep entries used in the last N minutes, which running builds may restore "
                         "(default: 10)")
    push = sub.add_parser("push", help="upload cached results of steps to the remote cache")
    push.add_argument("targets", nargs="*", metavar="TARGET",
                      help="recipe or recipe:step (default: every step in optbuild.lock)")
    push.add_argument("--all", action="store_true", help="every entry in the local cache")
    add_remote_flags(push)
    pull = sub.add_parser("pull", help="fetch results from the remote cache without building")
    pull.add_argument("targets", nargs="*", metavar="TARGET",
                      help="recipe or recipe:step (default: everything)")
    pull.add_argument("--fingerprint", type=Path, metavar="FILE", default=None,
                      help="plan the keys of the host recorded in FILE (`optbuild fingerprint` output)")
    add_remote_flags(pull)
    stats = sub.add_parser("stats", help="cache hit rates and transfers of recent runs")
    stats.add_argument("--last", type=int, default=10, metavar="N", help="show the last N runs")
    stats.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from optbuild import api, app

    command = args.cache_command
    ws = api.open_workspace(args.directory, remote=remote_override(args))
    try:
        if command == "ls":
            for key, entry in app.entries(ws):
                if entry is None:
                    print(f"{key[:16]}  CORRUPT ENTRY")
                    continue
                size = sum(o.size for o in entry.outputs.values())
                built = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created_at))
                print(f"{key[:16]}  {entry.step:<32} {entry.kind:<22} {human_size(size):>10}  {built}")
            print(f"cache size on disk: {human_size(ws.store.size_bytes())}")
            return 0
        if command == "verify":
            report = app.verify(ws, repair=args.repair)
            print(report)
            return 0 if report.ok else 1
        if command == "audit":
            audit = app.audit(ws, _WarningPrinter(), rehash=args.rehash)
            print(audit)
            return 0 if audit.ok else 1
        if command in ("push", "pull"):
            return _transfer(ws, args)
        if command == "stats":
            return _stats(ws, args)
        return _gc(ws, args)
    finally:
        ws.close()


def _gc(ws: Workspace, args: argparse.Namespace) -> int:
    from optbuild import app

    try:
        max_bytes = app.cache.gc_limit(ws, args.max_size)
    except ValueError as exc:
        print(f"error: --max-size: {exc}", file=sys.stderr)
        return 2
    grace_s = None if args.grace_minutes is None else args.grace_minutes * 60
    policy = app.gc_policy(ws, include_locked=args.include_locked, grace_s=grace_s)
    if policy.warning is not None:
        print(f"warning: {policy.warning}", file=sys.stderr)
    result = app.gc(ws, max_bytes, policy=policy, waiting=_say_gc_waits(ws.store.root))
    print(_describe_gc(result))
    return 0


def _say_gc_waits(root: Path) -> Callable[[list[int]], None]:
    """What gc prints before it waits for the builds that hold the cache (it would seem hung)."""

    def say(pids: list[int]) -> None:
        who = f" (pid {', '.join(map(str, pids))})" if pids else ""
        print(f"cache gc: waiting for the running builds that hold the cache {root}{who} to finish "
              "storing or restoring", file=sys.stderr, flush=True)

    return say


# --- push / pull -------------------------------------------------------------------------
def _transfer(ws: Workspace, args: argparse.Namespace) -> int:
    from optbuild import app

    pushing = args.cache_command == "push"
    progress = _progress()
    sink = _WarningPrinter(progress)
    try:
        if pushing:
            result = app.push(ws, args.targets, everything=args.all, sink=sink, progress=progress)
        else:
            result = app.pull(ws, args.targets, host=args.fingerprint, sink=sink, progress=progress)
    finally:
        progress.close()
    report, summary = result.report, result.summary
    verb = "pushed" if pushing else "pulled"
    where = "on the remote already" if pushing else "in the local cache already"
    for sid in report.failed:
        print(f"  failed   {sid}", file=sys.stderr)
    for sid in report.missing:
        why = "not in the local cache: build it first" if pushing else "not on the remote: it must build"
        print(f"  missing  {sid}  ({why})", file=sys.stderr)
    print(f"{verb} {len(report.done)}, {len(report.present)} {where}, {len(report.missing)} missing, "
          f"{len(report.failed)} failed in {result.seconds:.2f}s "
          f"({human_size(summary['bytes_up' if pushing else 'bytes_down'])} "
          f"{'up' if pushing else 'down'}, {summary['errors']} remote errors, "
          f"{summary['requests']} requests)")
    if result.mismatch_warning is not None:
        print(f"warning: {result.mismatch_warning}", file=sys.stderr)
    if not pushing and report.done:
        print("restore the outputs with `optbuild build --no-build`")
    return 0 if report.ok else 1


class _WarningPrinter:
    """Prints the remote's warnings (a Reporter-like sink), above a live progress bar."""

    def __init__(self, progress: Any = None):
        self.progress = progress

    def emit(self, event: Event) -> None:
        if event["event"] == "warning":
            line = f"warning: {event['message']}"
            if self.progress is not None:
                self.progress.print(line)
            else:
                print(line, file=sys.stderr)


def _progress() -> Any:
    from optbuild.app import TransferProgress

    class PlainProgress(TransferProgress):
        """One line per finished transfer (not a terminal)."""

        def start(self, direction: str, label: str, total: int | None) -> Any:
            return [direction, label, 0]

        def advance(self, token: Any, nbytes: int) -> None:
            token[2] += nbytes

        def finish(self, token: Any, ok: bool) -> None:
            arrow = "↓" if token[0] == "down" else "↑"
            state = "" if ok else "  FAILED"
            print(f"  {arrow} {token[1]}  {human_size(token[2])}{state}", file=sys.stderr, flush=True)

        def print(self, line: str) -> None:
            print(line, file=sys.stderr, flush=True)

        def close(self) -> None:
            pass

    if not sys.stderr.isatty():
        return PlainProgress()

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    class RichProgress(TransferProgress):
        """A bar per transfer in flight, on a terminal."""

        def __init__(self) -> None:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                TransferSpeedColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True), transient=False)
            self.bar.start()

        def start(self, direction: str, label: str, total: int | None) -> Any:
            arrow = "↓" if direction == "down" else "↑"
            return self.bar.add_task(f"{arrow} {label}", total=total)

        def advance(self, token: Any, nbytes: int) -> None:
            self.bar.advance(token, nbytes)

        def finish(self, token: Any, ok: bool) -> None:
            task = self.bar.tasks[token] if token < len(self.bar.tasks) else None
            if task is not None and ok and task.total is not None:
                self.bar.update(token, completed=task.total)
            if not ok:
                self.bar.update(token, description=f"{task.description if task else ''} FAILED")

        def print(self, line: str) -> None:
            self.bar.console.print(line, markup=False, highlight=False)

        def close(self) -> None:
            self.bar.stop()

    return RichProgress()


# --- gc ----------------------------------------------------------------------------------
def _describe_gc(result: GcResult) -> str:
    """What gc freed, and what it kept and why, naming the flag that lifts each protection:
    a gc that frees nothing must not leave people guessing."""
    report, policy = result.report, result.policy
    lock_name, grace_s, damaged = policy.lock_file.name, policy.min_age_s, policy.damage is not None
    state = "within" if report.ok else "over"
    lines = [f"evicted {_count(report.entries_evicted, 'entry')}, deleted {_count(report.blobs_deleted, 'blob')}, "
             + f"freed {human_size(report.bytes_freed)}; the cache now holds {human_size(report.bytes_now)}, "
             + f"{state} its limit of {human_size(report.max_bytes)}"]
    locked, recent, fits = report.locked, report.recent, report.within_limit
    grace = f"used in the last {_duration(grace_s)}"
    reasons = (
        (locked, f"{lock_name} references {_them(locked)} (--include-locked lets gc evict {_them(locked)})"),
        (recent, f"{grace} ({lock_name} is damaged: what it references is unknown)" if damaged else
                 f"{grace}, a running build may restore {_them(recent)} "
                 f"(--grace-minutes 0 lets gc evict {_them(recent)})"),
        (fits, f"the cache fits its limit with {_them(fits)}"),
    )
    kept_total = sum(kept.entries for kept, _why in reasons)
    for kept, why in reasons:
        if kept.entries:
            every = "all " if kept.entries == kept_total > 1 else ""
            lines.append(f"kept {every}{_count(kept.entries, 'entry')} ({human_size(kept.bytes)}): {why}")
    if not report.ok:
        lines.append("the kept entries alone exceed the limit")
    if report.failures_forgotten:
        lines.append(f"forgot {_count(report.failures_forgotten, 'remembered failure')} older than a week "
                     "(those steps run again when next built)")
    return "\n".join(lines)


def _them(kept: Any) -> str:
    return "it" if kept.entries == 1 else "them"


def _count(n: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def _duration(seconds: float) -> str:
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            return f"{seconds / length:g} {unit}{'' if seconds == length else 's'}"
    return f"{seconds:g} second{'' if seconds == 1 else 's'}"


# --- stats -------------------------------------------------------------------------------
def _stats(ws: Workspace, args: argparse.Namespace) -> int:
    from optbuild import app
    from optbuild.app.cache import counter, local_counts

    found = app.stats(ws)
    records, totals = found.records, found.totals
    if args.json:
        print(json.dumps({"totals": totals, "recent": records[-args.last:] if args.last > 0 else []},
                         indent=1))
        return 0
    if not records:
        print("no runs recorded yet (builds, pushes and pulls append to cache/stats.jsonl)")
        return 0
    print(f"{'when':<17} {'command':<8} {'local hit/miss':>14} {'unavailable':>11} {'remote hit/miss/err':>20} "
          f"{'down':>10} {'up':>10} {'requests':>8}")
    for record in records[-args.last:] if args.last > 0 else []:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.get("time", 0)))
        local = local_counts(record)
        remote = record.get("remote") or {}
        local_text = f"{local['hits']}/{local['misses']}" if local else "-"
        unavailable_text = str(local["unavailable"]) if local else "-"
        remote_text = (f"{remote.get('hits', 0)}/{remote.get('misses', 0)}/{remote.get('errors', 0)}"
                       if remote else "-")
        requests_text = str(counter(remote["requests"])) if "requests" in remote else "-"  # not counted then
        mismatches = remote.get("signature_mismatches")
        print(f"{when:<17} {record.get('command', '?'):<8} {local_text:>14} {unavailable_text:>11} "
              f"{remote_text:>20} {human_size(counter(remote.get('bytes_down'))):>10} "
              f"{human_size(counter(remote.get('bytes_up'))):>10} {requests_text:>8}"
              + (f"  {mismatches} signature mismatch(es)" if mismatches else ""))
    local, remote = totals["local"], totals["remote"]
    looked = local["hits"] + local["misses"]
    print(f"all {len(records)} runs: local hit rate "
          f"{(100 * local['hits'] / looked) if looked else 0:.0f}% ({local['hits']}/{looked}), "
          f"{local['unavailable']} unavailable (steps this host cannot run: not misses); "
          f"remote {remote['hits']} hits, {remote['misses']} misses ({remote['rejected']} rejected), "
          f"{remote['errors']} errors, {remote['requests']} requests, {human_size(remote['bytes_down'])} down, "
          f"{human_size(remote['bytes_up'])} up")
    if found.mismatch_warning is not None:
        print(f"warning: {found.mismatch_warning}: this host's signing key "
              "differs from the one that signed the remote's entries")
    return 0
