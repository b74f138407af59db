"""Remote hits: whether the remote may hold a key (listed once in a run of many steps), its
entry read, the step settled on it while its outputs download behind the walk, or those
outputs left on the remote ("build without the bytes"). Apart from the scheduler, which
hands it the stores, the options and what a step comes to without the remote."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from optbuild.builder.outcome import Options, Outcome
from optbuild.builder.restore import Restorer
from optbuild.builder.site import Placement
from optbuild.builder.status import Status
from optbuild.builder.walk import Build, Settled
from optbuild.process.action import Action
from optbuild.project.recipe import StepSpec
from optbuild.store.entry import ActionEntry
from optbuild.store.local import LocalStore
from optbuild.store.remote import RemoteSession

LIST_REMOTE_FROM = 64  # steps in a run from which one listing of the remote beats a request per miss

Miss = Callable[[StepSpec, Action, list[str], Path, Placement], Outcome | Build]


class RemoteHits:
    """The remote hits of one scheduler's runs."""

    def __init__(self, remote: RemoteSession | None, store: LocalStore, restorer: Restorer, options: Options,
                 without_remote: Miss):
        """``without_remote``: what a step the remote cannot give comes to (its entry missing,
        or its download failed): its remembered failure, unavailable, would build, or a build."""
        self.remote = remote
        self.store = store
        self.restorer = restorer
        self.options = options
        self.without_remote = without_remote
        self.settle_on_entries = True  # False in a run deciding again what a failed download changed
        self._listed = False  # whether the remote's entries were listed (``may_hold``)
        self._selected = 0  # steps in this run
        self._wanted: frozenset[str] | None = None  # steps whose outputs come here
        self._local = True  # whether steps build on this host
        # Downloads that wait on no network (every blob carried in the entry) run at most one a
        # core: more threads only contend for the interpreter (file:// 1,000 steps: 15% slower)
        self._on_cores = threading.BoundedSemaphore(os.cpu_count() or 1)

    def begin(self, selected: int, wanted: frozenset[str] | None, local: bool) -> None:
        """A run of ``selected`` steps, ``wanted`` those whose outputs come here (None: all),
        built on this host when ``local``: how it lists the remote, settles and downloads."""
        self._selected, self._wanted, self._local = selected, wanted, local

    def may_hold(self, key: str) -> bool:
        """Whether the remote may hold ``key`` (False: its listing lacks it). At the first
        local miss of a run of many steps, the remote's entries are listed once
        (``RemoteSession.prefetch_listing``), so that each key it does not hold costs no round
        trip; a fully cached build never contacts it. From the main thread."""
        assert self.remote is not None
        if not self._listed:
            self._listed = True
            if self._selected >= LIST_REMOTE_FROM:
                self.remote.prefetch_listing()
        return not self.remote.listed_absent(key)

    def fetch(self, spec: StepSpec, action: Action, reasons: list[str], dest: Path,
              placement: Placement) -> Outcome | Settled | Build:
        """Read the remote's entry (a round trip, unless the listing lacks it); then settle the
        step on it and download behind the walk (``_settles``), or download now (a plan: its
        entry gives the keys downstream). When the remote has none, as ``without_remote``."""
        assert self.remote is not None
        if (remote_entry := self.remote.lookup(action.key, spec.id, spec.step.primary_output)) is None:
            return self.without_remote(spec, action, reasons, dest, placement)
        if self.options.dry_run:
            return Outcome(Status.RESTORED, action.key, remote_entry, [*reasons, "on the remote cache"], source="remote")

        def download(spec: StepSpec) -> Outcome | Build:
            if remote_entry.blobs_apart():
                return self._download_locked(spec, action, remote_entry, reasons, dest, placement)
            with self._on_cores:  # all it brings lies in its entry: no network to wait on
                return self._download_locked(spec, action, remote_entry, reasons, dest, placement)

        if self._settles(spec.id, remote_entry):
            return Settled(Outcome(Status.RESTORED, action.key, remote_entry, reasons=reasons, source="remote"),
                           download)
        return download(spec)

    def stays_remote(self, sid: str) -> bool:
        """Whether the outputs of ``sid`` stay on the remote cache ("build without the bytes"):
        steps build elsewhere (a Dask node reads its inputs from the remote), the build asked
        for its targets' outputs only, and ``sid`` is not one of them."""
        return (not self._local and self.options.download == "targets" and not self.options.dry_run
                and self._wanted is not None and sid not in self._wanted)

    def _settles(self, sid: str, entry: ActionEntry) -> bool:
        """Whether a remote hit settles on its entry, its outputs downloaded while its
        dependents are decided (``walk.Settled``): on this host (a Dask node fetches its own
        inputs), in a run of many steps, whose remote blobs are listed once (an entry whose
        blobs a gc there took settles nothing), unless its outputs stay on the remote, or
        this is a run deciding again what a failed download changed."""
        return (self.settle_on_entries and self._local and not self.stays_remote(sid)
                and self._selected >= LIST_REMOTE_FROM and self._blobs_on_remote(entry))

    def _download_locked(self, spec: StepSpec, action: Action, remote_entry: ActionEntry, reasons: list[str],
                         dest: Path, placement: Placement) -> Outcome | Build:
        """Download the remote's entry under the key's lock, unless another builder stored it
        meanwhile, or leave it there (``stays_remote``); when its download failed (a warning
        says why), as ``without_remote``."""
        key, stays = action.key, self.stays_remote(spec.id)
        with self.store.shared_gc_lock(), self.store.lock(key):
            entry, status = self.store.get_action(key), Status.CACHED
            if entry is None and stays and self._blobs_on_remote(remote_entry, as_blobs=True):  # its nodes read it there
                self.restorer.vacate(spec, dest)
                return Outcome(Status.RESTORED, key, remote_entry, reasons=reasons, source="remote", remote_only=True)
            if entry is None and self.remote is not None:
                entry, status = self.remote.fetch(remote_entry, self.store, spec.id), Status.RESTORED
            if entry is None:
                return self.without_remote(spec, action, reasons, dest, placement)
            self.restorer.restore(spec, entry, dest)
        return Outcome(status, key, entry, reasons=reasons, source="remote" if status == Status.RESTORED else None)

    def _blobs_on_remote(self, entry: ActionEntry, *, as_blobs: bool = False) -> bool:
        """Whether the remote still holds the blobs of ``entry`` (a gc there may have taken
        them; ``as_blobs``: each by itself, as a Dask node reads it, none carried in the entry)."""
        assert self.remote is not None
        return self.remote.holds_blobs(entry, listing=self._selected >= LIST_REMOTE_FROM, as_blobs=as_blobs)
