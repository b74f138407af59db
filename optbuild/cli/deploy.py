"""optbuild deploy --to DIR [--keep N] [--no-build] [--fingerprint FILE] [--replace] [--json] [TARGET...]
| --rollback MODEL

Publishes the outputs of the project's ``deploy`` steps (optbuild.steps.deploy) into a Triton
model repository: each is built, or restored from the local or remote cache for this host's
fingerprint (with ``--no-build``, only restored; with ``--fingerprint``, restored for the host
recorded in FILE), then switched in atomically (optbuild.cli.publish), recording in
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
    from optbuild.cli import publish
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
    _one_step_per_model([(sid, release.model) for sid, release in found])
    for _, release in found:  # what would be refused, before any model is published
        publish.check(release, args.to, replace=args.replace)
    changes = [publish.publish(release, args.to, args.keep, replace=args.replace) for _, release in found]
    _report(args, changes, ok=True)
    return 0


def _one_step_per_model(published: list[tuple[str, str]]) -> None:
    """OptbuildError when two deploy steps publish one model name into the repository."""
    from optbuild.common.errors import OptbuildError

    clashes = shared_model_names(published)
    if clashes:
        raise OptbuildError("\n".join(clashes))


def shared_model_names(published: list[tuple[str, str]]) -> list[str]:
    """For each model name that two or more (step, model) pairs publish, a line naming them
    (``optbuild plan`` says it before anything builds; ``optbuild deploy`` refuses it)."""
    by_model: dict[str, list[str]] = {}
    for sid, model in published:
        if sid not in by_model.setdefault(model, []):
            by_model[model].append(sid)
    return [f"deploy steps {', '.join(sids)} all publish model {model!r} into one repository: give each "
            "its own model_name" for model, sids in sorted(by_model.items()) if len(sids) > 1]


def deploy_models(project: Any, sids: list[str]) -> list[tuple[str, str]]:
    """(step, model name) for the deploy steps among ``sids``: its model_name, else its recipe's."""
    steps = project.steps
    return [(sid, getattr(steps[sid].step.params, "model_name", None) or steps[sid].recipe)
            for sid in sids if steps[sid].kind == "deploy"]


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
        _one_step_per_model(deploy_models(ws.project, wanted))  # before anything builds
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
    except OSError as exc:
        raise OptbuildError(f"--fingerprint {path}: cannot read it ({exc.strerror or exc}); write it on the deploy "
                            f"host with `optbuild fingerprint -o {path.name}`") from None
    except ValueError as exc:
        raise OptbuildError(f"--fingerprint {path}: not a fingerprint: {exc}; write it on the deploy host with "
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
