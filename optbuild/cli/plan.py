"""optbuild plan [TARGET...]: a dry run that says, per step, cached or build and why.

Its counts are what ``optbuild build`` with the same flags does, save what a plan cannot
know, which it notes: where a failure or an unavailable step would stop the build (plan
goes on past it, showing every step), and steps after a rebuild whose output comes out
unchanged (cached, not built).

The plan is the command's answer: its step lines and summary go to stdout (`optbuild plan |
grep would-build`), its warnings, notes and the cache statistics to stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from optbuild.cli.build import add_common, open_reached, report_remote, scheduler_override


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


def run(args: argparse.Namespace) -> int:
    from optbuild import api
    from optbuild.api import make_reporter
    from optbuild.common.projectroot import project_root

    ws, reach, replay = open_reached(args, project_root(args.directory))
    try:
        _warn_shared_model_names(ws, replay.decided if replay is not None else ws.graph.select(args.targets),
                                 reach.published() if reach is not None else [])
        result = api.build(ws, args.targets, reporter=make_reporter(args.json, results=sys.stdout), jobs=1,
                           dry_run=True, skip_unavailable=args.skip_unavailable,
                           retry_failed=args.retry_failed, executor=args.executor,
                           scheduler=scheduler_override(args), replay=replay)
    finally:
        ws.close()
    report_remote(args, result)
    return 0 if result.ok else 1


def _warn_shared_model_names(ws: Any, steps: list[str], replayed: list[tuple[str, str]]) -> None:
    """``replayed``: the deploy steps of the recipes not loaded (step, model name), as recorded."""
    from optbuild.app.deploy import plan_warnings

    for line in plan_warnings(ws.project, steps, replayed):
        print(line, file=sys.stderr)
