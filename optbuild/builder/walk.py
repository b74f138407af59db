"""The graph walk of one run: which steps are ready, held to build, building or downloading,
and when the run stops. It knows the graph, the options and the outcomes, not how a step is
decided, built or restored: the scheduler hands it those as functions.

Each step is decided in the main thread as soon as its upstream is done (a cache hit is
cheaper than a thread hop); only the steps that must build go to the build threads, at most
``slots`` at once (waiting on, and scanning, every held build made a cold build of 10,000
steps quadratic), and remote hits download on threads of their own, beside the builds.

A remote hit may settle on its entry (``Settled``): its dependents are decided from the
digests the entry names while its outputs download, so that a chain of remote hits costs a
round trip a step, not a download and a store. A build that reads such a step's outputs waits
for them. When its download fails and it builds here with other outputs, the steps decided
from its entry are ``diverged``'s dependents, for the scheduler to decide again; a build
reading its new outputs under a key made from the old ones is never started.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from optbuild.builder import upstream
from optbuild.builder.outcome import Options, Outcome
from optbuild.builder.status import Status
from optbuild.project.graph import StepGraph
from optbuild.project.recipe import Project, StepSpec

FETCHERS = 8  # remote hits downloaded at once, beside the builds: each waits on the network, not a CPU
READ_TOGETHER = 256  # remote entries read in one batch, ahead of their lookups (``Walk.prefetch``)

Build = Callable[[StepSpec], Outcome]


class Fetch:
    """A decision to download a remote hit: it runs on the fetch threads, not in a build
    slot; when the download fails it answers the build to run instead."""

    def __init__(self, fetch: Callable[[StepSpec], Outcome | Settled | Build], key: str | None = None):
        self.fetch, self.key = fetch, key  # key: whose remote entry it reads first

    def __call__(self, spec: StepSpec) -> Outcome | Settled | Build:
        return self.fetch(spec)


class Settled:
    """A remote hit settled on its entry (``outcome``): its dependents are decided from it
    while ``download`` brings its outputs here, on the fetch threads; when that fails, it
    answers the build to run instead."""

    def __init__(self, outcome: Outcome, download: Callable[[StepSpec], Outcome | Build]):
        self.outcome, self.download = outcome, download


Decision = Outcome | Fetch | Settled | Build


def _digests(outcome: Outcome) -> dict[str, str] | None:
    """The digests of a step's outputs, None when it has none to read."""
    if outcome.entry is None or not outcome.status.usable:
        return None
    return {name: output.digest for name, output in outcome.entry.outputs.items()}


