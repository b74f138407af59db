"""A run's options, and what happened to each of its steps."""

from __future__ import annotations

from dataclasses import dataclass, field

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
