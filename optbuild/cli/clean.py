"""optbuild clean [--cache]"""

from __future__ import annotations

import argparse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", action="store_true", help="also empty the local cache")


def run(args: argparse.Namespace) -> int:
    """Exit 1 when a configured folder was left whole: nothing says optbuild made it."""
    from optbuild import api

    cleaned = api.clean(api.load_project(args.directory), cache=args.cache)
    for path in cleaned.removed:
        print(f"removed {path}")
    for path, why in cleaned.skipped:
        print(f"skipped {path}: {why}")
    return 1 if cleaned.refused else 0