@dataclass
class Walk:
    project: Project
    graph: StepGraph
    options: Options
    outcomes: dict[str, Outcome]  # the scheduler's, filled by ``finish``
    decide: Callable[[StepSpec], Decision]  # the step settled, or how to fetch or build it
    run_step: Callable[[str, Callable[[StepSpec], Decision]], Decision]  # errors as a failed outcome
    finish: Callable[[str, Outcome], Outcome]  # record and report an outcome
    gc_lock: Callable[[], AbstractContextManager[object]]  # held while a burst of steps is decided
    abort: Callable[[], None]  # the run ends early (an exception): cancel and stop every step
    prewarm: Callable[[str], None] | None = None  # a step about to build here
    prefetch: Callable[[list[str]], None] | None = None  # reads the remote entries of these keys together
    stop: str | None = None  # the first failure without -k: why steps not started are skipped
    would_stop: str | None = None  # a plan goes on past the first such step, and notes it
    _waiting: dict[str, int] = field(default_factory=dict)  # per step, its upstream steps not done
    _ready: deque[str] = field(default_factory=deque)
    _held: deque[tuple[str, Build]] = field(default_factory=deque)  # builds not started yet
    _fetches: deque[tuple[str, Fetch]] = field(default_factory=deque)  # remote hits to look up and download
    _downloads: deque[tuple[str, Callable[[StepSpec], Outcome | Build]]] = field(default_factory=deque)  # settled ones
    _building: dict[Future, str] = field(default_factory=dict)
    _fetching: dict[Future, str] = field(default_factory=dict)
    _downloading: dict[Future, str] = field(default_factory=dict)  # the outputs of settled remote hits
    _settled: dict[str, Outcome] = field(default_factory=dict)  # settled on their entry, not downloaded yet
    _unread: deque[str] = field(default_factory=deque)  # keys of queued lookups that no batch has read
    _reading: Future | None = None  # the batch that reads the entries of ``_in_flight``
    _in_flight: frozenset[str] = frozenset()  # their lookups wait for it
    diverged: set[str] = field(default_factory=set)  # settled on an entry whose outputs they did not get

    def run(self, selected: list[str], slots: int) -> None:
        chosen = set(selected)
        self._waiting = {sid: sum(d in chosen for d in self.graph.deps[sid]) for sid in selected}
        self._ready.extend(sid for sid in selected if self._waiting[sid] == 0)
        with ThreadPoolExecutor(max_workers=slots) as builders, \
                ThreadPoolExecutor(max_workers=FETCHERS, thread_name_prefix="optbuild-restore") as fetchers:
            try:
                while (self._ready or self._held or self._building or self._fetches or self._fetching
                       or self._downloads or self._downloading or self._reading):
                    self._step(builders, fetchers, slots)
            except BaseException:  # Ctrl-C, say: the threads end only once their steps are stopped
                self.abort()
                raise

    def _step(self, builders: ThreadPoolExecutor, fetchers: ThreadPoolExecutor, slots: int) -> None:
        """One turn of the walk: decide what is ready, start downloads and builds, collect."""
        with self.gc_lock() if self._ready else contextlib.nullcontext():  # one flock a burst
            self._decide_ready()
        self._start_remote(fetchers)
        while self._held and self.stop is not None:  # a failure while they waited: as for steps not started
            sid, _build = self._held.popleft()
            self._settle(sid, self.finish(sid, Outcome(Status.SKIPPED, reasons=[self.stop])))
        while self._held and len(self._building) < slots and self._startable(self._held[0][0]):
            sid, build = self._held.popleft()
            if (dep := next((d for d in self.graph.deps[sid] if d in self.diverged), None)) is not None:
                why = f"upstream {dep} was built here with other outputs than the remote's, which it was keyed from"
                self._settle(sid, self.finish(sid, Outcome(Status.SKIPPED, reasons=[why])))
                continue
            self._building[builders.submit(self.run_step, sid, build)] = sid
        if self._building or self._fetching or self._downloading or self._reading:
            self._collect()

    def _start_remote(self, fetchers: ThreadPoolExecutor) -> None:
        """Start remote work on the fetch threads, no more than there are threads: the
        downloads of settled steps first (builds wait for them), then lookups. Work submitted
        beyond that would only queue in the pool, and every wait scans all that is submitted:
        a fresh host restoring thousands of steps side by side paid for that quadratically.
        A lookup whose entry is being read with others (``_read_together``) waits for it."""
        self._read_together(fetchers)
        while (len(self._fetching) + len(self._downloading) + (self._reading is not None) < FETCHERS
               and (self._downloads or (self._fetches and self._fetches[0][1].key not in self._in_flight))):
            if self._downloads:
                sid, download = self._downloads.popleft()
                self._downloading[fetchers.submit(self.run_step, sid, download)] = sid
            else:
                sid, fetch = self._fetches.popleft()
                self._fetching[fetchers.submit(self.run_step, sid, fetch)] = sid

    def _read_together(self, fetchers: ThreadPoolExecutor) -> None:
        """Read the remote entries of the queued lookups in one batch (concurrent requests),
        so that each lookup then costs no round trip: a fresh host restoring many steps side
        by side waits a round trip per batch, not one per eight steps."""
        if self.prefetch is None or self._reading is not None or not self._unread:
            return
        if len(self._unread) == 1:  # a lone lookup reads its entry itself
            self._unread.clear()
            return
        keys = [self._unread.popleft() for _ in range(min(READ_TOGETHER, len(self._unread)))]
        self._in_flight = frozenset(keys)
        self._reading = fetchers.submit(self.prefetch, keys)

    def _collect(self) -> None:
        """Settle the builds and downloads that ended (a failed download becomes a build,
        ahead of the others: builds may wait for its outputs)."""
        reading = [self._reading] if self._reading is not None else []
        done, _ = wait([*self._building, *self._fetching, *self._downloading, *reading], timeout=0.2,
                       return_when=FIRST_COMPLETED)
        for future in done:
            if future is self._reading:
                self._reading, self._in_flight = None, frozenset()
                future.result()  # it never raises, but for a bug
                continue
            sid = next(d.pop(future) for d in (self._building, self._fetching, self._downloading) if future in d)
            result = future.result()
            if isinstance(result, Settled):
                self._settle_on_entry(sid, result)
            elif isinstance(result, Outcome):
                self._settle(sid, result)
            elif sid in self._settled:
                self._held.appendleft((sid, result))
            elif not isinstance(result, Fetch):  # its download failed: it builds
                self._held.append((sid, result))

    def _settle_on_entry(self, sid: str, settled: Settled) -> None:
        """``sid``'s dependents are decided from its remote entry while its outputs download."""
        self.outcomes[sid] = self._settled[sid] = settled.outcome
        self._downloads.append((sid, settled.download))
        self._ready_dependents(sid)

    def _decide_ready(self) -> None:
        """Decide each ready step (and those its settling makes ready) in the main thread:
        parked, blocked, settled from the caches, to be downloaded, or held to be built."""
        while self._ready:
            sid = self._ready.popleft()
            if (parked := upstream.parked(self.project, self.graph, self.outcomes, sid)) is not None:
                self._settle(sid, self.finish(sid, Outcome(Status.SKIPPED, reasons=[parked], parked=True)))
                continue
            if (why := self._blocked(sid)) is not None:
                self._settle(sid, self.finish(sid, Outcome(Status.SKIPPED, reasons=[why])))
                continue
            decision = self.run_step(sid, self.decide)
            if isinstance(decision, Outcome):
                self._settle(sid, decision)
            elif isinstance(decision, Fetch):
                self._fetches.append((sid, decision))
                if self.prefetch is not None and decision.key is not None:
                    self._unread.append(decision.key)
            else:
                assert not isinstance(decision, Settled)  # only a fetch answers one
                if self.prewarm is not None:
                    self.prewarm(sid)
                self._held.append((sid, decision))

    def _settle(self, sid: str, outcome: Outcome) -> None:
        """``sid`` is done: the steps waiting only on it are ready (those of a step settled on
        its entry already are: it diverged if its outputs are not the entry's); a failure
        stops the run (a plan notes where it would have) unless keep_going."""
        halts = outcome.status == Status.FAILED or (outcome.status == Status.UNAVAILABLE
                                                    and not self.options.skip_unavailable)
        if halts and not self.options.keep_going:
            if self.options.dry_run:
                self.would_stop = self.would_stop or sid
            elif self.stop is None:
                self.stop = f"build stopped after {sid} {'failed' if outcome.status == Status.FAILED else 'was unavailable'}"
        if (settled := self._settled.pop(sid, None)) is not None:
            if _digests(outcome) != _digests(settled):
                self.diverged.add(sid)
            return
        self._ready_dependents(sid)

    def _ready_dependents(self, sid: str) -> None:
        for child in self.graph.dependents[sid]:
            if child in self._waiting:
                self._waiting[child] -= 1
                if self._waiting[child] == 0:
                    self._ready.append(child)

    def _blocked(self, sid: str) -> str | None:
        """Why ``sid`` must not start: an upstream step that did not succeed (for one that
        was skipped too, the failure behind it), else the stop, if any. A step that takes
        partial inputs (select) starts while one of its listed inputs succeeded."""
        bad = [d for d in self.graph.deps[sid] if not self.outcomes[d].status.usable]
        if not bad or (self.stop is None and upstream.partial_ok(self.project.steps[sid], bad)):
            return self.stop
        dep = next((d for d in bad if self.outcomes[d].status != Status.SKIPPED), bad[0])
        outcome = self.outcomes[dep]
        if outcome.status == Status.SKIPPED and outcome.reasons:
            return outcome.reasons[0]
        return f"upstream {dep} {outcome.status}"

    def _startable(self, sid: str) -> bool:
        """An exclusive step starts when nothing builds, and nothing starts beside it; the
        first held build waits its turn (FIFO, so that an exclusive one is not starved), and
        for the outputs of its inputs settled on their remote entries to download."""
        if any(dep in self._settled for dep in self.graph.deps[sid]):
            return False
        if any(self.project.steps[b].step.exclusive for b in self._building.values()):
            return False
        return not self._building or not self.project.steps[sid].step.exclusive
