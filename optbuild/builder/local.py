"""Builds a step on this host: ``runstep`` in a scratch folder of the local cache, its
outputs filed there."""

from __future__ import annotations

import shutil

from optbuild.builder.site import Builder, BuildRequest
from optbuild.common.errors import DiskFullError, describe_os_error, is_disk_full
from optbuild.common.events import ProgressEvent
from optbuild.process.runstep import Cancelled, file_outputs, run_step
from optbuild.store.entry import ActionEntry


class LocalBuilder(Builder):
    """Steps build here, each in a process of this host's pool."""

    def build(self, request: BuildRequest) -> ActionEntry:
        """A full disk (scratch space, blobs, entry) fails the step with a message naming
        that disk."""
        ctx = self.context
        if ctx.cancel.is_set():
            raise Cancelled
        try:
            scratch = ctx.store.new_tmp_dir(prefix=request.spec.name)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFullError(describe_os_error(exc, ctx.store.root)) from None
        try:
            ran = run_step(request.run, scratch, ctx.pool, ctx.cancel, running=ctx.running,
                           on_progress=lambda message: ctx.reporter.emit(
                               ProgressEvent(event="progress", step=request.spec.id, message=message)))
            request.guard()
            entry = file_outputs(request.run, ran, ctx.store)
            ctx.store.put_action(entry)
            return entry
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFullError(describe_os_error(exc, scratch)) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
