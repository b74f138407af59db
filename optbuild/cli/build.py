"""optbuild build [TARGET...]"""

from __future__ import annotations

import argparse


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="recipe or recipe:step (default: everything)")
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    parser.add_argument("--skip-unavailable", action="store_true",
                        help="build what this host can; skip steps it cannot run (e.g. no GPU)")


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel steps")
    parser.add_argument("-k", "--keep-going", action="store_true",
                        help="build what does not depend on a failed step")


def run(args: argparse.Namespace) -> int:
    from optbuild import api
    from optbuild.report import make_reporter

    ws = api.open_workspace(args.directory)
    try:
        result = api.build(ws, args.targets, reporter=make_reporter(args.json), jobs=args.jobs,
                           keep_going=args.keep_going or None,
                           skip_unavailable=args.skip_unavailable)
    finally:
        ws.close()
    return 0 if result.ok else 1
