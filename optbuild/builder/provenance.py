"""What a run leaves beside the outputs: optbuild.lock's records of the steps that
succeeded, and the logs of the steps that failed (``build/.logs``, recorded as optbuild's),
which the failure's message points at."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from optbuild.builder import lockfile
from optbuild.builder.outcome import Outcome
from optbuild.common.atomic import write_atomic
from optbuild.common.digest import digest_bytes
from optbuild.common.errors import OptbuildError, describe_os_error, is_disk_full
from optbuild.common.paths import confined
from optbuild.process.spec import ChildResult
from optbuild.project.recipe import Project, StepSpec
from optbuild.store import written
from optbuild.store.local import LocalStore

LOG_TAIL_LINES = 25


class Provenance:
    """The lock file and the kept logs of one run (a dry run writes neither)."""

    def __init__(self, project: Project, store: LocalStore, *, dry_run: bool):
        self.project = project
        self.store = store
        self.dry_run = dry_run

    def write_lock(self, outcomes: dict[str, Outcome], last_build: dict[str, dict[str, Any]], *,
                   local: bool) -> None:
        """Record the steps that succeeded in optbuild.lock (``local``: built on this host,
        else each record names the node); nothing is written when nothing is new since the
        run began (``last_build``: the records read then)."""
        if self.dry_run:
            return
        records = {}
        for sid, outcome in outcomes.items():
            if outcome.entry is not None and outcome.status.ok:
                entry = outcome.entry
                records[sid] = {
                    "key": entry.key,
                    "kind": entry.kind,
                    "outputs": {n: o.digest for n, o in entry.outputs.items()},
                    "tools": entry.ingredients.get("tools", {}),
                    "host": entry.ingredients.get("host", {}),
                    "ingredients": entry.ingredients,
                    "metrics": lockfile.record_metrics(entry.metrics),  # bounded: for `optbuild diff`
                }
                if overrides := self.project.steps[sid].overrides:
                    records[sid]["overrides"] = overrides  # set by -S for this build
                if not local:
                    records[sid]["node"] = entry.built_on  # the node that built it (a Dask worker's name)
        if not records:
            return
        if self.project.lock_file.exists() and all(last_build.get(sid) == r for sid, r in records.items()):
            return  # nothing new since the run began: write nothing (the project may be read-only)
        # a read-only cache cannot hold the lock's file: builders sharing it lock in build/
        lock = (self.store.root / "locks" / "lockfile.lock" if self.store.writable
                else self.project.build_dir / ".lockfile.lock")
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            lockfile.update(self.project.lock_file, records, lock)
        except OSError as exc:
            raise OptbuildError(f"the steps are built and cached, but {self.project.lock_file} could not be "
                                f"updated: {describe_os_error(exc, self.project.lock_file.parent)}") from None

    def keep_failed_log(self, spec: StepSpec, log: bytes) -> str:
        """Copy a failed step's log to build/.logs/ (the scratch copy is removed); says where,
        or, when the disk is full or a file optbuild did not write is in its place, why not:
        that must not hide the step's own error. Written whole (never through a link)."""
        path = confined(self.project.build_dir / ".logs" / spec.recipe / f"{spec.name}.log",
                        self.project.build_dir, f"the log of {spec.id} to")
        name = _log_name(spec.recipe, spec.name)
        if os.path.lexists(path) and not written.is_intact(self.project.build_dir, name):
            return f"the full log was not kept: optbuild did not write the {path} that is there (move it away)"
        try:  # recorded first: a kill leaves no log unrecorded
            written.write(self.project.build_dir, name, {name: (digest_bytes(log), len(log))})
            write_atomic(path, log)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            return f"the full log could not be kept: {describe_os_error(exc, path.parent)}"
        return f"full log: {path}"

    def clean_logs(self, outcomes: dict[str, Outcome]) -> None:
        """Remove the kept logs of steps that succeeded in this run and of steps the project
        no longer has: a log left there would speak of a failure that is gone. Only logs
        optbuild recorded writing, still as written, are removed (``store.written``), and a
        step not run this time keeps its log, as does one of a recipe this run did not load.
        What cannot be removed is left."""
        if self.dry_run:
            return
        logs = confined(self.project.build_dir / ".logs", self.project.build_dir, "the step logs to")
        succeeded = {sid for sid, o in outcomes.items() if o.status.ok}
        try:
            if logs.is_symlink() or not logs.is_dir():
                return
            found = [(f.name, p.stem) for f in logs.iterdir() if f.is_dir() and not f.is_symlink()
                     for p in f.glob("*.log")]
        except OSError:
            return
        for recipe, name in found:
            sid = f"{recipe}:{name}"
            gone = sid not in self.project.steps and self.project.has_recipe_loaded(recipe)
            if sid in succeeded or gone:
                with contextlib.suppress(OSError):
                    written.delete(self.project.build_dir, _log_name(recipe, name), written.Deleted())


def failure_message(result: ChildResult, log: bytes, kept: str) -> str:
    """The step's own message; with the log's tail when the failure was unexpected, and
    ``kept``: where the full log is, or why it could not be kept."""
    message = result.error or "step failed"
    lines = log.decode(errors="replace").rstrip().splitlines()[-LOG_TAIL_LINES:]
    if lines and not result.expected:
        message += "\n--- log tail ---\n" + "\n".join(lines)
    return message + f"\n({kept})"


def _log_name(recipe: str, step: str) -> str:
    """Where a failed step's log is kept, under the build folder (and the name of its record)."""
    return f".logs/{recipe}/{step}.log"
