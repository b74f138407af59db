"""optbuild.lock: per step, the key, outputs, tools and host facts of its last build.

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
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.atomic import write_atomic
from optbuild.store.flock import locked

FORMAT = 1
log = logging.getLogger(__name__)
_warned: set[Path] = set()


@dataclass
class LockState:
    """What a lock file holds; ``damage`` says why it could not be read (None: read, or absent)."""

    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    damage: str | None = None


def load(path: Path) -> LockState:
    """The lock file's records, telling an absent file (no records) from a damaged one."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return LockState()
    except OSError as exc:
        return LockState(damage=f"cannot read it: {exc.strerror}")
    except ValueError as exc:  # UnicodeDecodeError included
        return LockState(damage=f"not valid JSON: {exc}")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return LockState(damage=f"not an optbuild lock file of format {FORMAT}")
    steps = data.get("steps")
    if not isinstance(steps, dict) or not all(isinstance(r, dict) for r in steps.values()):
        return LockState(damage="its steps are not records")
    return LockState(steps)


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
    with locked(lock_path, mode=0o666):
        state = load(path)
        if state.damage is not None:
            log.warning("moved the damaged %s (%s) to %s", path, state.damage, _move_aside(path))
        steps = state.steps
        merged = {**steps, **records}
        if merged == steps and path.exists():
            return False
        text = json.dumps({"format": FORMAT, "steps": dict(sorted(merged.items()))}, indent=1,
                          sort_keys=True) + "\n"
        write_atomic(path, text.encode())
        return True
