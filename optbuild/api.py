"""The Python API behind the CLI: load a project, plan, build, explain, clean.

Everything the CLI does is reachable from here, so tests (and other tools) drive
optbuild in-process with the same code paths.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Collection
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.builder.outcome import Options, Outcome, Replay
from optbuild.builder.report import Reporter, make_reporter, write_line
from optbuild.builder.runstats import describe_stats
from optbuild.builder.scheduler import Scheduler
from optbuild.builder.site import BuildContext, Builder
from optbuild.builder.status import Status
from optbuild.common.digest import FileHasher
from optbuild.common.errors import OptbuildError, full_disk_named
from optbuild.common.events import DoneEvent
from optbuild.common.fingerprint import Fingerprint
from optbuild.common.paths import folder_problem
from optbuild.common.toolchain import Toolchain
from optbuild.common.units import parse_size
from optbuild.process.pool import ProcessPool, ServedPool
from optbuild.project.config import check_scheduler
from optbuild.project.graph import StepGraph
from optbuild.project.recipe import Project, load_project
from optbuild.steps.base import ONNX_TOOLS
from optbuild.store import written
from optbuild.store.local import LocalStore
from optbuild.store.marker import BUILD_STATE, MADE_INSIDE, MARKER, Kind, ownership, take_build_folder
from optbuild.store.remote import RemoteSession, RemoteStore, open_remote

MEMO_FROM = 20  # a run deciding 1/20 of the steps or more reads the decision memo (its size is all steps')


@dataclass
class Workspace:
    """A loaded, validated project with its graph and local cache."""

    project: Project
    graph: StepGraph
    store: LocalStore
    hasher: FileHasher
    remote: RemoteStore | None = None  # nothing is imported or contacted until a local miss

    def close(self) -> None:
        self.hasher.close()


def open_workspace(start: Path | None = None, *, remote: str | bool | None = None,
                   overrides: list[str] | None = None, recipes: Collection[str] | None = None) -> Workspace:
    """``remote``: a URL overrides ``[remote] url`` and $OPTBUILD_REMOTE; False turns it off.
    ``overrides``: parameters set for this run (``-S``, see optbuild.project.overrides).
    ``recipes``: only these recipes' steps are loaded (``load_project``; a build then takes
    the others' as ``Replay`` says)."""
    project = load_project(start, overrides, recipes)
    graph = StepGraph(project.steps)
    hasher = FileHasher(project.cache_dir / "statcache.sqlite")
    section = project.config.remote
    remote_store = open_remote(
        section.url, remote, project_root=project.root, read=section.read, write=section.write,
        timeout_s=section.timeout_s, max_errors=section.max_errors, inline_max=parse_size(str(section.inline_max)),
        signing_key_env=section.signing_key_env or None, endpoint_url=section.endpoint_url or None,
        options=dict(section.options))
    return Workspace(project, graph, LocalStore(project.cache_dir, hasher), hasher, remote_store)


@dataclass
class BuildResult:
    outcomes: dict[str, Outcome]
    reporter: Reporter
    done: DoneEvent  # the run's summary: ok, counts, duration
    # per blob digest, how often it crossed the network (``Crossings.per_blob``; {} without a remote)
    transfers: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.done["ok"]

    def steps(self, status: Status | str) -> list[str]:
        return [sid for sid, o in self.outcomes.items() if o.status == status]


def build(
    ws: Workspace,
    targets: list[str] | None = None,
    *,
    reporter: Reporter | None = None,
    jobs: int | None = None,
    keep_going: bool | None = None,
    dry_run: bool = False,
    skip_unavailable: bool | None = None,
    toolchain: Toolchain | None = None,
    host: Fingerprint | None = None,
    fetch_only: bool = False,
    retry_failed: bool = False,
    pool: ProcessPool | None = None,
    executor: str | None = None,
    scheduler: str | None = None,
    download: str | None = None,
    replay: Replay | None = None,
) -> BuildResult:
    """Build (or with ``dry_run``, plan) ``targets`` and their ancestors.

    With ``fetch_only`` nothing builds: what the local or remote cache holds is restored,
    and every step that would have to build is a ``Status.WOULD_BUILD`` outcome (the result is not ok).
    A step whose failure with the same key is remembered fails again at once, unless
    ``retry_failed``.
    ``jobs``, ``keep_going`` and ``skip_unavailable`` left at None take optbuild.toml's [build].
    ``pool``: a pool already started for this project (``ProcessPool.speculative``); the
    build closes it. ``executor`` ("local", "dask", "auto") and ``scheduler`` (a Dask
    scheduler's address, which alone means "dask") override [build]'s, as ``download`` does
    ("targets" or "all": which outputs of steps built on Dask nodes come to this host; see
    ``StepGraph.wanted``).
    ``replay``: the build of a project loaded in part (``open_workspace``'s ``recipes``):
    its steps are ``replay.decided``, and the steps left out are reported as recorded
    (``targets`` then only name the run the record was made for).
    """
    config = ws.project.config.build
    options = Options(
        jobs=jobs or config.jobs,  # 0: the backend's (a CPU each here, a farm's slots on Dask)
        keep_going=config.keep_going if keep_going is None else keep_going,
        dry_run=dry_run,
        skip_unavailable=config.skip_unavailable if skip_unavailable is None else skip_unavailable,
        fetch_only=fetch_only,
        retry_failed=retry_failed,
        preload=config.preload,
        executor=executor or ("dask" if scheduler else config.executor),
        dask_scheduler=scheduler or config.scheduler,
        download=download or config.download,
    )
    if options.download not in ("targets", "all"):
        raise OptbuildError(f"download must be 'targets' or 'all', not {options.download!r}")
    reporter = reporter or Reporter()
    selected = replay.decided if replay is not None else ws.graph.select(targets or [])
    if not dry_run:  # never a user's folder: a build replaces step folders whole
        try:
            with suppress(OSError):  # the steps that write there report it, each in its own words
                take_build_folder(ws.project.build_dir, ws.project.recipes)
        except OptbuildError:  # refused: nothing ran, but what was handed over ends here
            reporter.close()
            if pool is not None:
                pool.close()
            raise
    remote = RemoteSession(ws.remote, reporter, dry_run=dry_run) if ws.remote is not None else None
    runner = Scheduler(ws.project, ws.graph, ws.store, ws.hasher, reporter, toolchain=toolchain, host=host,
                       options=options, remote=remote, pool=pool, builder=_builder(options),
                       memo=replay is None or len(selected) * MEMO_FROM >= len(selected) + len(replay.steps))
    try:
        with full_disk_named(ws.project.build_dir):  # materializing into the build folder, say
            outcomes = runner.run(selected, None if replay is not None else ws.graph.wanted(targets or [], selected),
                                  replay)
    finally:
        reporter.close()
    assert runner.done is not None  # a run that returns has ended with its summary
    return BuildResult(outcomes, reporter, runner.done, remote.crossings.per_blob() if remote is not None else {})


def _builder(options: Options) -> Callable[[BuildContext], Builder] | None:
    """The Dask builder where the options name it ("auto" only with a scheduler), else None
    (this host); optbuild.distributed is imported only then."""
    if options.executor == "dask" or (options.executor == "auto" and options.dask_scheduler):
        from optbuild.distributed.builder import DaskBuilder

        return DaskBuilder
    return None


def explain(ws: Workspace, target: str, *, toolchain: Toolchain | None = None,
            host: Fingerprint | None = None) -> dict[str, Any]:
    """The key of ``target`` with its ingredients, and where its cached result came from."""
    sid = ws.graph.step(target)
    selected = ws.graph.select([sid])
    scheduler = Scheduler(ws.project, ws.graph, ws.store, ws.hasher, Reporter(), toolchain=toolchain,
                          host=host, options=Options(jobs=1, dry_run=True))
    outcome = scheduler.run(selected)[sid]
    info: dict[str, Any] = {"step": sid, "status": outcome.status, "key": outcome.key,
                            "reasons": outcome.reasons}
    if outcome.status == Status.SKIPPED and (cause := _cause(scheduler.outcomes, ws.graph, sid)) is not None:
        info["cause"] = cause
    entry = outcome.entry or (ws.store.read_only_view().get_action(outcome.key) if outcome.key else None)
    if entry is not None:
        info["ingredients"] = entry.ingredients
        info["provenance"] = {
            "built_on": entry.built_on, "created_at": entry.created_at,
            "duration_s": entry.duration_s, "metrics": entry.metrics,
            "outputs": {n: o.model_dump() for n, o in entry.outputs.items()},
        }
        if entry.log:
            try:
                info["log"] = ws.store.read_blob(entry.log).decode(errors="replace")
            except OSError:
                pass
    return info


def _cause(outcomes: dict[str, Outcome], graph: StepGraph, sid: str) -> dict[str, Any] | None:
    """The upstream step that kept ``sid`` from building, followed through the skipped ones
    between: one that failed or cannot run here, with its status and full error (the build
    output gives only its name beside a skipped step). None when nothing upstream did."""
    while bad := [d for d in graph.deps[sid] if d in outcomes and not outcomes[d].status.usable]:
        sid = next((d for d in bad if outcomes[d].status != Status.SKIPPED), bad[0])
        if outcomes[sid].status != Status.SKIPPED:
            return {"step": sid, "status": outcomes[sid].status, "error": outcomes[sid].error}
    return None


