"""A JSON file a user hands optbuild, read with bounds.

A path on the command line can name anything: a FIFO that never ends (opening it would wait
for a writer), ``/dev/zero`` (reading it fills the memory), or a small file nested so deeply
that the parser's recursion overflows. Each is one ValueError that says what is wrong.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from optbuild.common.units import human_size

MAX_BYTES = 4 << 20
MAX_DEPTH = 64


def read_json(path: Path, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value in the regular file ``path`` (symlinks to one followed); ValueError
    when it is not a regular file, larger than ``max_bytes``, not JSON, or nested deeper than
    MAX_DEPTH; OSError when it cannot be opened."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer; the mode is checked before reading
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {human_size(max_bytes)}")
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"{path} is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"{path} is nested deeper than {MAX_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest
