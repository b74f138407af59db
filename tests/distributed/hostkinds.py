"""A test step kind keyed by one host fingerprint field, which only a host with the value
asked for can build: as a TensorRT engine is bound to a GPU generation."""

from __future__ import annotations

import os
import time

from optbuild.steps.base import Step, StepContext, StepParams, StepRef


class BoundParams(StepParams):
    input: StepRef
    field: str  # the fingerprint field the output depends on ("gpu.0.compute_capability")
    value: str  # the value a host must have to build it
    sleep: float = 0.0


class Bound(Step):
    Params = BoundParams
    primary_output = "data.txt"

    def host_key(self, host):
        return {self.params.field: host.get(self.params.field)}

    def unavailable(self, host):
        got = host.get(self.params.field)
        if str(got) == self.params.value:
            return None
        return f"needs {self.params.field} = {self.params.value} (here: {got})"

    def run(self, ctx: StepContext) -> None:
        if marker := os.environ.get("OPTBUILD_TEST_STARTED"):  # the node's pid: a test may kill it
            with open(marker, "a") as out:
                out.write(f"{_node_pid()}\n")
        time.sleep(self.params.sleep)
        text = ctx.inputs["input"].primary.read_text()
        (ctx.out_dir / "data.txt").write_text(f"{text}@{self.params.field}={self.params.value}")
        (ctx.out_dir / "sub").mkdir()
        (ctx.out_dir / "sub" / "note.txt").write_text("built for " + self.params.value)
        ctx.metrics["forked"] = _forked()


def _forked() -> bool:
    """Whether this step runs in a child of a fork server (else in a fresh process)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        return b"optbuild.process.forkserver" in cmdline.read()


def _node_pid() -> int:
    """The node that runs this step: its parent, or its parent's parent when it was forked
    from one of the node's fork servers."""
    parent = os.getppid()
    if not _forked():
        return parent
    with open(f"/proc/{parent}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
