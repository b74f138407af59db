"""optbuild server status|stop"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["status", "stop"],
                        help="status: whether the project's build server runs, and what it holds; "
                             "stop: end it (after the build it runs, if any)")
    parser.add_argument("--json", action="store_true", help="status as one JSON object")


def run(args: argparse.Namespace) -> int:
    """0: it runs (status), or it was stopped / none ran (stop); 1: none runs (status)."""
    from optbuild.buildserver import protocol
    from optbuild.errors import OptbuildError
    from optbuild.projectroot import CONFIG_NAME, project_root

    root = project_root(args.directory)
    if root is None:
        raise OptbuildError(f"no {CONFIG_NAME} here or in any parent folder")
    try:
        answer = protocol.request(root, {"op": args.action}, timeout=None if args.action == "stop" else 10)
    except (PermissionError, OSError, ValueError) as exc:
        raise OptbuildError(f"the build server did not answer: {exc}") from None
    if args.action == "status":
        if args.json:
            print(json.dumps(answer or {"running": False, "root": root}))
        elif answer is None:
            print(f"no build server runs for {root}")
        else:
            print(f"build server pid {answer['pid']} for {answer['root']}: up {answer['uptime_s']:g} s, "
                  f"{answer['builds']} build(s), idle {answer['idle_s']:g} s of {answer['idle_limit_s']:g} s; "
                  f"log: {answer['log']}")
            for fork in answer.get("fork_servers", []):
                print(f"  fork server pid {fork['pid']}: {', '.join(fork['modules'])}"
                      + ("" if fork["usable"] is not False else " (unusable)"))
        return 0 if answer is not None else 1
    if answer is None:
        print(f"no build server runs for {root}", file=sys.stderr)
        return 0
    pid = int(answer["pid"])
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"stopped the build server (pid {pid})", file=sys.stderr)
    return 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False if sys.platform.startswith("linux") else _exists(pid)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
