"""optbuild build [TARGET...]"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optbuild.api import ProcessPool, Replay, Workspace
    from optbuild.common.noopreach import Reach


def add_remote_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--remote", metavar="URL", default=None,
                       help="remote cache URL (overrides [remote] url and $OPTBUILD_REMOTE)")
    group.add_argument("--no-remote", action="store_true", help="do not use the remote cache")


def remote_override(args: argparse.Namespace) -> str | bool | None:
    return False if getattr(args, "no_remote", False) else getattr(args, "remote", None)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="recipe or recipe:step (default: everything)")
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    parser.add_argument("--skip-unavailable", action=argparse.BooleanOptionalAction, default=None,
                        help="build what this host can; skip steps it cannot run (e.g. no GPU), "
                             "listing what they need (default: [build] skip_unavailable)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="run steps that failed before with the same key (their failures are "
                             "remembered and reported without running them again)")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="RECIPE:STEP.PARAM=VALUE",
                        help="set a parameter for this run, validated like the recipe and recorded "
                             "in optbuild.lock (repeatable; a matrix step's name sets all its instances)")
    add_remote_flags(parser)
    parser.add_argument("--executor", choices=("local", "dask", "auto"), default=None,
                        help="where steps build: this host, Dask workers (`optbuild worker`), or Dask "
                             "when its scheduler answers, else this host (default: [build] executor)")
    parser.add_argument("--scheduler", metavar="tcp://HOST:PORT", default=None,
                        help="the Dask scheduler for the dask executor (implies --executor dask; "
                             "default: [build] scheduler)")
    parser.add_argument("--download", choices=("targets", "all"), default=None,
                        help="with the dask executor, which outputs come to this host: the targets' "
                             "(the steps named, else each chain's last steps; the rest stay on the "
                             "remote cache, where the nodes read them) or all (default: [build] download)")


def scheduler_override(args: argparse.Namespace) -> str | None:
    """--scheduler, checked as [build] scheduler is."""
    from optbuild.api import check_scheduler
    from optbuild.common.errors import OptbuildError

    try:
        return check_scheduler(args.scheduler) if args.scheduler else None
    except ValueError as exc:
        raise OptbuildError(f"--scheduler: {exc}") from None


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel steps")
    parser.add_argument("-k", "--keep-going", action="store_true",
                        help="build what does not depend on a failed step")
    parser.add_argument("--no-build", action="store_true",
                        help="only restore from the local or remote cache; fail, naming the steps "
                             "that would have to build, if anything is missing")


def report_remote(args: argparse.Namespace, result) -> None:
    """The cache statistics line (the --json stream has the "cache" event instead)."""
    if args.json:
        return
    from optbuild.api import describe_stats

    for event in result.reporter.events:
        if event.get("event") == "cache":
            print(describe_stats(event), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from optbuild.cli.buildserver.server import served_pool
    from optbuild.common.projectroot import project_root
    from optbuild.process.pool import ProcessPool  # not via optbuild.api: the pool starts before it loads

    # first: the fork server imports the steps' tools while optbuild loads the project and
    # plans; in a build server, its fork servers are already warm (their close is a no-op)
    root = project_root(args.directory)
    pool = None if args.no_build else served_pool(root) or ProcessPool.speculative(root)
    try:
        return _build(args, pool, root)
    finally:
        if pool is not None:
            pool.close()


def open_reached(args: argparse.Namespace, root: str | None) -> tuple[Workspace, Reach | None, Replay | None]:
    """The workspace of this build or plan of the project at ``root`` (None: not found,
    which ``open_workspace`` says in its words). When the no-op fast path found that only some
    steps' own files changed since the last ok build (``optbuild.common.noopreach``), only the
    recipes that change reaches are loaded, and the other steps are replayed as recorded."""
    from optbuild import api
    from optbuild.cli import noop

    if root is not None and (reach := noop.take_reach(root)) is not None:
        try:
            ws = api.open_workspace(args.directory, remote=remote_override(args), overrides=args.set,
                                    recipes=reach.recipes)
        except api.OptbuildError:  # an edited recipe reads one the record does not say, or is wrong:
            ws = None             # the whole project loads, and says what is wrong in its words
        if ws is not None:
            recipe_files = {name: os.path.abspath(path) for name, path in ws.project.recipes.items()}
            if (decided := reach.decided(ws.graph.select([]), recipe_files, args.targets)) is not None:
                return ws, reach, api.Replay(reach.events(), decided)
            ws.close()  # the recipes hold other steps than the record says, for a build of targets
    return api.open_workspace(args.directory, remote=remote_override(args), overrides=args.set), None, None


def _build(args: argparse.Namespace, pool: ProcessPool | None, root: str | None) -> int:
    from optbuild import api
    from optbuild.api import Status, make_reporter
    from optbuild.app import noop_record
    from optbuild.common import noopstamp

    if root is not None:  # before the build reads it (its kinds' imports)
        noopstamp.note_written_folder(root)
    ws, reach, replay = open_reached(args, root)
    noopstamp.forget(ws.project.build_dir)  # only a build that ends ok leaves a no-op stamp
    try:
        result = api.build(ws, args.targets, reporter=make_reporter(args.json), jobs=args.jobs,
                           keep_going=args.keep_going or None,
                           skip_unavailable=args.skip_unavailable, fetch_only=args.no_build,
                           retry_failed=args.retry_failed, pool=pool,
                           executor=args.executor, scheduler=scheduler_override(args), download=args.download,
                           replay=replay)
    finally:
        ws.close()
    report_remote(args, result)
    if args.no_build and (missing := result.steps(Status.WOULD_BUILD)):
        print(f"error: --no-build: {len(missing)} step(s) could not be restored from the local or "
              "the remote cache and would have to build:", file=sys.stderr)
        for sid in missing:
            reasons = "; ".join(result.outcomes[sid].reasons)
            print(f"  {sid}" + (f"  ({reasons})" if reasons else ""), file=sys.stderr)
    if not result.ok:
        return 1
    noop_record.record(ws, result, reach)  # the next build or plan may settle from it (see optbuild.cli.noop)
    return 0
