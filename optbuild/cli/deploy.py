"""optbuild deploy --to DIR [--keep N] [--no-build] [--fingerprint FILE] [TARGET...] | --rollback MODEL

Publishes the outputs of the project's ``deploy`` steps (optbuild.steps.deploy) into a Triton
model repository: each is built, or restored from the local or remote cache for this host's
fingerprint (with ``--no-build``, only restored; with ``--fingerprint``, restored for the host
recorded in FILE), then switched in atomically (optbuild.cli.publish), recording in
``<model>/<version>/optbuild.json`` which keys were used and where and when they were built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint
    from optbuild.store.remote import RemoteStore

_FROM = {"built": "built here", "cached": "local cache", "restored": "remote cache"}


def add_parser(parser: argparse.ArgumentParser) -> None:
    from optbuild.cli.build import add_remote_flags

    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="recipe or recipe:step whose deploy steps to publish (default: all of them)")
    parser.add_argument("--to", type=Path, required=True, metavar="DIR",
                        help="the Triton model repository (made if missing)")
    parser.add_argument("--keep", type=int, default=2, metavar="N",
                        help="versions of each model to keep, the current one included (default 2: one to "
                             "roll back to)")
    parser.add_argument("--no-build", action="store_true",
                        help="only restore from the local or remote cache; fail, naming the steps that would "
                             "have to build, if anything is missing")
    parser.add_argument("--fingerprint", type=Path, default=None, metavar="FILE",
                        help="compute the keys for the host recorded in FILE (`optbuild fingerprint -o FILE` "
                             "there) instead of this one; implies --no-build: what is built here is this host's")
    parser.add_argument("--rollback", metavar="MODEL", default=None,
                        help="make MODEL's previous version current again (builds nothing)")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="RECIPE:STEP.PARAM=VALUE",
                        help="set a parameter for this run, as with build")
    add_remote_flags(parser)


def run(args: argparse.Namespace) -> int:
    from optbuild.cli import publish
    from optbuild.common.errors import OptbuildError

    if args.keep < 1:
        raise OptbuildError(f"--keep {args.keep}: keep at least the current version (1)")
    if args.rollback is not None:
        if args.targets:
            raise OptbuildError("--rollback takes a model name and no targets")
        change = publish.rollback(args.to, args.rollback)
        print(f"{change.model}: {change.what} to version {change.version} in {args.to}")
        return 0
    found = _build(args)
    if found is None:
        return 1
    by_model: dict[str, str] = {}
    for sid, release in found:
        if release.model in by_model:
            raise OptbuildError(f"deploy steps {by_model[release.model]} and {sid} both publish model "
                                f"{release.model!r}: give one of them another model_name")
        by_model[release.model] = sid
    for sid, release in found:
        change = publish.publish(release, args.to, args.keep)
        print(f"{change.model}: {change.what}, version {change.version} in {args.to} ({sid})")
    return 0


def _build(args: argparse.Namespace) -> list[tuple[str, Any]] | None:
    """Build or restore the selected deploy steps: (step, release) for each model they hold,
    or None (after saying why) when one of them is not in place."""
    from optbuild import api
    from optbuild.builder.report import make_reporter
    from optbuild.cli import publish
    from optbuild.cli.build import remote_override
    from optbuild.common.errors import OptbuildError

    ws = api.open_workspace(args.directory, remote=remote_override(args), overrides=args.set)
    try:
        steps = ws.project.steps
        wanted = [sid for sid in ws.graph.select(args.targets) if steps[sid].kind == "deploy"]
        if not wanted:
            raise OptbuildError(f"no deploy step in {' '.join(args.targets) or 'the project'}: add one "
                                "([steps.NAME] kind = \"deploy\", input = \"...\")")
        fetch_only = args.no_build or args.fingerprint is not None
        result = api.build(ws, wanted, reporter=make_reporter(False), host=_host(args.fingerprint),
                           fetch_only=fetch_only)
    finally:
        ws.close()
    if any(not result.outcomes[sid].status.ok for sid in wanted):
        _say_missing(result.outcomes, wanted, fetch_only)
        return None
    found = []
    for sid in wanted:
        spec = steps[sid]
        provenance = {"step": sid, **_used(result.outcomes[sid], ws.remote),
                      "inputs": {field: {"step": dep, **_used(result.outcomes[dep], ws.remote)}
                                 for field, dep in spec.deps.items()}}
        found += [(sid, r) for r in publish.releases(ws.project.build_dir / spec.recipe / spec.name, provenance)]
    return found


def _say_missing(outcomes: dict[str, Any], wanted: list[str], fetch_only: bool) -> None:
    """Why nothing is published: each step that is missing itself, with its key (upstream
    first), then the steps that only wait on those, counted, the deploy steps named."""
    from optbuild.builder.status import Status

    waiting = []
    for sid, outcome in outcomes.items():
        if outcome.status.ok:
            continue
        if outcome.status == Status.WOULD_BUILD and outcome.key is None:  # its upstream is missing
            waiting.append(sid)
            continue
        why = "; ".join(outcome.reasons) or outcome.error or ""
        key = f", key {outcome.key}" if outcome.key else ""
        print(f"error: {sid} is {outcome.status}{key}" + (f" ({why})" if why else ""), file=sys.stderr)
    if waiting:
        deploys = [sid for sid in waiting if sid in wanted]
        print(f"error: {len(waiting)} step(s) after them wait on them"
              + (f", among them {', '.join(deploys)}" if deploys else ""), file=sys.stderr)
    hint = (": what would build was not pushed for this fingerprint; build those steps for it on the "
            "build farm (docs/deploy.md)" if fetch_only else "")
    print(f"error: nothing was published{hint}", file=sys.stderr)


def _host(path: Path | None) -> Fingerprint | None:
    """The fingerprint recorded in ``path`` (None: this host's, probed by the build)."""
    from optbuild.common.errors import OptbuildError
    from optbuild.common.fingerprint import Fingerprint

    if path is None:
        return None
    try:
        return Fingerprint.load(path)
    except (OSError, ValueError) as exc:
        raise OptbuildError(f"--fingerprint {path}: cannot read it ({exc}); write it on the deploy host with "
                            f"`optbuild fingerprint -o {path.name}`") from None


def _used(outcome: Any, remote: RemoteStore | None) -> dict[str, Any]:
    """Which action a step's output is, where and when it was built, and where it came from.

    Remote entries do not say who pushed them: an optbuild pushes what it built, so built_on
    names the pusher; with a signing key, ``signed_with`` names the key that vouched for it
    (the entry was accepted only under a valid signature of that key)."""
    from optbuild.store.remote import key_id

    entry = outcome.entry
    used = {"key": outcome.key, "built_on": entry.built_on if entry else None,
            "built_at": entry.created_at if entry else None, "from": _FROM.get(str(outcome.status))}
    if outcome.source == "remote" and remote is not None:
        used["remote"] = remote.display_url
        used["signed_with"] = key_id(remote.signing_key) if remote.signing_key else None
    if entry is not None and "chosen" in entry.metrics:  # a select step: which candidate won
        used["chosen"] = entry.metrics["chosen"]
    return used
