"""optbuild deploy --to DIR [--keep N] [--no-build] [--fingerprint FILE] [--replace] [--json] [TARGET...]
| --rollback MODEL

Publishes the outputs of the project's ``deploy`` steps (optbuild.steps.deploy) into a Triton
model repository: each is built, or restored from the local or remote cache for this host's
fingerprint (with ``--no-build``, only restored; with ``--fingerprint``, restored for the host
recorded in FILE), then switched in atomically (optbuild.app.publish), recording in
``<model>/<version>/optbuild.json`` which keys were used and where and when they were built.
A model another step published is replaced only with ``--replace``; ``--json`` prints what
changed as one JSON object, for a CD pipeline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optbuild.app.deploy import DeploySelection
    from optbuild.common.fingerprint import Fingerprint


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
                        help="make MODEL's previous version current again (builds nothing); safe to retry")
    parser.add_argument("--replace", action="store_true",
                        help="publish even where the model's served version was published by another step "
                             "(another recipe or project, or another model_name): without it, that is refused")
    parser.add_argument("--json", action="store_true",
                        help="print what changed as one JSON object on stdout (for CD pipelines)")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="RECIPE:STEP.PARAM=VALUE",
                        help="set a parameter for this run, as with build")
    add_remote_flags(parser)


def run(args: argparse.Namespace) -> int:
    from optbuild.app import publish
    from optbuild.app.deploy import one_step_per_model
    from optbuild.common.errors import OptbuildError

    if args.keep < 1:
        raise OptbuildError(f"--keep {args.keep}: keep at least the current version (1)")
    if args.rollback is not None:
        if args.targets:
            raise OptbuildError("--rollback takes a model name and no targets")
        change = publish.rollback(args.to, args.rollback)
        _report(args, [change], ok=True)
        return 0
    found = _build(args)
    if found is None:
        _report(args, [], ok=False)
        return 1
    one_step_per_model([(sid, release.model) for sid, release in found])
    for _, release in found:  # what would be refused, before any model is published
        publish.check(release, args.to, replace=args.replace)
    changes = [publish.publish(release, args.to, args.keep, replace=args.replace) for _, release in found]
    _report(args, changes, ok=True)
    return 0


def _report(args: argparse.Namespace, changes: list[Any], ok: bool) -> None:
    """What changed, one line per model, or (--json) one JSON object."""
    import json

    if args.json:
        print(json.dumps({"ok": ok, "to": str(args.to), "changes": [
            {"model": c.model, "what": c.what, "version": c.version, "previous": c.previous, "step": c.step}
            for c in changes]}))
        return
    for c in changes:
        if c.what == "rolled back":
            print(f"{c.model}: rolled back to version {c.version} in {args.to}")
        else:
            print(f"{c.model}: {c.what}, version {c.version} in {args.to} ({c.step})")


def _build(args: argparse.Namespace) -> list[tuple[str, Any]] | None:
    """Build or restore the selected deploy steps: (step, release) for each model they hold,
    or None (after saying why) when one of them is not in place."""
    from optbuild import api
    from optbuild.api import make_reporter
    from optbuild.app import publish
    from optbuild.app.deploy import select_deploys
    from optbuild.cli.build import remote_override

    ws = api.open_workspace(args.directory, remote=remote_override(args), overrides=args.set)
    try:
        selection = select_deploys(ws, args.targets, fetch_only=args.no_build, host=_host(args.fingerprint),
                                   reporter=make_reporter(False))
    finally:
        ws.close()
    if not selection.ok:
        _say_missing(selection)
        return None
    return [(output.step, release) for output in selection.outputs
            for release in publish.releases(output.folder, output.provenance)]


def _say_missing(selection: DeploySelection) -> None:
    """Why nothing is published: each step that is missing itself, with its key (upstream
    first), then the steps that only wait on those, counted, the deploy steps named."""
    for sid, outcome in selection.missing:
        why = "; ".join(outcome.reasons) or outcome.error or ""
        key = f", key {outcome.key}" if outcome.key else ""
        print(f"error: {sid} is {outcome.status}{key}" + (f" ({why})" if why else ""), file=sys.stderr)
    if waiting := selection.waiting:
        deploys = [sid for sid in waiting if sid in selection.wanted]
        print(f"error: {len(waiting)} step(s) after them wait on them"
              + (f", among them {', '.join(deploys)}" if deploys else ""), file=sys.stderr)
    hint = (": what would build was not pushed for this fingerprint; build those steps for it on the "
            "build farm (docs/deploy.md)" if selection.fetch_only else "")
    print(f"error: nothing was published{hint}", file=sys.stderr)


def _host(path: Path | None) -> Fingerprint | None:
    """The fingerprint recorded in ``path`` (None: this host's, probed by the build)."""
    from optbuild.common.errors import OptbuildError
    from optbuild.common.fingerprint import Fingerprint

    if path is None:
        return None
    try:
        return Fingerprint.load(path)
    except OSError as exc:
        raise OptbuildError(f"--fingerprint {path}: cannot read it ({exc.strerror or exc}); write it on the deploy "
                            f"host with `optbuild fingerprint -o {path.name}`") from None
    except ValueError as exc:
        raise OptbuildError(f"--fingerprint {path}: not a fingerprint: {exc}; write it on the deploy host with "
                            f"`optbuild fingerprint -o {path.name}`") from None
