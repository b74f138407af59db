"""``optbuild`` command line: one module per subcommand, each with ``add_parser`` and ``run``.

Only argparse and the light core are imported here; subcommand modules are imported when
chosen, and heavy libraries only inside the steps that need them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from optbuild import __version__

SUBCOMMANDS = {
    "build": "build and cache the selected steps",
    "plan": "dry run: what would build, and why",
    "graph": "print the step graph (DOT or Mermaid)",
    "explain": "a step's key ingredients and provenance",
    "clean": "remove build outputs (and the cache with --cache)",
    "cache": "the local and remote caches: ls, verify, gc, push, pull, stats, audit",
    "fingerprint": "print this host's fingerprint (GPU, CUDA, TensorRT, CPU, OS)",
    "kinds": "the step kinds, and each kind's parameters (types, defaults, descriptions)",
    "bench": "latency and throughput of built models on this host (onnxruntime CPU, PyTorch eager)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optbuild", description="Declarative, cached builds of ONNX and TensorRT artifacts.")
    parser.add_argument("--version", action="version", version=f"optbuild {__version__}")
    parser.add_argument("-C", "--directory", type=Path, default=None,
                        help="run as if started in this directory")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in SUBCOMMANDS.items():
        module = importlib.import_module(f"optbuild.cli.{name}")
        module.add_parser(sub.add_parser(name, help=summary, description=summary))
    return parser


def _show_warnings() -> None:
    """optbuild's own logged warnings (a damaged lock file...) as "warning: ..." lines."""
    logger = logging.getLogger("optbuild")
    if not logger.handlers:  # main() may run more than once in a process
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    from optbuild.errors import DiskFullError, OptbuildError, describe_os_error, is_disk_full

    args = _parser().parse_args(argv)
    module = importlib.import_module(f"optbuild.cli.{args.command}")
    _show_warnings()
    try:
        try:
            return module.run(args)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFullError(describe_os_error(exc)) from None
    except OptbuildError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}" if line else "", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the steps that had finished are kept (in the cache and the build "
              "folder); the steps that were running left nothing behind", file=sys.stderr)
        return 130


