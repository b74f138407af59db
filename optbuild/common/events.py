"""The events of a build: what the scheduler, the remote cache and a builder tell the user.

Each kind is a TypedDict: a plain dict at run time, so that ``--json`` writes it as it is and
the build server forwards it unchanged, and a type to a reader and to a type checker. A
reporter (``optbuild.builder.report``) stamps each with its ``time`` and shows it.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class StartEvent(TypedDict):
    event: Literal["start"]
    steps: list[str]  # the steps selected, in the order they may run
    jobs: int
    dry_run: bool
    time: NotRequired[float]


class StepEvent(TypedDict):
    event: Literal["step"]
    step: str
    status: str  # a builder.status.Status
    key: str | None
    reasons: list[str]  # why it builds, or why it was skipped
    error: NotRequired[str]
    source: NotRequired[str]  # "remote" when the remote cache served it
    duration_s: NotRequired[float]  # built: how long it took
    node: NotRequired[str]  # built on a Dask node: its name
    remote_only: NotRequired[bool]  # its outputs stay on the remote cache (Dask, not downloaded)
    time: NotRequired[float]


class ProgressEvent(TypedDict):
    event: Literal["progress"]
    step: str  # a step building now
    message: str  # what it says it is doing ("calibrating sample 12 of 32")
    time: NotRequired[float]


class MessageEvent(TypedDict):
    event: Literal["warning", "note"]
    message: str
    source: NotRequired[str]  # "remote": from the remote cache
    step: NotRequired[str | None]  # the step it is about, if one
    key: NotRequired[str]  # the key it is about, if one
    error: NotRequired[str]  # the error behind it, if one
    time: NotRequired[float]


class CacheEvent(TypedDict):
    event: Literal["cache"]
    local: dict[str, int]  # hits, misses, unavailable
    remote: dict[str, Any] | None  # the remote session's summary
    time: NotRequired[float]


class DoneEvent(TypedDict):
    event: Literal["done"]
    ok: bool
    counts: dict[str, int]  # steps by status
    duration_s: float
    bytes_hashed: int
    time: NotRequired[float]


Event = StartEvent | StepEvent | ProgressEvent | MessageEvent | CacheEvent | DoneEvent


def warning(message: str, *, source: str | None = None, step: str | None = None,
            key: str | None = None, error: str | None = None) -> MessageEvent:
    """A warning; ``source``, ``step``, ``key`` and ``error`` only when given."""
    event = MessageEvent(event="warning", message=message)
    if source is not None:
        event["source"] = source
    if step is not None:
        event["step"] = step
    if key is not None:
        event["key"] = key
    if error is not None:
        event["error"] = error
    return event


def note(message: str) -> MessageEvent:
    return MessageEvent(event="note", message=message)
