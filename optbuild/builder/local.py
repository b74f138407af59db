"""Builds a step on this host: ``runstep`` in a scratch folder of the local cache, its
outputs filed there."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from optbuild.builder.site import BuildContext, Builder, BuildRequest
from optbuild.common.errors import full_disk_named
from optbuild.common.events import ProgressEvent
from optbuild.process.runstep import Cancelled, file_outputs, reset_scratch, run_step
from optbuild.store.entry import ActionEntry


class LocalBuilder(Builder):
    """Steps build here, each in a process of this host's pool."""

    def __init__(self, context: BuildContext):
        super().__init__(context)
        self._free: list[Path] = []  # scratch folders a finished step left ready for the next
        self._lock = threading.Lock()

    def build(self, request: BuildRequest) -> ActionEntry:
        """A full disk (scratch space, blobs, entry) fails the step with a message naming
        that disk."""
        ctx = self.context
        if ctx.cancel.is_set():
            raise Cancelled
        scratch = self._take_scratch()
        try:
            with full_disk_named(scratch):
                ran = run_step(request.run, scratch, ctx.pool, ctx.cancel, running=ctx.running,
                               on_progress=lambda message: ctx.reporter.emit(
                                   ProgressEvent(event="progress", step=request.spec.id, message=message)))
                request.guard()
                entry = file_outputs(request.run, ran, ctx.store)
                ctx.store.put_action(entry)
                return entry
        finally:
            self._give_back(scratch)

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for scratch in free:
            shutil.rmtree(scratch, ignore_errors=True)

    def _take_scratch(self) -> Path:
        """A scratch folder another step of this build left ready, else a new one."""
        with self._lock:
            if self._free:
                return self._free.pop()
        with full_disk_named(self.context.store.root):
            return self.context.store.new_tmp_dir(prefix="step")

    def _give_back(self, scratch: Path) -> None:
        """Its step's process has ended: kept for the next step if ``reset_scratch`` readies
        it, else removed."""
        if reset_scratch(scratch):
            with self._lock:
                self._free.append(scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
