"""Reporters: how build events reach a person (rich or plain lines) or a machine (JSON).

The scheduler emits events (``optbuild.common.events``: typed dicts); a reporter only formats them. ``--json`` writes one
JSON object per line, which tests and CI tooling read.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TextIO

from optbuild.builder.status import Status
from optbuild.common.events import Event

# one lock for every writer of progress: reporters and bench's progress share stderr
_WRITE_LOCK = threading.Lock()

_STYLE = {
    Status.CACHED: "green", Status.RESTORED: "green", Status.BUILT: "bold green",
    Status.WOULD_BUILD: "yellow", Status.RUNNING: "cyan", Status.FAILED: "bold red",
    Status.SKIPPED: "dim", Status.UNAVAILABLE: "magenta",
}


class Reporter:
    """Collects events; subclasses also show them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        """Record and show ``event``; safe from any thread (the scheduler's threads emit),
        and the events are shown in the order they are recorded."""
        event.setdefault("time", time.time())
        with self._lock:
            self.events.append(event)
            self.show(event)

    def show(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass

    def steps_with(self, status: Status | str) -> list[str]:
        return [e["step"] for e in self.events if e.get("event") == "step" and e["status"] == status]


class JsonReporter(Reporter):
    def __init__(self, stream: TextIO = sys.stdout):
        super().__init__()
        self.stream = stream

    def show(self, event: Event) -> None:
        write_line(self.stream, json.dumps(event, default=str))


def write_line(stream: TextIO, text: str) -> None:
    """Write ``text`` and its newline in one call, under a lock: lines written by several
    threads never run together (print() writes the newline apart, and on an unbuffered
    stream each part goes out on its own)."""
    with _WRITE_LOCK:
        stream.write(text + "\n")
        stream.flush()


def _line(event: Event) -> str | None:
    kind = event.get("event")
    if kind == "step":
        status = event["status"]
        if status == Status.RUNNING:
            why = "; ".join(event.get("reasons") or [])
            return f"  build    {event['step']}" + (f"  ({why})" if why else "")
        text = f"  {status:<8} {event['step']}"
        if event.get("duration_s") is not None and status == Status.BUILT:
            text += f"  {event['duration_s']:.1f}s" + (f" on {event['node']}" if event.get("node") else "")
        if status in (Status.WOULD_BUILD, Status.SKIPPED) and event.get("reasons"):
            text += "  (" + "; ".join(event["reasons"]) + ")"
        if event.get("error"):
            text += "\n" + "\n".join("      " + line for line in str(event["error"]).splitlines())
        return text
    if kind == "done":
        counts = ", ".join(f"{n} {status}" for status, n in event["counts"].items() if n)
        verdict = "ok" if event["ok"] else "FAILED"
        return f"{verdict}: {counts or 'nothing to do'} in {event['duration_s']:.2f}s"
    if kind == "warning":
        return f"warning: {event['message']}"
    if kind == "note":
        return f"note: {event['message']}"
    return None


def is_result(event: Event) -> bool:
    """Whether ``event`` is part of a command's answer (a step's line, the summary), which
    ``results`` streams take, rather than a diagnostic (a warning, a note)."""
    return event.get("event") in ("step", "done")


class PlainReporter(Reporter):
    """Lines on ``stream``; the step lines and the summary on ``results`` when given (plan's
    answer goes to stdout, where `optbuild plan | grep` finds it)."""

    def __init__(self, stream: TextIO = sys.stderr, results: TextIO | None = None):
        super().__init__()
        self.stream = stream
        self.results = results or stream

    def show(self, event: Event) -> None:
        if (line := _line(event)) is not None:
            write_line(self.results if is_result(event) else self.stream, line)


class RichReporter(Reporter):
    """Colored lines and a live status of the steps running now, on stderr; the step lines
    and the summary on ``results`` when given."""

    def __init__(self, results: TextIO | None = None) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.results = self.console if results is None else Console(file=results, highlight=False)
        self.running: dict[str, float] = {}
        self.status = None

    def show(self, event: Event) -> None:
        line = _line(event)
        if event.get("event") == "step":
            status, step = event["status"], event["step"]
            if status == Status.RUNNING:
                self.running[step] = time.monotonic()
            else:
                self.running.pop(step, None)
            if line is not None:
                self.results.print(line, style=_STYLE.get(status), markup=False)
            self._refresh()
        elif line is not None:
            style = "bold green" if event.get("ok") else "bold red" if event.get("event") == "done" else "yellow"
            (self.results if is_result(event) else self.console).print(line, style=style, markup=False)

    def _refresh(self) -> None:
        if self.running:
            text = "building " + ", ".join(self.running)
            if self.status is None:
                self.status = self.console.status(text)
                self.status.start()
            else:
                self.status.update(text)
        elif self.status is not None:
            self.status.stop()
            self.status = None

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def make_reporter(json_events: bool, *, results: TextIO | None = None) -> Reporter:
    """The reporter of a command: JSON lines on stdout, else lines on stderr (colored on a
    terminal), the step lines and the summary on ``results`` when given."""
    if json_events:
        return JsonReporter()
    if (results or sys.stderr).isatty():
        return RichReporter(results)
    return PlainReporter(results=results)
