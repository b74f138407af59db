"""optbuild bench TARGET... : latency and throughput of built models on this host.

Builds the targets first (from the cache when nothing changed), then measures every ONNX /
ORT-format model on the backend that runs it, with PyTorch eager where a recipe exports from
PyTorch (on the CPU, and on CUDA too where torch sees a GPU): the use case is optbuild.app.bench;
this package parses the arguments and prints (``present``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable


def _count(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="+", metavar="TARGET",
                        help="recipe (every step that gives an ONNX / ORT model) or recipe:step")
    parser.add_argument("--runs", type=_count(1), default=100, help="timed runs per model (default 100)")
    parser.add_argument("--warmup", type=_count(0), default=10, help="untimed runs first (default 10)")
    parser.add_argument("--batch", type=_count(1), default=1,
                        help="size of an open batch axis (axis 0, and dims named like it), also where "
                             "[inputs.NAME] declares a batch range that holds it (default 1)")
    parser.add_argument("--threads", type=_count(1), default=None,
                        help="intra-op threads for onnxruntime and torch.set_num_threads "
                             "(default: each library's own)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", action="store_true",
                        help="also write build/<recipe>/bench.png (needs matplotlib)")
    parser.add_argument("--no-build", action="store_true",
                        help="only restore from the caches; fail, naming them, if steps would have to build")


def run(args: argparse.Namespace) -> int:
    from optbuild import api
    from optbuild.app.bench import BenchOptions, bench
    from optbuild.cli.bench import present

    if args.plot:
        present.plot_module()  # fail before minutes of measuring, not after
    options = BenchOptions(runs=args.runs, warmup=args.warmup, batch=args.batch,
                           threads=args.threads, build=not args.no_build)
    ws = api.open_workspace(args.directory)
    try:
        # progress and the build's events go to stderr: stdout holds only the results (--json)
        benched = bench(ws, args.targets, options, reporter=api.make_reporter(False),
                        progress=lambda message: api.write_line(sys.stderr, message))
        root = ws.project.root
    finally:
        ws.close()
    if args.plot:
        present.write_plots(benched)
    if args.json:
        print(json.dumps(present.as_json(benched, root), indent=1))
    elif sys.stdout.isatty():
        present.print_rich(benched)
    else:
        print("\n\n".join(present.plain_table(result) for result in benched))
    return 0
