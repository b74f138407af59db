"""optbuild graph [TARGET...] [--format dot|mermaid]"""

from __future__ import annotations

import argparse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="TARGET")
    parser.add_argument("--format", choices=("dot", "mermaid"), default="dot")


def run(args: argparse.Namespace) -> int:
    from optbuild.project.graph import StepGraph
    from optbuild.project.recipe import load_project

    graph = StepGraph(load_project(args.directory).steps)
    selected = graph.select(args.targets)
    print(graph.dot(selected) if args.format == "dot" else graph.mermaid(selected), end="")
    return 0
