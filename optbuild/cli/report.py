"""optbuild report [TARGET...] -o FILE [--deployed DIR]

Writes one self-contained HTML page of what the build chose, per select step (optbuild.app.report
gathers it from the build folder and optbuild.lock, optbuild.app.report_html draws it). Nothing
is built: a select step not built is said so, on the page and here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="recipe or recipe:step whose select steps to show (default: all of them)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                        help="the HTML page to write (replaced whole)")
    parser.add_argument("--deployed", type=Path, default=None, metavar="DIR",
                        help="the model repository `optbuild deploy --to DIR` published into: show what it serves")


def run(args: argparse.Namespace) -> int:
    from optbuild import api
    from optbuild.app.report import gather
    from optbuild.app.report_html import render
    from optbuild.common.atomic import write_atomic
    from optbuild.common.errors import OptbuildError, is_disk_full

    ws = api.open_workspace(args.directory, remote=False)
    try:
        report = gather(ws, args.targets, deployed=args.deployed)
    finally:
        ws.close()
    try:
        write_atomic(args.output, render(report).encode())
    except OSError as exc:
        if is_disk_full(exc):
            raise
        raise OptbuildError(f"-o {args.output}: cannot write the page ({exc.strerror or exc}); name a file "
                            "in a folder you can write") from None
    for selection in report.not_built:
        print(f"note: {selection.step.step}: {selection.note}", file=sys.stderr)
    print(f"wrote {args.output}: {len(report.selections)} select step(s)"
          + (f", {len(report.not_built)} not built" if report.not_built else ""))
    return 0
