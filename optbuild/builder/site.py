"""Where a step builds: the seam between the scheduler and a builder.

The scheduler (``optbuild.builder.scheduler``) keeps the order of the steps, the keys, the
cache lookups, the failures it remembers and the lock file. A ``Builder`` only decides which
host a step's key is computed for (``place``) and builds one step (``build``): the entry,
stored in the local cache, or an error. ``optbuild.builder.local.LocalBuilder`` builds on this
host; ``optbuild.distributed.builder.DaskBuilder`` on the nodes of a Dask cluster. A builder
sees a ``BuildContext`` (what it may use of the build), never the scheduler.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.builder.report import Reporter
from optbuild.common.errors import OptbuildError
from optbuild.common.fingerprint import Fingerprint
from optbuild.process.action import Action
from optbuild.process.pool import ProcessPool
from optbuild.process.runstep import Running, StepRun
from optbuild.project.recipe import Project, StepSpec
from optbuild.store.entry import ActionEntry
from optbuild.store.local import LocalStore
from optbuild.store.remote import RemoteSession


@dataclass
class BuildContext:
    """What a builder may use of the build it serves."""

    project: Project
    store: LocalStore
    host: Fingerprint  # this host's
    reporter: Reporter
    pool: ProcessPool  # this host's step processes
    remote: RemoteSession | None = None
    dry_run: bool = False
    dask_scheduler: str = ""  # the Dask scheduler's address, for the dask builder
    cancel: threading.Event = field(default_factory=threading.Event)
    running: Running = field(default_factory=Running)


@dataclass
class Placement:
    """Where a step will build, decided before its key: the fingerprint its key is computed
    for (the host that will run it), and what a builder needs to send it there."""

    host: Fingerprint
    # why no node can build it, in words (None: it can be built); a callable, as a step's
    # ``unavailable`` may be costly and is asked only when the step must build
    missing: Callable[[], str | None] = lambda: None
    route: Any = None  # the builder's own routing (Dask: the resources to ask for)

    @classmethod
    def on(cls, host: Fingerprint, spec: StepSpec) -> Placement:
        """On ``host``, where ``spec`` can build unless its step says why not."""
        return cls(host, lambda: spec.step.unavailable(host))


@dataclass(frozen=True)
class BuildRequest:
    """One step to build, its key decided."""

    spec: StepSpec
    placement: Placement
    run: StepRun  # the step as a process on this host runs it, from its action
    upstream: dict[str, ActionEntry]  # the entries of its inputs, by the parameter that names them
    key_files: dict[str, Path]  # the files it reads, by their names in the action
    # called once the step ran here, before its entry is stored: StepError when the result
    # must not be cached (its inputs changed while it ran)
    guard: Callable[[], None] = lambda: None
    download: bool = True  # its outputs come to this host's cache (else they may stay on the remote)
    remote_inputs: frozenset[str] = frozenset()  # inputs whose outputs are on the remote cache only

    @property
    def action(self) -> Action:
        return self.run.action

    @property
    def key(self) -> str:
        return self.run.action.key


class BuilderUnavailable(OptbuildError):
    """A builder that cannot serve this build (its scheduler is unreachable, it has no nodes
    or no remote cache): an error, or with executor "auto" a build on this host."""


class Builder:
    """Builds steps somewhere; made for one build from its context."""

    local = True  # steps run in this host's processes (prewarm the fork servers)
    name = "local"

    def __init__(self, context: BuildContext):
        self.context = context

    def start(self) -> None:
        """Called once, before the first step is placed."""

    def slots(self) -> int:
        """How many steps it builds at once when the user named no number (``-j``,
        ``[build] jobs``): one per CPU here."""
        return os.cpu_count() or 1

    def place(self, spec: StepSpec) -> Placement:
        return Placement.on(self.context.host, spec)

    def build(self, request: BuildRequest) -> ActionEntry:
        """The step's entry, stored in the local cache; a builder that builds elsewhere (not
        ``local``) leaves it on the remote cache when the request does not ``download`` it.
        ``runstep.StepFailed`` when the step failed (the scheduler reports it and may
        remember it), StepError when it could not be built, ``runstep.Cancelled``."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once the run ends (also when it fails)."""
