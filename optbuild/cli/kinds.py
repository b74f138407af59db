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
    from optbuild.common.errors import OptbuildError
    from optbuild.project.recipe import project_kinds
    from optbuild.steps import manual, registry

    local = project_kinds(Path.cwd())
    if args.kind is None:
        if args.backend is not None:
            raise OptbuildError("--backend needs a KIND (e.g. optbuild kinds engine --backend tensorrt)")
        rows = [(kind, backend, manual.summary(manual.step_class(name, local))
                 + (f" [project: {Path(local[name].rpartition(':')[0]).name}]" if name in local else ""))
                for kind in registry.known_kinds(local)
                for name in manual.step_names(kind, local=local)
                for backend in [name.partition("/")[2]]]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        for kind, backend, text in rows:
            print(f"{kind:<{widths[0]}}  {backend:<{widths[1]}}  {text}")
        print("\noptbuild kinds KIND (or KIND/BACKEND): its parameters")
        return 0
    names = manual.step_names(args.kind, args.backend, local)
    print("\n".join(manual.kind_reference(name, local) for name in names), end="")
    return 0