def _check_removable(project: Project, folder: Path, what: str) -> None:
    """Checked again right before deleting (loading checked the settings): a symlink made
    since must not turn ``clean`` into deleting the project."""
    protected = [project.config_file, *project.recipes.values()]
    if (why := folder_problem(folder, project.root, protected)) is not None:
        raise OptbuildError(f"refusing to delete the {what} {folder}: it {why}")


@dataclass
class Cleaned:
    """What ``clean`` deleted, and what it left and why (it deletes only what optbuild wrote)."""

    removed: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    refused: bool = False  # a whole folder was left: nothing says optbuild made it


def clean(project: Project, *, cache: bool = False) -> Cleaned:
    """Remove build outputs (and with ``cache``, the local cache's contents): in folders that
    optbuild made (``store.marker``), only what optbuild wrote there.

    In the build folder that is the files ``store.written`` recorded, while they hold what
    optbuild wrote, and optbuild's own state; never a name read from optbuild.lock or the
    recipes. It takes a project, not a workspace: opening one would make the cache folder
    (and its layout) wherever ``[cache] dir`` points, which would then pass for optbuild's.
    """
    cleaned = Cleaned()
    build_dir = _owned(project, project.build_dir, "build", cleaned)
    if build_dir is not None:
        _clean_build(build_dir, cleaned)
    if cache and (cache_dir := _owned(project, project.cache_dir, "cache", cleaned)) is not None:
        _clean_cache(cache_dir, cleaned)
    return cleaned


def _owned(project: Project, folder: Path, kind: Kind, cleaned: Cleaned) -> Path | None:
    """``folder`` as people write it (no "proj/../victim") when it is there and optbuild's;
    None, saying why when it is not optbuild's."""
    folder = Path(os.path.normpath(folder))
    if not folder.is_dir() or not any(folder.iterdir()):  # nothing to delete (a clean killed before rmdir)
        return None
    _check_removable(project, folder, f"{kind} folder")
    if ownership(folder, kind) is None:
        why = (f"not deleted: nothing says optbuild made it (no {MARKER} in it); "
               "delete it yourself if you mean to")
        cleaned.skipped.append((folder, why))
        cleaned.refused = True
        return None
    return folder


def _clean_build(folder: Path, cleaned: Cleaned) -> None:
    """Delete the recorded outputs and logs, then optbuild's state; the folder goes too once
    nothing else is left in it. What stays is reported: the changed files, and what was
    left beside what optbuild wrote."""
    deleted = written.delete_all(folder)
    for name in sorted(BUILD_STATE):
        if (path := folder / name).exists() or path.is_symlink():
            _delete(path)
            deleted.removed.append(path)
    cleaned.skipped.extend(deleted.kept)
    kept = {path for path, _ in deleted.kept}
    for place in sorted({folder, *deleted.touched}):
        if place.is_dir() and (place == folder or not place.is_symlink()):
            for child in sorted(place.iterdir()):
                if child not in kept and child not in deleted.touched and child != folder / MARKER:
                    cleaned.skipped.append((child, "kept: optbuild has no record of writing it"))
    if not any(p.name != MARKER for p in folder.iterdir()):
        (folder / MARKER).unlink(missing_ok=True)
        if not folder.is_symlink():  # a link's target is not ours to remove
            folder.rmdir()
            deleted.removed.append(folder)
    gone = set(deleted.removed)
    cleaned.removed.extend(p for p in deleted.removed if p.parent not in gone)


def _clean_cache(folder: Path, cleaned: Cleaned) -> None:
    """Delete what optbuild makes in a cache (``MADE_INSIDE``); the folder stays (it may be
    part of a repository)."""
    for child in sorted(folder.iterdir()):
        if child.name == MARKER:
            continue
        if child.name not in MADE_INSIDE["cache"]:
            cleaned.skipped.append((child, "kept: optbuild did not make it"))
            continue
        _delete(child)
        cleaned.removed.append(child)


def _delete(path: Path) -> None:
    """Delete a file or a tree; a symbolic link goes, not what it leads to."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


# The API's surface: what a Python user calls, and the types and helpers its functions take and
# give (a build reports to a Reporter, make_reporter makes the CLI's; outcomes carry a Status), which
# the CLI imports from here too.
__all__ = ["ONNX_TOOLS", "BuildResult", "Cleaned", "OptbuildError", "ProcessPool", "Replay", "Reporter", "ServedPool",
           "Status",
           "Workspace", "build", "check_scheduler", "clean", "describe_stats", "explain", "load_project",
           "make_reporter", "open_workspace", "write_line"]
