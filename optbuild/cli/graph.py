"""optbuild graph [TARGET...] [--format dot|mermaid|png|svg] [-o FILE]

DOT and Mermaid are text, printed; PNG and SVG are drawn by graphviz's ``dot`` (found on PATH),
into ``-o FILE`` or, for SVG, onto stdout.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from optbuild.common.errors import OptbuildError

NO_GRAPHVIZ = ("--format {fmt} draws with graphviz's `dot`, which is not on PATH: install graphviz "
               "(apt-get install graphviz, brew install graphviz, conda install graphviz), or "
               "print the text with --format dot or --format mermaid")


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="TARGET")
    parser.add_argument("--format", choices=("dot", "mermaid", "png", "svg"), default="dot",
                        help="png and svg need graphviz (its `dot` on PATH)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the graph here (needed for png, which is no terminal text)")


def run(args: argparse.Namespace) -> int:
    from optbuild.app.graph import graph_text

    if args.format == "png" and args.output is None:
        raise OptbuildError("--format png needs -o FILE (an image is not printed to a terminal)")
    dot = shutil.which("dot") if args.format in ("png", "svg") else None
    if args.format in ("png", "svg") and dot is None:
        raise OptbuildError(NO_GRAPHVIZ.format(fmt=args.format))
    text = graph_text(args.directory, args.targets, "mermaid" if args.format == "mermaid" else "dot")
    if dot is not None:
        return _draw(dot, text, args.format, args.output)
    if args.output is not None:
        args.output.write_text(text)
    else:
        print(text, end="")
    return 0


def _draw(dot: str, text: str, fmt: str, output: Path | None) -> int:
    """Run graphviz; its errors (a DOT it cannot read) come back as ours, with its words."""
    command = [dot, f"-T{fmt}", *(["-o", str(output)] if output is not None else [])]
    done = subprocess.run(command, input=text.encode(), stdout=None if output else sys.stdout.buffer,
                          stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise OptbuildError(f"graphviz's dot failed (exit {done.returncode}): {done.stderr.decode().strip()}")
    return 0
