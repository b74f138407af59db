"""optbuild diff [REV|LOCKFILE]: per step, what differs between the lock file and another.

The other is the lock file at a git revision (HEAD when none is named), or a lock file
named by its path (a path that exists is taken as one before a revision of that name).
Exit status 0 whether or not anything differs, as ``git diff``; with ``--exit-code`` 1
when something does.
"""

from __future__ import annotations

import argparse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", nargs="?", default=None, metavar="REV|LOCKFILE",
                        help="a git revision (default HEAD), or the path of a lock file")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.add_argument("--exit-code", action="store_true", help="exit with 1 when something differs")


def run(args: argparse.Namespace) -> int:
    import json

    from optbuild.app.diff import lock_diff

    found = lock_diff(args.directory, args.base)
    if args.json:
        print(json.dumps(found.as_json(), indent=1, sort_keys=False, default=str))
    else:
        print(f"--- {found.base_label}")
        print(f"+++ {found.current.name} (working tree)")
        print("\n".join(found.lines))
    return 1 if found.differs and args.exit_code else 0
