"""optbuild kinds [KIND] [--backend BACKEND]

Without KIND: every step kind (and backend) with what it does, the project's own
(optbuild.toml [kinds]) marked as such when run inside a project. With KIND (or
``KIND/BACKEND``): each parameter with its type, default, description and examples, the
text of docs/steps.md. Reads the step classes only: no recipe loads, and of the project
only its [kinds] files are imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="?", metavar="KIND",
                        help='a step kind ("quantize"), or "engine/onnxruntime"')
    parser.add_argument("--backend", default=None, help="the backend of an engine-like kind")


def run(args: argparse.Namespace) -> int:
    from optbuild.app.kinds import kinds, reference
    from optbuild.common.errors import OptbuildError

    if args.kind is None:
        if args.backend is not None:
            raise OptbuildError("--backend needs a KIND (e.g. optbuild kinds engine --backend tensorrt)")
        rows = kinds(Path.cwd())
        widths = [max((len(row.kind) for row in rows), default=0), max((len(row.backend) for row in rows), default=0)]
        for row in rows:
            print(f"{row.kind:<{widths[0]}}  {row.backend:<{widths[1]}}  {row.summary}")
        print("\noptbuild kinds KIND (or KIND/BACKEND): its parameters")
        return 0
    print(reference(Path.cwd(), args.kind, args.backend), end="")
    return 0
