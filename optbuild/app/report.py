"""What a build chose, per select step, gathered from what the build wrote: the page of
``optbuild report`` (optbuild.app.report_html draws it), for a Python user too.

Teams compare variants by looking: each select step with the variants it raced (their verify
figures, the latencies measured together, the winner's lead and its interval), the choice and
why (the tie and its rule), the keys of the artifacts (optbuild.lock) and what the deploy steps
after it hold, and, given a model repository, what ``optbuild deploy`` published there. Nothing
is built or measured: a step the build folder does not hold is reported as not built.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild import api
from optbuild.app.deploy import deploy_models
from optbuild.builder import lockfile
from optbuild.common.errors import OptbuildError
from optbuild.common.jsonfile import MAX_BYTES, read_json
from optbuild.model.thresholds import worst

# What a published version's config.pbtxt pins (optbuild.app.publish writes it): the served one.
_PIN = re.compile(r"(?:\A|\n)version_policy \{ specific \{ versions: ([1-9][0-9]{0,17}) \} \}\n\Z")
_VERSION = re.compile(r"[1-9][0-9]{0,17}")
_MAX_RECORD = 16 << 20  # a published version's optbuild.json, as publish reads it
_LATENCIES = ("p10_ms", "p50_ms", "p90_ms")


@dataclass(frozen=True)
class Artifact:
    """A step whose output the page names, with its key in optbuild.lock (None: no record)."""

    step: str
    key: str | None


@dataclass(frozen=True)
class Verify:
    """A variant's verify step: its verdict and worst figures over the outputs and the parts
    its thresholds are checked on (optbuild.model.thresholds.worst), as its report.json records."""

    step: str
    key: str | None = None
    passed: bool | None = None
    cosine: float | None = None
    cosine_at: str | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    top1: float | None = None
    built: bool = True  # False: the build folder holds no report of it
    problem: str | None = None  # why its report could not be read


@dataclass(frozen=True)
class Lead:
    """How much faster the winner measured than a variant, and the interval of that lead."""

    ratio: float
    low: float
    high: float


@dataclass(frozen=True)
class Variant:
    """One candidate of a select step: ``figures`` are those judged (measured together, or the
    benchmark's own with measure = "cached"), ``together`` the p10 / p50 / p90 measured together."""

    benchmark: Artifact
    model: Artifact | None  # the benchmark's input: the artifact the variant is
    verify: Verify | None
    runtime: str | None = None
    figures: dict[str, float] | None = None
    benchmarked: dict[str, float] | None = None  # as the benchmark step measured it, alone
    together: dict[str, float] | None = None
    lead: Lead | None = None
    chosen: bool = False
    tied: bool = False
    rejected: list[str] = field(default_factory=list)
    why: str | None = None


@dataclass(frozen=True)
class Race:
    """How the variants were measured together, from selection.json's ``race``."""

    runs: int
    rounds: int
    rounds_run: int
    warmup: int
    seconds: float
    min_lead: float
    interval: float
    max_seconds: float
    load: dict[str, Any]
    undecided: list[str]
    notes: list[str]


@dataclass(frozen=True)
class Published:
    """One version of a model in a model repository (its optbuild.json, written by deploy)."""

    version: int
    served: bool
    record: dict[str, Any]


@dataclass(frozen=True)
class Deployment:
    """A deploy step after a select step: the model folder the build holds and, given the
    repository (``--deployed``), the versions published there."""

    step: Artifact
    model: str
    built: list[str]  # the versions in the build folder (build/<recipe>/<step>/<model>/<n>)
    repository: Path | None = None
    published: list[Published] = field(default_factory=list)
    note: str | None = None  # nothing published there, or unreadable

    @property
    def served(self) -> Published | None:
        return next((p for p in self.published if p.served), None)


@dataclass(frozen=True)
class Selection:
    """A select step as the build left it; ``note`` says why there is nothing to show (not
    built, an unreadable selection.json), the variants then being only the recipe's."""

    step: Artifact
    variants: list[Variant]
    deployments: list[Deployment]
    note: str | None = None
    objective: str | None = None
    measure: str | None = None
    constraints: dict[str, Any] = field(default_factory=dict)
    race: Race | None = None
    chosen: str | None = None
    tie_with: list[str] = field(default_factory=list)
    tie_broken_by: str | None = None

    @property
    def built(self) -> bool:
        return self.note is None


@dataclass(frozen=True)
class Report:
    """The page's content: per select step selected, what the build chose."""

    project: Path
    generated_at: float
    selections: list[Selection]
    deployed: Path | None = None

    @property
    def not_built(self) -> list[Selection]:
        return [s for s in self.selections if not s.built]


def gather(ws: api.Workspace, targets: list[str] | None = None, *, deployed: Path | None = None) -> Report:
    """The select steps among ``targets`` and their ancestors (all of the project's without),
    as the build folder, optbuild.lock and (``deployed``) a model repository hold them.
    OptbuildError when none is selected."""
    targets = targets or []
    steps = ws.project.steps
    selects = [sid for sid in ws.graph.select(targets) if steps[sid].kind == "select"]
    if not selects:
        raise OptbuildError(f"no select step in {' '.join(targets) or 'the project'}: the report shows what "
                            "select steps chose among their candidates ([steps.NAME] kind = \"select\")")
    if deployed is not None and not deployed.is_dir():
        raise OptbuildError(f"--deployed {deployed}: no such folder; name the model repository that "
                            "`optbuild deploy --to` published into")
    locked = lockfile.read(ws.project.lock_file)
    return Report(ws.project.root, time.time(),
                  [_selection(ws, sid, locked, deployed) for sid in selects], deployed)


def _artifact(sid: str, locked: dict[str, dict[str, Any]]) -> Artifact:
    key = (locked.get(sid) or {}).get("key")
    return Artifact(sid, key if isinstance(key, str) else None)


def _read(path: Path, max_bytes: int = MAX_BYTES) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON object the build wrote; (None, None) where it is missing (not built), (None,
    why) where it is unreadable or not an object."""
    try:
        data = read_json(path, max_bytes)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc})"
    return (data, None) if isinstance(data, dict) else (None, f"{path} is not a JSON object")


def _selection(ws: api.Workspace, sid: str, locked: dict[str, dict[str, Any]], deployed: Path | None) -> Selection:
    spec = ws.project.steps[sid]
    candidates = [dep for name, dep in spec.deps.items() if name.startswith("candidates.")]
    deployments = [_deployment(ws, step, model, locked, deployed)
                   for step, model in deploy_models(ws.project, sorted(ws.graph.descendants(sid)))]
    path = ws.project.step_dir(sid) / "selection.json"
    report, problem = _read(path)
    if report is not None and not isinstance(report.get("candidates"), list):
        report, problem = None, f"{path} lists no candidates"
    if report is None:
        return Selection(_artifact(sid, locked), [_variant(ws, c, locked, None) for c in candidates], deployments,
                         note=problem or f"not built: {path} is missing")
    tie = report.get("tie") or {}
    rows = [row for row in report["candidates"] if isinstance(row, dict)]
    variants = [_variant(ws, row.get("step"), locked, row, chosen=report.get("chosen"),
                         tied=tie.get("with") or []) for row in rows]
    race = report.get("race")
    return Selection(_artifact(sid, locked), variants, deployments, objective=report.get("objective"),
                     measure=report.get("measure"), constraints=report.get("constraints") or {},
                     race=_race(race) if isinstance(race, dict) else None, chosen=report.get("chosen"),
                     tie_with=list(tie.get("with") or []), tie_broken_by=tie.get("broken_by"))


def _variant(ws: api.Workspace, sid: Any, locked: dict[str, dict[str, Any]], row: dict[str, Any] | None, *,
             chosen: str | None = None, tied: list[str] | None = None) -> Variant:
    """A candidate from its row of selection.json (None: the select step is not built), its
    benchmark's input and verify step found in the project by the step's name."""
    sid = str(sid)
    spec = ws.project.steps.get(sid)  # a row names a step of the build, which may be renamed since
    model = _artifact(spec.deps["input"], locked) if spec and "input" in spec.deps else None
    check = spec.deps.get("check") if spec else None
    verify = _verify(ws, check, locked) if check else None
    if row is None:
        return Variant(_artifact(sid, locked), model, verify)
    lead = _numbers(row.get("winner_lead"), ("ratio", "low", "high"))
    return Variant(_artifact(sid, locked), model, verify, runtime=row.get("runtime"),
                   figures=_numbers(row.get("figures")), benchmarked=_numbers(row.get("benchmark")),
                   together=_numbers(row.get("together"), _LATENCIES),
                   lead=Lead(lead["ratio"], lead["low"], lead["high"]) if lead else None,
                   chosen=sid == chosen, tied=sid in (tied or []), rejected=[str(r) for r in row.get("rejected") or []],
                   why=row.get("why"))


def _numbers(figures: Any, names: tuple[str, ...] | None = None) -> dict[str, float] | None:
    """The numeric figures of a table (those of ``names`` only); None where there are none."""
    if not isinstance(figures, dict):
        return None
    found = {k: float(v) for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
             and (names is None or k in names)}
    return found if found and (names is None or all(n in found for n in names)) else None


def _verify(ws: api.Workspace, sid: str, locked: dict[str, dict[str, Any]]) -> Verify:
    """The worst figures of a verify step's report.json (max_rel too, which a benchmark's
    summary of it leaves out)."""
    key = _artifact(sid, locked).key
    report, problem = _read(ws.project.step_dir(sid) / "report.json")
    if report is None and problem is None:
        return Verify(sid, key, built=False)
    outputs = (report or {}).get("outputs")
    if report is None or not isinstance(outputs, dict) or not all(isinstance(f, dict) for f in outputs.values()):
        return Verify(sid, key, problem=problem or "its report.json holds no figures per output")
    found = {metric: worst(outputs, metric) for metric in ("cosine", "max_abs", "max_rel", "top1")}
    value = {metric: None if w is None else w[0] for metric, w in found.items()}
    return Verify(sid, key, passed=bool(report.get("passed")), cosine=value["cosine"],
                  cosine_at=None if found["cosine"] is None else found["cosine"][1],
                  max_abs=value["max_abs"], max_rel=value["max_rel"], top1=value["top1"])


def _race(race: dict[str, Any]) -> Race:
    return Race(runs=race.get("runs", 0), rounds=race.get("rounds", 0), rounds_run=race.get("rounds_run", 0),
                warmup=race.get("warmup", 0), seconds=race.get("seconds", 0.0), min_lead=race.get("min_lead", 0.0),
                interval=race.get("interval", 0.0), max_seconds=race.get("max_seconds", 0.0),
                load=race.get("load") or {}, undecided=list(race.get("undecided") or []),
                notes=[str(n) for n in race.get("notes") or []])


def _deployment(ws: api.Workspace, sid: str, model: str, locked: dict[str, dict[str, Any]],
                deployed: Path | None) -> Deployment:
    """A deploy step's model: its versions in the build folder, and in ``deployed``."""
    folder = ws.project.step_dir(sid) / model
    built = sorted((p.name for p in folder.iterdir() if p.is_dir() and _VERSION.fullmatch(p.name)), key=int) \
        if folder.is_dir() else []
    if deployed is None:
        return Deployment(_artifact(sid, locked), model, built)
    published, note = _published(deployed / model)
    return Deployment(_artifact(sid, locked), model, built, deployed, published, note)


def _published(model_dir: Path) -> tuple[list[Published], str | None]:
    """The versions of a model folder in a repository, newest first, the served one marked
    (the version its config.pbtxt pins); or why there are none."""
    if not model_dir.is_dir():
        return [], f"{model_dir} does not exist: nothing of this model was published there"
    try:
        pinned = _PIN.search((model_dir / "config.pbtxt").read_text())
    except (OSError, ValueError):
        pinned = None
    served = int(pinned.group(1)) if pinned else None
    found = []
    for version in sorted((p for p in model_dir.iterdir() if _VERSION.fullmatch(p.name) and p.is_dir()
                           and not p.is_symlink()), key=lambda p: -int(p.name)):
        record, _ = _read(version / "optbuild.json", _MAX_RECORD)
        found.append(Published(int(version.name), int(version.name) == served, record or {}))
    return found, None if found else f"{model_dir} holds no version"
