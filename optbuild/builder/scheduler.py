"""Runs the selected steps: key, cache lookup, build (by a builder), store, restore.

Steps run in dependency order, independent ones in parallel (threads that each wait on the
builder: ``builder.local`` on this host, a step process per step, see ``process.runstep``;
or a Dask cluster). A step's key needs its upstream outputs, so keys are computed as the
graph unfolds. Concurrent builders of one key (threads or other processes) build it once:
the key's lock is held from the second lookup until the entry is stored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from optbuild.builder import lockfile, upstream
from optbuild.builder.keys import Keyer, describe_changes
from optbuild.builder.local import LocalBuilder
from optbuild.builder.memo import DecisionMemo
from optbuild.builder.outcome import Options, Outcome, Replay
from optbuild.builder.provenance import Provenance, failure_message
from optbuild.builder.remotehit import RemoteHits
from optbuild.builder.report import Reporter
from optbuild.builder.restore import Restorer
from optbuild.builder.runstats import append_stats, run_stats
from optbuild.builder.site import BuildContext, Builder, BuilderUnavailable, BuildRequest, Placement
from optbuild.builder.status import Status
from optbuild.builder.walk import Build, Decision, Fetch, Walk
from optbuild.common.digest import FileHasher
from optbuild.common.errors import OptbuildError, StepError
from optbuild.common.events import CacheEvent, DoneEvent, Event, StartEvent, StepEvent, note, warning
from optbuild.common.fingerprint import Fingerprint
from optbuild.common.toolchain import Toolchain
from optbuild.process.action import Action
from optbuild.process.pool import ProcessPool
from optbuild.process.runstep import Cancelled, StepFailed, StepRun
from optbuild.process.spec import ArtifactSpec
from optbuild.project.graph import StepGraph
from optbuild.project.recipe import Project, StepSpec
from optbuild.store.entry import ActionEntry
from optbuild.store.failures import FailureStore
from optbuild.store.local import LocalStore
from optbuild.store.materialize import BlobGone
from optbuild.store.remote import RemoteSession


class Scheduler:
    def __init__(
        self,
        project: Project,
        graph: StepGraph,
        store: LocalStore,
        hasher: FileHasher,
        reporter: Reporter,
        *,
        toolchain: Toolchain | None = None,
        host: Fingerprint | None = None,
        options: Options | None = None,
        remote: RemoteSession | None = None,
        pool: ProcessPool | None = None,
        builder: Callable[[BuildContext], Builder] | None = None,
        memo: bool = True,
    ):
        """``builder``: where steps build, made from the build's context (default: this host,
        LocalBuilder). ``memo``: False where the run decides a few steps of many (the memo is
        then neither read nor written, ``DecisionMemo``'s ``used``)."""
        self.project = project
        self.graph = graph
        self.hasher = hasher
        self.reporter = reporter
        self.toolchain = toolchain or Toolchain()
        self.host = host or Fingerprint()
        self.options = options or Options()
        # a dry run changes nothing: corrupt items it meets are left for a real build to remove
        self.store = store.read_only_view() if self.options.dry_run else store
        self.failures = FailureStore(store.root, writable=self.store.writable)
        self.memo = DecisionMemo(project.build_dir, self.store, used=memo)
        self.restorer = Restorer(project, self.store, hasher, self.memo)
        self.provenance = Provenance(project, self.store, dry_run=self.options.dry_run)
        self.keyer = Keyer(hasher=hasher, toolchain=self.toolchain, salt=project.config.cache.salt,
                           project_root=project.root)
        self.outcomes: dict[str, Outcome] = {}
        self.replayed: dict[str, Outcome] = {}  # the steps of ``run``'s replay, as recorded
        self.done: DoneEvent | None = None  # the summary of the last run
        if pool is None or not pool.fits(project.root, preload=self.options.preload):
            if pool is not None:
                pool.close()
            pool = ProcessPool(project.root, preload=self.options.preload)
        self.pool = pool
        self.remote = remote
        self.hits = RemoteHits(remote, self.store, self.restorer, self.options, self._without_remote)
        self.context = BuildContext(project, self.store, self.host, reporter, pool, remote=remote,
                                    dry_run=self.options.dry_run, dask_scheduler=self.options.dask_scheduler)
        self._cancel = self.context.cancel
        if remote is not None:
            remote.cancel = self._cancel
        self.builder = (builder or LocalBuilder)(self.context)

    # --- scheduling ------------------------------------------------------------------
    def run(self, selected: list[str], wanted: Collection[str] | None = None,
            replay: Replay | None = None) -> dict[str, Outcome]:
        """Walk the graph of ``selected`` (``walk.Walk``), then record the run: the lock
        file, the memo, the statistics and the summary.
        ``wanted``: the steps whose outputs must come to this host (``StepGraph.wanted``;
        None: all); with ``Options.download`` "targets", a builder that builds elsewhere
        leaves the others' outputs on the remote cache, where its nodes read them.
        ``replay``: the steps left out, reported (first) and counted as recorded."""
        started = time.perf_counter()
        self.store.clean_stale_tmp()
        try:
            self._start_builder()
        except BaseException:
            self._end_run()  # the builder: whatever it got to
            raise
        self.hits.begin(len(selected), None if wanted is None else frozenset(wanted), self.builder.local)
        jobs = self.options.jobs or self.builder.slots()
        self.replayed = replay.outcomes() if replay is not None else {}
        self.reporter.emit(StartEvent(event="start", steps=[*self.replayed, *selected], jobs=jobs,
                                      dry_run=self.options.dry_run))
        for event in replay.events if replay is not None else ():
            self.reporter.emit(cast(Event, event))
        try:
            would_stop = self._walk(selected, max(1, jobs))
        finally:
            self._end_run()
        self._record_run(started, would_stop)
        return self.outcomes

    def _walk(self, selected: list[str], slots: int) -> str | None:
        """Walk the graph of ``selected``; then, if a step settled on its remote entry got other
        outputs (its download failed, and it built here), decide again the steps decided from
        that entry, with no step settling on an entry this time. The step a plan would stop at."""
        walk = Walk(self.project, self.graph, self.options, self.outcomes, self._decide, self._process, self._finish,
                    self.store.shared_gc_lock, self._abort, self._prewarm if self.builder.local else None,
                    self.remote.prefetch if self.remote is not None else None)
        walk.run(selected, slots)
        if not walk.diverged:
            return walk.would_stop
        again = set().union(*map(self.graph.descendants, walk.diverged)) & set(selected)
        for sid in sorted(walk.diverged):
            self.reporter.emit(warning(f"{sid}: the steps after it were decided from its remote entry, whose outputs "
                                       f"could not be downloaded; it {self.outcomes[sid].status} here with other "
                                       "outputs, so those steps are decided again", step=sid))
        for sid in again:
            self.outcomes.pop(sid, None)
        self.hits.settle_on_entries = False
        return self._walk([sid for sid in selected if sid in again], slots)

    def _record_run(self, started: float, would_stop: str | None) -> None:
        """The lock file, the memo, the statistics and the run's summary event."""
        self.provenance.clean_logs(self.outcomes)
        self.provenance.write_lock(self.outcomes, self.last_build, local=self.builder.local)
        if not self.options.dry_run:
            self.memo.save()
        every = {**self.replayed, **self.outcomes}
        counts: dict[str, int] = {}
        for outcome in every.values():
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        tolerated = {Status.UNAVAILABLE, Status.SKIPPED} if self.options.skip_unavailable else set()
        ok = all(o.status.usable or o.status in tolerated or o.parked for o in every.values())
        ok = ok and not (self.options.fetch_only and counts.get(Status.WOULD_BUILD))
        if self.remote is not None:
            self.remote.drain()
        stats = run_stats(every, self.remote)
        if self.remote is not None:
            self.reporter.emit(CacheEvent(event="cache", local=stats["local"], remote=stats["remote"]))
        if not self.options.dry_run:
            append_stats(self.store.root, {"command": "build", "ok": ok, "counts": counts, **stats})
        else:
            for text in upstream.plan_notes(self.outcomes, would_stop, self.last_build):
                self.reporter.emit(note(text))
        self.done = DoneEvent(event="done", ok=ok, counts=counts, duration_s=time.perf_counter() - started,
                              bytes_hashed=self.hasher.bytes_read)
        self.reporter.emit(self.done)

    def _end_run(self) -> None:
        """What a run ends with, however it ends: the stat cache written, the fork servers
        and the builder closed."""
        self.hasher.flush()
        self.pool.close()
        self.builder.close()

    def _start_builder(self) -> None:
        try:
            self.builder.start()
        except BuilderUnavailable as exc:
            if self.options.executor != "auto":
                raise
            self.reporter.emit(warning(f"{exc}; building on this host (--executor auto)"))
            self.builder.close()
            self.builder = LocalBuilder(self.context)

    def _finish(self, sid: str, outcome: Outcome) -> Outcome:
        self.outcomes[sid] = outcome
        event = StepEvent(event="step", step=sid, status=outcome.status, key=outcome.key, reasons=outcome.reasons)
        if outcome.error:
            event["error"] = outcome.error
        if outcome.source:
            event["source"] = outcome.source
        if outcome.remote_only:
            event["remote_only"] = True
        if outcome.entry is not None and outcome.status == Status.BUILT:
            event["duration_s"] = outcome.entry.duration_s
            if not self.builder.local:
                event["node"] = outcome.entry.built_on  # the Dask worker that built it
        self.reporter.emit(event)
        if outcome.entry is not None and outcome.status.ok and not self.options.dry_run and not outcome.remote_only:
            self.memo.remember(sid, outcome.entry, self.restorer.dest(self.project.steps[sid]))
        if outcome.entry is not None and outcome.status.ok:  # a step's warnings (StepContext.warn), cached too
            for message in outcome.entry.metrics.get("warnings") or []:
                self.reporter.emit(warning(f"{sid}: {message}", step=sid))
        return outcome

    def _abort(self) -> None:
        """The run ends early: nothing more starts, and the running steps are killed."""
        self._cancel.set()
        self.context.running.kill_all()

    def _prewarm(self, sid: str) -> None:
        """Start the fork servers of a step about to build and of the steps after it (which
        will likely build too): they import their tools while this one builds. From the
        main thread, which lives as long as the build (a server dies with the thread that
        started it: PR_SET_PDEATHSIG)."""
        for step in (sid, *self.graph.dependents[sid]):
            self.pool.prewarm(self.project.steps[step].step.preload)

    # --- one step ----------------------------------------------------------------------
    def _process(self, sid: str, action: Callable[[StepSpec], Decision]) -> Decision:
        """Run ``action`` for ``sid``, turning errors into a failed outcome.

        ``action`` returns an Outcome when the step is settled, else what downloads or
        builds it (to be run on the walk's threads).
        """
        spec = self.project.steps[sid]
        try:
            result = action(spec)
        except Cancelled:
            return self._finish(sid, Outcome(Status.SKIPPED, reasons=["cancelled"]))
        except OptbuildError as exc:
            return self._finish(sid, Outcome(Status.FAILED, error=str(exc)))
        return self._finish(sid, result) if isinstance(result, Outcome) else result

    def _decide(self, spec: StepSpec) -> Decision:
        """Key and cache lookup: an Outcome if settled now, else the download (a remote hit)
        or the build to run."""
        outputs: dict[str, dict[str, str]] = {}  # per input field: the digests of its upstream's outputs
        placement = self.builder.place(spec)  # the host its key is for: the one that will build it
        missing = upstream.missing(spec, self.outcomes)  # only a step that takes partial inputs gets here with some
        for field_name, dep in spec.deps.items():
            outcome = self.outcomes[dep]
            if field_name in missing:
                continue
            if outcome.entry is None:  # dry run: upstream will build, key unknown yet
                why = [f"upstream {dep} will build first"]
                if (lacking := placement.missing()) is not None:  # as the build will find
                    return Outcome(Status.UNAVAILABLE, reasons=why, error=f"{spec.id} cannot run here: {lacking}")
                return Outcome(Status.WOULD_BUILD, reasons=why)
            outputs[field_name] = {n: o.digest for n, o in outcome.entry.outputs.items()}
        try:
            action = self.keyer.action(spec, outputs, placement.host, missing)
        except FileNotFoundError as exc:
            raise StepError(f"input file disappeared: {exc.filename}") from None
        key = action.key
        dest = self.restorer.dest(spec)
        gone = None
        with self.store.shared_gc_lock():  # gc must not take the blobs between lookup and restore
            entry = self._lookup(spec, action)
            if entry is not None:
                try:
                    if not self.options.dry_run:  # a dry run writes nothing, build/ included
                        self.restorer.restore(spec, entry, dest)
                    return Outcome(Status.CACHED, key, entry)
                except BlobGone as exc:
                    gone = f"its cached result could not be restored ({exc})"
        reasons = self._reasons(spec, action)  # a miss only: the lock file is read when one asks
        if gone:
            reasons.append(gone)
        if self.store.last_miss_reason:
            reasons.append(self.store.last_miss_reason)
        if self.remote is not None and (self.hits.may_hold(key) or self.options.dry_run):  # on the fetch threads
            return Fetch(lambda spec: self.hits.fetch(spec, action, reasons, dest, placement), key)
        return self._without_remote(spec, action, reasons, dest, placement)

    def _without_remote(self, spec: StepSpec, action: Action, reasons: list[str], dest: Path,
                        placement: Placement) -> Outcome | Build:
        """A step no cache holds: its remembered failure, unavailable here, would build (a
        plan, --no-build), or the build to run."""
        key = action.key
        if not self.options.retry_failed and (failed := self.failures.get(key)):
            if not self.options.dry_run:  # the log of the failure it repeats, where the message says
                self.provenance.keep_failed_log(spec, failed.log.encode())
            return Outcome(Status.FAILED, key, reasons=["failed before with this key"], error=failed.describe())
        if (lacking := placement.missing()) is not None:
            return Outcome(Status.UNAVAILABLE, key, reasons=reasons, error=f"{spec.id} cannot run here: {lacking}")
        if self.options.dry_run or self.options.fetch_only:
            miss = self.remote.miss_reason(key) if self.remote is not None else None
            return Outcome(Status.WOULD_BUILD, key, reasons=[*reasons, miss] if miss else reasons)
        return lambda spec: self._build_locked(spec, action, reasons, dest, placement)

    def _build_locked(self, spec: StepSpec, action: Action, reasons: list[str], dest: Path,
                      placement: Placement) -> Outcome:
        """Build, under the key's lock, unless another builder stored it meanwhile. A local
        build is written through to the remote."""
        key = action.key
        stays = self.hits.stays_remote(spec.id)
        with self.store.shared_gc_lock(), self.store.lock(key):
            entry, status = self.store.get_action(key), Status.CACHED
            if entry is None:
                if (missing := placement.missing()) is not None:
                    return Outcome(Status.UNAVAILABLE, key, reasons=reasons, error=f"{spec.id} cannot run here: {missing}")
                if self.options.fetch_only:
                    why = self.remote.miss_reason(key) if self.remote is not None else None
                    return Outcome(Status.WOULD_BUILD, key, reasons=[*reasons, why or "its remote copy was unusable"])
                if not self.store.writable:
                    raise StepError(f"{spec.id} must build, but the cache {self.store.root} is read-only here: "
                                    "its result could not be stored there (make the cache writable, or set "
                                    "[cache] dir to a writable folder)")
                self.reporter.emit(StepEvent(event="step", step=spec.id, status=Status.RUNNING, key=key,
                                             reasons=reasons))
                entry = self._build(spec, action, placement, download=not stays)
                status = Status.BUILT
                if stays:
                    self.restorer.vacate(spec, dest)
                    return Outcome(status, key, entry, reasons=reasons, remote_only=True)
            self.restorer.restore(spec, entry, dest)
            if status == Status.BUILT and self.remote is not None and self.builder.local:  # a node pushes its own
                self.remote.push_later(entry, self.store, spec.id)  # blobs, then the entry
        return Outcome(status, key, entry, reasons=reasons)

    def _lookup(self, spec: StepSpec, action: Action) -> ActionEntry | None:
        """The local cache's entry of ``action``: as the last run remembered it when nothing
        it was read from changed (``memo``), else read and checked by the store."""
        if (entry := self.memo.entry(spec.id, action.key, spec.kind, action.material())) is not None:
            self.store.last_miss_reason = None
            return entry
        return self.store.get_action(action.key)

    @cached_property
    def last_build(self) -> dict[str, dict[str, Any]]:
        """optbuild.lock's records as the run found them (read at the first miss, or at the
        end: a run that settles every step from the caches reads it once, to write it)."""
        return lockfile.read(self.project.lock_file)

    def _reasons(self, spec: StepSpec, action: Action) -> list[str]:
        last = self.last_build.get(spec.id)
        if last is None:
            return ["never built"]
        if last.get("key") == action.key:
            return ["not in the cache"]
        return describe_changes(last.get("ingredients") or {}, action.material())

    def _entry(self, dep: str) -> ActionEntry:
        """The entry of ``dep``, a step done in this run."""
        entry = self.outcomes[dep].entry
        assert entry is not None
        return entry

    def _artifact(self, dep: str, read: dict[str, str]) -> ArtifactSpec:
        """The outputs of ``dep`` the step reads (``read``: those its action holds) as it sees them."""
        entry = self._entry(dep)
        directory = self.project.step_dir(dep)
        return ArtifactSpec(
            step=dep,
            dir=str(directory),
            files={name: str(directory / name) for name in entry.outputs if name in read},
            primary=str(directory / entry.primary) if entry.primary in read else None,
        )

    def _build(self, spec: StepSpec, action: Action, placement: Placement, *, download: bool = True) -> ActionEntry:
        """Have the builder build the step (its outputs brought here unless not ``download``);
        a failure is reported with its log (kept in build/.logs) and, when the same inputs
        would fail again, remembered by key."""
        if self._cancel.is_set():
            raise Cancelled
        present = {f: dep for f, dep in spec.deps.items() if f not in action.missing}
        run = StepRun(step_id=spec.id, implementation=spec.implementation, action=action,
                      base_dir=spec.step.base_dir, project_root=self.project.root,
                      inputs={f: self._artifact(dep, action.inputs[f]) for f, dep in present.items()},
                      primary=spec.step.primary_output, preload=spec.step.preload,
                      shares_process=spec.step.shares_process, state_dir=self.store.root / "state")
        upstream = {f: self._entry(dep) for f, dep in present.items()}
        remote_inputs = frozenset(f for f, dep in present.items() if self.outcomes[dep].remote_only)
        request = BuildRequest(spec, placement, run, upstream, self.keyer.named_key_files(spec),
                               guard=lambda: self._check_inputs_unchanged(spec, action), download=download,
                               remote_inputs=remote_inputs)
        key = action.key
        try:
            entry = self.builder.build(request)
        except StepFailed as failed:
            message = failure_message(failed.result, failed.log, self.provenance.keep_failed_log(spec, failed.log))
            if failed.result.repeats:
                with contextlib.suppress(OSError):  # not remembering it must not hide why it failed
                    self.failures.put(key, spec.id, message, failed.log)
            raise StepError(message) from None
        self.failures.drop(key)  # built at last (--retry-failed): forget the failure
        return entry

    def _check_inputs_unchanged(self, spec: StepSpec, action: Action) -> None:
        """Inputs edited during the build make its result a guess: do not cache it."""
        try:
            now = self.keyer.file_digests(spec)
        except FileNotFoundError as exc:
            now = {"(missing)": str(exc.filename)}
        if now != action.files:
            changed = sorted(n for n in set(now) | set(action.files) if now.get(n) != action.files.get(n))
            raise StepError(f"input {', '.join(changed)} changed while {spec.id} was building; "
                            "the result was not cached (run the build again)")
        for field_name, dep in spec.deps.items():  # hard links share the blob: a write there damages the cache
            if field_name in action.missing or self.outcomes[dep].remote_only:
                continue
            entry = self._entry(dep)
            folder = self.project.step_dir(dep)
            if changed := self.store.changed_outputs(entry, folder):
                raise StepError(f"its input {folder / changed[0]} (an output of {dep}) changed while {spec.id} "
                                "ran: the step wrote to it (steps must not write to their inputs), or another "
                                "build of this project replaced it. The result was not cached; a damaged "
                                "cached copy was removed (the next build restores it)")
