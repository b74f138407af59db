"""optbuild cache ls | verify | gc"""

from __future__ import annotations

import argparse
import time


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    sub.add_parser("ls", help="list action entries")
    verify = sub.add_parser("verify", help="re-read every blob and entry; report corruption")
    verify.add_argument("--repair", action="store_true", help="delete what is corrupt")
    gc = sub.add_parser("gc", help="evict least-recently-used entries down to a size")
    gc.add_argument("--max-size", default=None, help="e.g. '5 GiB' (default: [cache] max_size)")
    gc.add_argument("--include-locked", action="store_true",
                    help="may also evict what optbuild.lock references")


def run(args: argparse.Namespace) -> int:
    from optbuild import api, lockfile
    from optbuild.store.local import parse_size

    ws = api.open_workspace(args.directory)
    store = ws.store
    try:
        if args.cache_command == "ls":
            total = 0
            for key, entry in sorted(store.iter_entries(), key=lambda kv: kv[1].step if kv[1] else ""):
                if entry is None:
                    print(f"{key[:16]}  CORRUPT ENTRY")
                    continue
                size = sum(o.size for o in entry.outputs.values())
                total += size
                built = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created_at))
                print(f"{key[:16]}  {entry.step:<32} {entry.kind:<22} {_human(size):>10}  {built}")
            print(f"cache size on disk: {_human(store.size_bytes())}")
            return 0
        if args.cache_command == "verify":
            report = store.verify(repair=args.repair)
            print(report)
            return 0 if report.ok else 1
        max_size = parse_size(str(args.max_size or ws.project.config.cache.max_size))
        keep = set() if args.include_locked else {
            record["key"] for record in lockfile.read(ws.project.lock_file).values() if "key" in record
        }
        print(store.gc(max_size, keep=keep))
        return 0
    finally:
        ws.close()


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
