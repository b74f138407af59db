"""Reporters: how build events reach a person (rich or plain lines) or a machine (JSON).

The scheduler emits events (``optbuild.common.events``: typed dicts); a reporter only formats them. ``--json`` writes one
JSON object per line, which tests and CI tooling read: each step's event with its full reason.
For a person, a line per step (an unavailable or skipped one's short: the reasons follow
once each, grouped with the steps they cover, before the last line) and what runs now
(``Board``): a live region on a terminal, a line every ``heartbeat_s`` otherwise.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from optbuild.builder.status import Status
from optbuild.common.events import Event, StepEvent

if TYPE_CHECKING:
    from rich.live import Live

# one lock for every writer of progress: reporters and bench's progress share stderr
_WRITE_LOCK = threading.Lock()

_STYLE: dict[str, str] = {
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
        return [e["step"] for e in self.events if e["event"] == "step" and e["status"] == status]


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


def event_line(event: Event) -> str | None:
    """The line of ``event`` in plain and rich output. An unavailable or skipped step's line
    is its name only: its reason is shown once for all the steps it covers
    (``summary_lines``); a failure's error stays inline, as it is the step's own."""
    if event["event"] == "step":
        status = event["status"]
        if status == Status.RUNNING:
            why = "; ".join(event.get("reasons") or [])
            return f"  build    {event['step']}" + (f"  ({why})" if why else "")
        text = f"  {status:<8} {event['step']}"
        if event.get("duration_s") is not None and status == Status.BUILT:
            text += f"  {event['duration_s']:.1f}s" + (f" on {event['node']}" if event.get("node") else "")
        if event.get("remote_only"):
            text += "  (outputs left on the remote)"
        if (status == Status.WOULD_BUILD or _cancelled(event)) and event.get("reasons"):
            text += "  (" + "; ".join(event["reasons"]) + ")"
        if event.get("error") and status != Status.UNAVAILABLE:
            text += "\n" + "\n".join("      " + line for line in str(event["error"]).splitlines())
        return text
    if event["event"] == "done":
        counts = ", ".join(f"{n} {status}" for status, n in event["counts"].items() if n)
        verdict = "ok" if event["ok"] else "FAILED"
        return f"{verdict}: {counts or 'nothing to do'} in {event['duration_s']:.2f}s"
    if event["event"] == "warning":
        return f"warning: {event['message']}"
    if event["event"] == "note":
        return f"note: {event['message']}"
    return None


def _cancelled(event: StepEvent) -> bool:
    """A step skipped because the build was interrupted: no summary follows an interrupt,
    so its reason goes on its line."""
    return event["status"] == Status.SKIPPED and event.get("reasons") == ["cancelled"]


def unavailable_reason(event: StepEvent) -> str:
    """Why an unavailable step cannot run here, without its name (the scheduler's error
    reads "STEP cannot run here: WHY"), so that steps with the same need share it."""
    error = str(event.get("error") or "unknown")
    return error.removeprefix(f"{event['step']} cannot run here: ")


def summary_lines(events: list[Event]) -> list[str]:
    """The unavailable steps grouped by what they need, and the skipped ones by what
    skipped them (an upstream step that failed or cannot run, a stop, ``enabled = false``):
    each reason once, with the steps it covers, in the order they were reported. Shown
    before the build's last line; ``--json`` keeps each step's own reason instead."""
    groups: dict[str, dict[str, list[str]]] = {Status.UNAVAILABLE: {}, Status.SKIPPED: {}}
    for event in events:
        if event["event"] != "step" or event["status"] not in groups or _cancelled(event):
            continue
        if event["status"] == Status.UNAVAILABLE:
            reason = unavailable_reason(event)
        else:
            reason = "; ".join(event.get("reasons") or []) or "no reason given"
        groups[event["status"]].setdefault(reason, []).append(event["step"])
    lines = []
    if unavailable := groups[Status.UNAVAILABLE]:
        lines.append(f"{_steps(sum(map(len, unavailable.values())))} cannot run here:")
        for reason, steps in unavailable.items():
            lines.extend("  " + line for line in reason.splitlines())
            lines.append(f"    {_steps(len(steps))}: {', '.join(steps)}")
    if skipped := groups[Status.SKIPPED]:
        lines.append(f"{_steps(sum(map(len, skipped.values())))} skipped:")
        lines.extend(f"  {reason}: {', '.join(steps)}" for reason, steps in skipped.items())
    return lines


def _steps(n: int) -> str:
    return f"{n} step" + ("s" if n != 1 else "")


def is_result(event: Event) -> bool:
    """Whether ``event`` is part of a command's answer (a step's line, the summary), which
    ``results`` streams take, rather than a diagnostic (a warning, a note)."""
    return event["event"] in ("step", "done")


class Board:
    """What a build is doing now, for a person: ``[done/total]``, and each step running with
    when it started and what it last said it is doing (a ``progress`` event). Read by the
    live status's refresh thread while the build's threads update it: it reads copies."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.done = 0
        self.running: dict[str, float] = {}  # step -> time.monotonic() at its start
        self.doing: dict[str, str] = {}

    def update(self, event: Event) -> None:
        if event["event"] == "start":
            self.total, self.done = len(event["steps"]), 0
        elif event["event"] == "step" and event["status"] == Status.RUNNING:
            self.running[event["step"]] = time.monotonic()
        elif event["event"] == "step":
            self.running.pop(event["step"], None)
            self.doing.pop(event["step"], None)
            self.done += 1
        elif event["event"] == "progress" and event["step"] in self.running:
            self.doing[event["step"]] = event["message"]

    def counter(self) -> str:
        return f"[{self.done}/{'?' if self.total is None else self.total}]"

    def rows(self) -> list[tuple[str, float, str]]:
        """Each running step, its seconds so far and what it is doing ("" when it said nothing)."""
        now, doing = time.monotonic(), dict(self.doing)
        return [(step, now - started, doing.get(step, "")) for step, started in dict(self.running).items()]


