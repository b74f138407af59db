"""optbuild server status|stop"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

ASK_S = 5.0  # stop: how long a server may take to answer (it answers between builds)
STOP_S = 10.0  # stop: how long it may take to end once asked, then once sent SIGTERM, before SIGKILL


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["status", "stop"],
                        help="status: whether the project's build server runs, and what it holds; "
                             f"stop: end it (a build it runs is cancelled after {ASK_S + STOP_S:g} s; "
                             f"one that does not end is killed {STOP_S:g} s later)")
    parser.add_argument("--json", action="store_true", help="status as one JSON object")


def run(args: argparse.Namespace) -> int:
    """0: it runs (status), or it was stopped / none ran (stop); 1: none runs (status)."""
    from optbuild.cli.buildserver import protocol
    from optbuild.common.errors import OptbuildError
    from optbuild.common.projectroot import CONFIG_NAME, project_root

    root = project_root(args.directory)
    if root is None:
        raise OptbuildError(f"no {CONFIG_NAME} here or in any parent folder")
    try:
        pid = protocol.server_pid(root)
    except OSError as exc:
        raise OptbuildError(f"the build server's folder cannot be read: {exc}") from None
    if args.action == "status":
        return _status(args, root, pid)
    if pid is None:
        print(f"no build server runs for {root}", file=sys.stderr)
        return 0
    print(f"{_stop(root, pid)} the build server (pid {pid})", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace, root: str, pid: int | None) -> int:
    """What the server says of itself; its pid alone when it does not answer."""
    from optbuild.cli.buildserver import protocol

    answer = None
    if pid is not None and not protocol.stopped(pid):
        try:
            answer = protocol.request(root, {"op": "status"}, timeout=ASK_S)
        except (OSError, ValueError):
            answer = None
    if args.json:
        print(json.dumps(answer or ({"running": True, "answering": False, "pid": pid, "root": root,
                                     "stopped": protocol.stopped(pid)} if pid else {"running": False, "root": root})))
    elif answer is not None:
        print(f"build server pid {answer['pid']} for {answer['root']}: up {answer['uptime_s']:g} s, "
              f"{answer['builds']} build(s), idle {answer['idle_s']:g} s of {answer['idle_limit_s']:g} s; "
              f"log: {answer['log']}")
        for fork in answer.get("fork_servers", []):
            print(f"  fork server pid {fork['pid']}: {', '.join(fork['modules'])}"
                  + ("" if fork["usable"] is not False else " (unusable)"))
    elif pid is not None:
        why = "is stopped" if protocol.stopped(pid) else "did not answer (it may be building)"
        print(f"build server pid {pid} for {root} {why}; `optbuild server stop` ends it")
    else:
        print(f"no build server runs for {root}")
    return 0 if pid is not None or answer is not None else 1


def _stop(root: str, pid: int) -> str:
    """End the server: asked (it stops between builds), then SIGTERM (cancelling a build it
    runs; a stopped one is continued to act on it), then SIGKILL; says which ended it."""
    from optbuild.cli.buildserver import protocol

    if not protocol.stopped(pid):
        try:
            answer = protocol.request(root, {"op": "stop"}, timeout=ASK_S)
        except (OSError, ValueError):  # busy with a build, or hung
            answer = None
        if answer is not None and _gone(pid, STOP_S):
            return "stopped"
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline:  # again and again: one cancelling a build ignores it until it is done
        _signal(pid, signal.SIGTERM)
        _signal(pid, signal.SIGCONT)
        if _gone(pid, 1.0):
            return "terminated (SIGTERM)"
    _signal(pid, signal.SIGKILL)
    _gone(pid, STOP_S)
    return "killed (SIGKILL)"


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
