"""Deploy's selection: which deploy steps to publish, built or restored, and what each output
folder is with its provenance. Publishing into a model repository is the CLI's
(``optbuild.app.publish``); this is what comes before it, for a Python user too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild import api
from optbuild.builder.outcome import Outcome
from optbuild.builder.report import Reporter
from optbuild.builder.status import Status
from optbuild.common.errors import OptbuildError
from optbuild.common.fingerprint import Fingerprint
from optbuild.store.remote import RemoteStore, key_id

if TYPE_CHECKING:
    from optbuild.project.recipe import Project

_FROM = {"built": "built here", "cached": "local cache", "restored": "remote cache"}


@dataclass(frozen=True)
class DeployOutput:
    """A deploy step's output folder in the build folder, with the provenance its models record
    (which keys, built where and when, from which cache)."""

    step: str
    folder: Path
    provenance: dict[str, Any]


@dataclass(frozen=True)
class DeploySelection:
    """The deploy steps selected and how their build went: ``outputs`` when every one is in
    place; else ``missing`` (the steps missing themselves, upstream first) and ``waiting`` (the
    steps that only wait on those)."""

    wanted: list[str]
    fetch_only: bool
    outputs: list[DeployOutput]
    missing: list[tuple[str, Outcome]]
    waiting: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.waiting)


def deploy_models(project: Project, sids: list[str]) -> list[tuple[str, str]]:
    """(step, model name) for the deploy steps among ``sids``: its model_name, else its recipe's."""
    steps = project.steps
    return [(sid, getattr(steps[sid].step.params, "model_name", None) or steps[sid].recipe)
            for sid in sids if steps[sid].kind == "deploy"]


def shared_model_names(published: list[tuple[str, str]]) -> list[str]:
    """For each model name that two or more (step, model) pairs publish, a line naming them
    (``optbuild plan`` says it before anything builds; ``optbuild deploy`` refuses it)."""
    by_model: dict[str, list[str]] = {}
    for sid, model in published:
        if sid not in by_model.setdefault(model, []):
            by_model[model].append(sid)
    return [f"deploy steps {', '.join(sids)} all publish model {model!r} into one repository: give each "
            "its own model_name" for model, sids in sorted(by_model.items()) if len(sids) > 1]


def plan_warnings(project: Project, sids: list[str], recorded: Sequence[tuple[str, str]] = ()) -> list[str]:
    """What a plan of ``sids`` warns of before its answer: deploy steps that publish one
    model name, which `optbuild deploy` would refuse, said before anything builds (a no-op
    build records them for plan's fast path, ``cli.noop``). ``recorded``: the (step, model
    name) of deploy steps a build replayed rather than loaded (``common.noopreach``)."""
    published = [*recorded, *deploy_models(project, sids)]
    return [f"warning: {line}: optbuild deploy refuses them" for line in shared_model_names(published)]


def one_step_per_model(published: list[tuple[str, str]]) -> None:
    """OptbuildError when two deploy steps publish one model name into the repository."""
    if clashes := shared_model_names(published):
        raise OptbuildError("\n".join(clashes))


def select_deploys(ws: api.Workspace, targets: list[str] | None = None, *, fetch_only: bool = False,
                   host: Fingerprint | None = None, reporter: Reporter | None = None) -> DeploySelection:
    """Build (with ``fetch_only``, only restore; for ``host``, a recorded fingerprint, with
    its keys) the deploy steps among ``targets`` and their ancestors. Refused before anything
    builds when there is none, or when two publish one model name."""
    steps = ws.project.steps
    targets = targets or []
    wanted = [sid for sid in ws.graph.select(targets) if steps[sid].kind == "deploy"]
    if not wanted:
        raise OptbuildError(f"no deploy step in {' '.join(targets) or 'the project'}: add one "
                            "([steps.NAME] kind = \"deploy\", input = \"...\")")
    one_step_per_model(deploy_models(ws.project, wanted))  # before anything builds
    fetch_only = fetch_only or host is not None  # what is built here is this host's
    result = api.build(ws, wanted, reporter=reporter, host=host, fetch_only=fetch_only)
    if any(not result.outcomes[sid].status.ok for sid in wanted):
        missing, waiting = _missing(result.outcomes)
        return DeploySelection(wanted, fetch_only, [], missing, waiting)
    outputs = []
    for sid in wanted:
        spec = steps[sid]
        provenance = {"step": sid, **_used(result.outcomes[sid], ws.remote),
                      "inputs": {field: {"step": dep, **_used(result.outcomes[dep], ws.remote)}
                                 for field, dep in spec.deps.items()}}
        outputs.append(DeployOutput(sid, ws.project.step_dir(sid), provenance))
    return DeploySelection(wanted, fetch_only, outputs, [], [])


def _missing(outcomes: dict[str, Outcome]) -> tuple[list[tuple[str, Outcome]], list[str]]:
    """The steps not in place: those missing themselves, and those only waiting on them."""
    missing, waiting = [], []
    for sid, outcome in outcomes.items():
        if outcome.status.ok:
            continue
        if outcome.status == Status.WOULD_BUILD and outcome.key is None:  # its upstream is missing
            waiting.append(sid)
        else:
            missing.append((sid, outcome))
    return missing, waiting


def _used(outcome: Outcome, remote: RemoteStore | None) -> dict[str, Any]:
    """Which action a step's output is, where and when it was built, and where it came from.

    Remote entries do not say who pushed them: an optbuild pushes what it built, so built_on
    names the pusher; with a signing key, ``signed_with`` names the key that vouched for it
    (the entry was accepted only under a valid signature of that key)."""
    entry = outcome.entry
    used = {"key": outcome.key, "built_on": entry.built_on if entry else None,
            "built_at": entry.created_at if entry else None, "from": _FROM.get(str(outcome.status))}
    if outcome.source == "remote" and remote is not None:
        used["remote"] = remote.display_url
        used["signed_with"] = key_id(remote.signing_key) if remote.signing_key else None
    if entry is not None and "chosen" in entry.metrics:  # a select step: which candidate won
        used["chosen"] = entry.metrics["chosen"]
    return used
