"""``optbuild`` command line: one module per subcommand, each with ``add_parser`` and ``run``.

Only the standard library's os and sys are imported here, so that a no-op ``build`` can
settle from its stamp (optbuild.cli.noop) first; argparse and the subcommand modules are
imported when the normal path runs, and heavy libraries only inside the steps that need them.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported for it: start-up time

from optbuild import __version__

if TYPE_CHECKING:
    import argparse
    from typing import Any

# A command holds a large heap that lives as long as it does (the project's steps, the decision
# memo, the lock file) and makes few cycles. At Python's default thresholds (700, 10, 10) the
# collector rescans that heap so often that it was a quarter of a `plan` at 10,000 steps
# (1.97-2.09 s -> 1.54-1.60 s); memory stayed the same. Step processes keep the defaults.
GC_THRESHOLDS = (50_000, 20, 100)

SUBCOMMANDS = {
    "build": "build and cache the selected steps",
    "plan": "dry run: what would build, and why",
    "graph": "print the step graph (DOT or Mermaid), or draw it (PNG or SVG, with graphviz)",
    "explain": "a step's key ingredients and provenance",
    "diff": "what differs per step from the lock file at a git revision, or another lock file",
    "clean": "remove build outputs (and the cache with --cache)",
    "cache": "the local and remote caches: ls, verify, gc, push, pull, stats, audit",
    "fingerprint": "print this host's fingerprint (GPU, CUDA, TensorRT, CPU, OS)",
    "kinds": "the step kinds, and each kind's parameters (types, defaults, descriptions)",
    "bench": "latency and throughput of built models on this host (onnxruntime CPU, PyTorch eager)",
    "worker": "a build node for the dask executor: a Dask worker offering this host's fingerprint",
    "server": "the project's build server: status, stop",
    "deploy": "publish deploy steps into a Triton model repository, switched atomically; --rollback",
    "report": "write one HTML page of what the build chose: variants, latencies, the choice and why, keys",
    "completion": "print a shell completion script (bash, zsh, fish): targets, step kinds, flags",
}


def _parser() -> argparse.ArgumentParser:
    import argparse
    import importlib
    from pathlib import Path

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
    import logging

    logger = logging.getLogger("optbuild")
    if not logger.handlers:  # main() may run more than once in a process
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP: the terminal closed), raised in the main thread: a
    KeyboardInterrupt, so that it takes the path of Ctrl-C (workers killed, scratch space
    removed, finished steps kept). ``signum``: the signal, for the exit status."""

    def __init__(self, signum: int = 15):
        super().__init__(signum)
        self.signum = signum


_ENDING = (15, 1)  # SIGTERM, SIGHUP (numbers: the signal module is imported only when used)


def _terminate(signum: int, frame: object) -> None:
    """Further SIGTERMs and SIGHUPs are ignored: they must not cut short the cleanup the
    first began (SIGKILL still ends it)."""
    import signal

    for ending in _ENDING:
        signal.signal(ending, signal.SIG_IGN)
    raise Terminated(signum)


class _sigterm_as_interrupt:  # lower case: used as the function it replaced
    """SIGTERM and SIGHUP raise Terminated while the command runs (a SIGHUP that was ignored,
    as under nohup, stays ignored); the handlers found are put back after (main() may run
    more than once in a process). Only the main thread can do so."""

    def __enter__(self) -> None:
        import signal
        import threading

        self.previous: dict[int, Any] = {}  # signal.getsignal's answer, given back as it was
        if threading.current_thread() is threading.main_thread():
            for signum in _ENDING:
                if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                    continue
                self.previous[signum] = signal.signal(signum, _terminate)

    def __exit__(self, *exc: object) -> None:
        import signal

        for signum, previous in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)


def main(argv: list[str] | None = None, *, fast_path: bool = True) -> int:
    """``fast_path``: False in a build server, whose client tried the no-op fast path.

    Exit status: 0 done, 1 a step failed, 2 an error, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
    (128 + the signal, as a shell reports a command the signal killed), 141 stdout closed by its reader
    (as ``ls | head`` reports under ``set -o pipefail``: the output was cut short)."""
    try:
        try:
            return _main(argv, fast_path)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not as a warning when Python exits
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())  # for Python's exit flush
        os.close(null)
        return 141


def _main(argv: list[str] | None, fast_path: bool) -> int:
    from optbuild.cli import noop
    from optbuild.common import noopstamp

    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["__complete"]:  # a shell's TAB (optbuild.cli.completion): no parser, no project load
        from optbuild.cli import completion

        return completion.words(arguments[1:])
    serve_root = None  # a project whose build server to start once this build has ended
    if fast_path:
        noopstamp.mark_start(arguments)
        if (code := noop.try_fast_path(arguments)) is not None:
            return code
        if (split := noopstamp.split_build_args(arguments)) is not None:
            from optbuild.cli.buildserver import client

            code, serve_root = client.try_build(arguments, split[0])
            if code is not None:
                return code
    code = _run_command(arguments)
    if serve_root is not None and code in (0, 1):  # not after an error (an invalid project) or a cancel
        from optbuild.cli.buildserver import client

        client.spawn(serve_root)
    return code


def _run_command(arguments: list[str]) -> int:
    import gc
    import importlib

    from optbuild.common.errors import OptbuildError, full_disk_named

    gc.set_threshold(*GC_THRESHOLDS)

    args = _parser().parse_args(arguments)
    module = importlib.import_module(f"optbuild.cli.{args.command}")
    _show_warnings()
    with _sigterm_as_interrupt():
        try:
            with full_disk_named():
                return module.run(args)
        except OptbuildError as exc:
            for line in str(exc).splitlines():
                print(f"error: {line}" if line else "", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            print("interrupted: the steps that had finished are kept (in the cache and the build "
                  "folder); the steps that were running left nothing behind", file=sys.stderr)
            return 128 + exc.signum if isinstance(exc, Terminated) else 130
