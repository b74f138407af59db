"""What a remote operation raises, and where a session's warnings go."""

from __future__ import annotations

from typing import Protocol

from optbuild.common.events import Event


class Failed(Exception):
    """A remote operation failed; it has been counted and reported. The message says how."""


class Rejected(Exception):
    """What the remote sent is not acceptable (corrupt, unsigned, unsafe)."""


class RemoteMissing(Exception):
    """A remote folder on this host's file system that does not exist (an unmounted share):
    never created, as a folder made in its place would take what belongs on the share."""


class TransferError(Exception):
    """A blob could not be checked, uploaded or downloaded (``RemoteSession``'s blob
    methods, which the dask executor uses); the message says why."""


class EventSink(Protocol):
    """Where a session's warnings go: ``optbuild.builder.report.Reporter`` is one (this layer
    imports nothing above it, so it names only the one method it calls)."""

    def emit(self, event: Event) -> None: ...


def describe(exc: BaseException) -> str:
    """An exception in one line, as warnings show it: its type and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
