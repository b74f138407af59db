"""A run's options, and what happened to each of its steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optbuild.builder.status import Status
from optbuild.store.entry import ActionEntry


@dataclass
class Options:
    jobs: int = 1  # 0: as many as the builder builds at once (Builder.slots)
    keep_going: bool = False
    dry_run: bool = False
    skip_unavailable: bool = False
    fetch_only: bool = False  # build --no-build: take what the caches hold, build nothing
    retry_failed: bool = False  # run steps whose failure with the same key is remembered
    preload: bool = True  # steps fork from a server that has imported their tools (Linux)
    executor: str = "local"  # where steps build: "local", "dask", "auto" (dask when it can)
    dask_scheduler: str = ""  # the Dask scheduler's address, for "dask" and "auto"
    # which outputs come to this host when steps build elsewhere (Dask): "all", or "targets"
    # (the steps the user named, else the ends of what was selected; the rest stay on the remote)
    download: str = "targets"


@dataclass
class Outcome:
    """What happened to one step."""

    status: Status
    key: str | None = None
    entry: ActionEntry | None = None
    reasons: list[str] = field(default_factory=list)
    error: str | None = None
    source: str | None = None  # "remote" when the remote cache served it
    parked: bool = False  # skipped because it (or an upstream step) has enabled = false
    # its outputs are on the remote cache only (built on a Dask node, or a remote hit, and not
    # asked for here): not in the local cache nor the build folder
    remote_only: bool = False

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a plain string ("built") is taken as its member


@dataclass(frozen=True)
class Replay:
    """Steps a run leaves out because nothing they were decided from changed since the last
    ok build (its no-op stamp says so, ``common.noopreach``): their recorded events are
    reported again and they count in the summary, but they are neither loaded nor decided,
    and their records (optbuild.lock, the decision memo) stay as they are."""

    events: list[dict[str, Any]]  # their step and warning events, as recorded
    decided: list[str]  # the other steps of the run, decided as usual (upstream ones first)

    @property
    def steps(self) -> list[str]:
        return [e["step"] for e in self.events if e["event"] == "step"]

    def outcomes(self) -> dict[str, Outcome]:
        return {e["step"]: Outcome(e["status"], e.get("key"), reasons=list(e.get("reasons") or []),
                                   error=e.get("error"))
                for e in self.events if e["event"] == "step"}
