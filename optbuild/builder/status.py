"""What happened to a step: one enum for the executor, the reporters, the API and bench.

A ``StrEnum``: each member *is* its string, so events, ``--json`` lines, stats records and
the lock file carry the same values as before ("built", "would-build", ...), and code or
tests comparing with a plain string keep working.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    CACHED = "cached"  # served by the local cache
    RESTORED = "restored"  # fetched from the remote cache
    BUILT = "built"
    WOULD_BUILD = "would-build"  # a plan, or build --no-build: it would have to build
    FAILED = "failed"
    SKIPPED = "skipped"  # not started: an upstream step did not succeed, the build stopped, or disabled
    UNAVAILABLE = "unavailable"  # this host cannot run it (no GPU, say)
    RUNNING = "running"  # only in events: it has started building

    @property
    def ok(self) -> bool:
        """Its outputs are in place (in the cache and the build folder): a success."""
        return self in OK

    @property
    def usable(self) -> bool:
        """Steps that depend on it may go on: it succeeded, or (in a plan) will build."""
        return self in USABLE


OK = frozenset({Status.CACHED, Status.RESTORED, Status.BUILT})
USABLE = OK | {Status.WOULD_BUILD}
