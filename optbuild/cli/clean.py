"""optbuild clean [--cache]"""

from __future__ import annotations

import argparse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", action="store_true", help="also empty the local cache")


def run(args: argparse.Namespace) -> int:
    from optbuild import api

    ws = api.open_workspace(args.directory)
    try:
        removed = api.clean(ws, cache=args.cache)
    finally:
        ws.close()
    for path in removed:
        print(f"removed {path}")
    return 0