class PlainReporter(Reporter):
    """Lines on ``stream``; the step lines and the summary on ``results`` when given (plan's
    answer goes to stdout, where `optbuild plan | grep` finds it). While steps run, every
    ``heartbeat_s`` a line says ``[done/total]`` and what runs, for how long, doing what: a
    CI log shows a long step is alive."""

    def __init__(self, stream: TextIO = sys.stderr, results: TextIO | None = None, *,
                 heartbeat_s: float = 15.0):
        super().__init__()
        self.stream = stream
        self.results = results or stream
        self.board = Board()
        self.heartbeat_s = heartbeat_s
        self._ticker: threading.Thread | None = None
        self._stopped = threading.Event()

    def show(self, event: Event) -> None:
        self.board.update(event)
        if event["event"] == "done":
            for summary in summary_lines(self.events):
                write_line(self.results, summary)
            self.close()
        if (line := event_line(event)) is not None:
            write_line(self.results if is_result(event) else self.stream, line)
        if self.board.running and self._ticker is None and not self._stopped.is_set():
            self._ticker = threading.Thread(target=self._beat, name="optbuild-heartbeat", daemon=True)
            self._ticker.start()

    def _beat(self) -> None:
        while not self._stopped.wait(self.heartbeat_s):
            if rows := self.board.rows():
                steps = "; ".join(f"{step} {secs:.0f}s" + (f" ({doing})" if doing else "")
                                  for step, secs, doing in rows)
                write_line(self.stream, f"  {self.board.counter()} running: {steps}")

    def close(self) -> None:
        """No heartbeat after this: the ticker is stopped and waited for (one that had just
        woken would otherwise write between the summary's lines, or after the last)."""
        self._stopped.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()


class LiveStatus:
    """The rich reporter's region at the bottom of the terminal, drawn anew at each refresh
    (so the seconds count up): ``[done/total]``, then a row per running step."""

    MAX_ROWS = 12

    def __init__(self, board: Board) -> None:
        from rich.spinner import Spinner

        self.board = board
        self.spinner = Spinner("dots")

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.table import Table
        from rich.text import Text

        rows = self.board.rows()
        self.spinner.update(text=Text(f"{self.board.counter()} " + (f"{len(rows)} running" if rows else "")))
        yield self.spinner
        if rows:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True)
            grid.add_column(justify="right")
            grid.add_column(style="dim", no_wrap=True, overflow="ellipsis")
            for step, secs, doing in rows[:self.MAX_ROWS]:
                grid.add_row(f"  {step}", f"{secs:.0f}s", doing)
            if len(rows) > self.MAX_ROWS:
                grid.add_row(f"  and {len(rows) - self.MAX_ROWS} more", "", "")
            yield grid


class RichReporter(Reporter):
    """Colored lines and, below them, a live status of the build (``LiveStatus``) on
    stderr; the step lines and the summary on ``results`` when given."""

    def __init__(self, results: TextIO | None = None) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.results = self.console if results is None else Console(file=results, highlight=False)
        self.board = Board()
        self.live: Live | None = None

    def show(self, event: Event) -> None:
        self.board.update(event)
        line = event_line(event)
        if event["event"] == "step":
            status = event["status"]
            if line is not None:
                self.results.print(line, style=_STYLE.get(status), markup=False)
            if status == Status.RUNNING and self.live is None:
                self._start_live()
        elif line is not None:
            if event["event"] == "done":
                self.close()
                self._summary()
            style = "yellow" if event["event"] != "done" else "bold green" if event["ok"] else "bold red"
            (self.results if is_result(event) else self.console).print(line, style=style, markup=False)

    def _summary(self) -> None:
        """The grouped reasons, a long one wrapped under its own indent."""
        from rich.padding import Padding
        from rich.text import Text

        for line in summary_lines(self.events):
            text = line.lstrip()
            indent = len(line) - len(text)
            self.results.print(Padding(Text(text, style="yellow" if not indent else ""), (0, 0, 0, indent), expand=False))

    def _start_live(self) -> None:
        from rich.live import Live

        self.live = Live(LiveStatus(self.board), console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def make_reporter(json_events: bool, *, results: TextIO | None = None) -> Reporter:
    """The reporter of a command: JSON lines on stdout, else lines on stderr (colored on a
    terminal), the step lines and the summary on ``results`` when given."""
    if json_events:
        return JsonReporter()
    if (results or sys.stderr).isatty():
        return RichReporter(results)
    return PlainReporter(results=results)
