"""optbuild kinds [KIND] [--backend BACKEND]

Without KIND: every step kind (and backend) with what it does. With KIND (or
``KIND/BACKEND``): each parameter with its type, default, description and examples, the
text of docs/steps.md. Reads the step classes only: no project, and nothing heavy loads.
"""

from __future__ import annotations

import argparse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="?", metavar="KIND",
                        help='a step kind ("quantize"), or "engine/onnxruntime"')
    parser.add_argument("--backend", default=None, help="the backend of an engine-like kind")


def run(args: argparse.Namespace) -> int:
    from optbuild import reference
    from optbuild.errors import OptbuildError
    from optbuild.steps import registry

    if args.kind is None:
        if args.backend is not None:
            raise OptbuildError("--backend needs a KIND (e.g. optbuild kinds engine --backend tensorrt)")
        rows = [(kind, backend, reference.summary(reference.step_class(name)))
                for kind in registry.known_kinds()
                for name in reference.step_names(kind)
                for backend in [name.partition("/")[2]]]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        for kind, backend, text in rows:
            print(f"{kind:<{widths[0]}}  {backend:<{widths[1]}}  {text}")
        print("\noptbuild kinds KIND (or KIND/BACKEND): its parameters")
        return 0
    names = reference.step_names(args.kind, args.backend)
    print("\n".join(reference.kind_reference(name) for name in names), end="")
    return 0
