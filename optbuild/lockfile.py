"""optbuild.lock: per step, the key, outputs, tools and host facts of its last build.

It is the provenance record a deploy can be audited against, and the "last build" that
`plan` compares with to say why a step must rebuild. Written atomically and merged under
a lock, so concurrent builds of different targets do not drop each other's records.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optbuild.atomic import write_atomic

FORMAT = 1


def read(path: Path) -> dict[str, dict[str, Any]]:
    """The step records of the lock file; an absent or unreadable lock is empty."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    steps = data.get("steps") if isinstance(data, dict) else None
    return steps if isinstance(steps, dict) else {}


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def update(path: Path, records: dict[str, dict[str, Any]], lock_path: Path) -> bool:
    """Merge ``records`` into the lock file under ``lock_path``; returns whether it changed."""
    with _locked(lock_path):
        steps = read(path)
        merged = {**steps, **records}
        if merged == steps and path.exists():
            return False
        text = json.dumps({"format": FORMAT, "steps": dict(sorted(merged.items()))}, indent=1,
                          sort_keys=True) + "\n"
        write_atomic(path, text.encode())
        return True
