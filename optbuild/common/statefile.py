"""optbuild's own memory under ``<build folder>/.optbuild/`` (the decision memo, the parsed
recipes): JSON read only as a hint, never through a link, and written whole, never outside the
build folder. Losing one costs speed, never correctness, so neither reading nor writing raises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optbuild.common.atomic import write_atomic
from optbuild.common.errors import OptbuildError
from optbuild.common.paths import confined


def read_state(path: Path, **expected: object) -> dict[str, Any] | None:
    """The JSON object at ``path`` when each ``expected`` field holds its value; None when it
    is absent, damaged or another's, or its folder is a link (what the build folder holds, not
    what a link points at)."""
    try:
        if path.parent.is_symlink():
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or any(doc.get(name) != value for name, value in expected.items()):
        return None
    return doc


def write_state(path: Path, build_dir: Path, doc: dict[str, Any], what: str) -> None:
    """Write ``doc`` to ``path`` atomically, proven inside ``build_dir`` and never through a
    linked folder; best effort (a failure is silent: the next run decides in full)."""
    try:
        real = confined(path, build_dir, what)
        if path.parent.is_symlink():
            return
        write_atomic(real, json.dumps(doc, separators=(",", ":"), default=str).encode())
    except (OSError, ValueError, OptbuildError):
        pass
