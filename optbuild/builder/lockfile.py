"""optbuild.lock: per step, the key, outputs, tools, host facts and metrics of its last build.

It is the provenance record a deploy can be audited against, and the "last build" that
`plan` compares with to say why a step must rebuild. Written atomically and merged under
a lock, so concurrent builds of different targets do not drop each other's records.

A damaged lock file is never silently replaced: it is reported, and moved aside (kept as
``optbuild.lock.damaged-<time>``) before a new one is written, so its records can be
recovered by hand.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.common import processstate
from optbuild.common.atomic import write_atomic
from optbuild.common.flock import locked

FORMAT = 1
MAX_METRICS = 64  # per step record
MAX_METRIC_TEXT = 200  # characters of a metric's name or string value
MAX_METRIC_LIST = 16  # items of a list-valued metric
_SKIP = object()
log = logging.getLogger(__name__)
_warned: set[Path] = processstate.fresh_set()  # damaged lock files already reported
_last_parsed: dict[Path, tuple[bytes, dict[str, dict[str, Any]]]] = processstate.fresh_dict()  # ``load``'s last file: its bytes, records


@dataclass
class LockState:
    """What a lock file holds; ``damage`` says why it could not be read (None: read, or absent)."""

    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    damage: str | None = None


def load(path: Path) -> LockState:
    """The lock file's records, telling an absent file (no records) from a damaged one.
    Bytes this process parsed last time are not parsed again (a build reads the file at its
    start and again under the lock to merge: 0.15 s each at 10,000 steps)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return LockState()
    except OSError as exc:
        return LockState(damage=f"cannot read it: {exc.strerror}")
    last = _last_parsed.get(path)
    if last is not None and last[0] == text:
        return LockState(dict(last[1]))
    state = parse(text)
    if state.damage is None:
        _last_parsed.clear()  # one file's: a build reads one lock file
        _last_parsed[path] = (text, dict(state.steps))
    return state


def parse(text: bytes) -> LockState:
    """A lock file's records from its bytes (read from disk, or from a git revision)."""
    try:
        data = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError included
        return LockState(damage=f"not valid JSON: {exc}")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return LockState(damage=f"not an optbuild lock file of format {FORMAT}")
    steps = data.get("steps")
    if not isinstance(steps, dict) or not all(isinstance(r, dict) for r in steps.values()):
        return LockState(damage="its steps are not records")
    return LockState(steps)


def record_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The part of a step's metrics a lock record keeps, so that ``optbuild diff`` can show
    figures that changed (verify's, bench latencies) while the lock file stays small: JSON
    scalars (a short string, a number, a bool, null) and short lists of them, at most
    MAX_METRICS. A non-finite float is kept as its text ("nan"), which JSON can hold."""
    kept: dict[str, Any] = {}
    for name in sorted(metrics):
        if len(kept) >= MAX_METRICS:
            break
        value = _metric_value(metrics[name])
        if isinstance(name, str) and len(name) <= MAX_METRIC_TEXT and value is not _SKIP:
            kept[name] = value
    return kept


def _metric_value(value: Any) -> Any:
    if isinstance(value, list):
        if len(value) > MAX_METRIC_LIST:
            return _SKIP
        items = [_metric_value(v) for v in value]
        return _SKIP if any(v is _SKIP or isinstance(v, list) for v in items) else items
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str) and len(value) <= MAX_METRIC_TEXT:
        return value
    return _SKIP


def read(path: Path) -> dict[str, dict[str, Any]]:
    """The step records of the lock file; none when it is absent or damaged (said once)."""
    state = load(path)
    if state.damage is not None and path not in _warned:
        _warned.add(path)
        log.warning("%s is damaged (%s); its records are ignored, and it will be kept as "
                    "%s.damaged-<time> when a new one is written", path, state.damage, path.name)
    return state.steps


def _move_aside(path: Path) -> Path:
    """Rename a damaged lock file to a name no other damaged copy has; returns the new path."""
    stem = f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    aside, n = path.with_name(stem), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{stem}-{n}")
    os.rename(path, aside)
    return aside


def update(path: Path, records: dict[str, dict[str, Any]], lock_path: Path) -> bool:
    """Merge ``records`` into the lock file under ``lock_path``; returns whether it changed."""
    with locked(lock_path):
        state = load(path)
        if state.damage is not None:
            log.warning("moved the damaged %s (%s) to %s", path, state.damage, _move_aside(path))
        steps = state.steps
        merged = {**steps, **records}
        if merged == steps and path.exists():
            return False
        last = _last_parsed.get(path)
        kept = _record_lines(last[0].decode(), steps) if last is not None and state.damage is None else {}
        write_atomic(path, render(merged, {sid: line for sid, line in kept.items() if merged[sid] == steps[sid]}).encode())
        return True


def render(steps: dict[str, dict[str, Any]], kept: dict[str, str] | None = None) -> str:
    """The lock file's text: one step's record per line, in step order, so that a change to one
    step is a one-line diff. (Each line is encoded by json's C encoder; an indented dump goes
    through its pure-Python one, 1.2 s for 10,000 steps.) ``kept``: lines of the file before,
    of records that did not change, written again as they were (one edit at 10,000 steps
    encodes one line, not 10,000)."""
    kept = kept or {}
    lines = [kept.get(sid) or f"{json.dumps(sid)}: {json.dumps(steps[sid], sort_keys=True)}" for sid in sorted(steps)]
    body = "\n" + ",\n".join(lines) + "\n" if lines else ""
    return f'{{"format": {FORMAT}, "steps": {{{body}}}}}\n'


def _record_lines(text: str, steps: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Step id -> its line in ``text``, the lock file that ``steps`` were parsed from, when
    ``render`` laid it out (one record a line, in step order); else none."""
    lines = text.split("\n")
    if len(lines) != len(steps) + 3 or lines[-2:] != ["}}", ""]:
        return {}
    found = {}
    for line, sid in zip(lines[1:-2], sorted(steps), strict=True):
        record = line.removesuffix(",")
        if not record.startswith(f"{json.dumps(sid)}: {{"):
            return {}
        found[sid] = record
    return found
