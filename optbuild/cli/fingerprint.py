"""optbuild fingerprint [--json] [-o FILE]: what this host is, as steps' keys see it.

Record it on a deploy host (``-o host.json``) to plan or fetch artifacts for that host
from another machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# The runtimes' sections of the fingerprint register when optbuild.backends is imported (a
# few ms, nothing heavy). Imported here, with the parser that every command builds, so that
# each command that prints or offers the whole fingerprint (this one, `optbuild worker`) has them.
import optbuild.backends  # noqa: F401


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("-o", "--output", type=Path, default=None, help="write the JSON to FILE")


def run(args: argparse.Namespace) -> int:
    from optbuild.common.fingerprint import Fingerprint

    fields = Fingerprint().as_dict()
    if args.output is not None:
        args.output.write_text(json.dumps({"fields": fields}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.output}")
    elif args.json:
        print(json.dumps(fields, indent=1, sort_keys=True))
    else:
        width = max(map(len, fields), default=0)
        for name, value in fields.items():
            print(f"{name:<{width}}  {value}")
    return 0
