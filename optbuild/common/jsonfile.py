"""A JSON file a user hands optbuild, read with bounds.

A path on the command line can name anything: a FIFO that never ends (opening it would wait
for a writer), ``/dev/zero`` (reading it fills the memory), or a small file nested so deeply
that the parser's recursion overflows. Each is one ValueError that says what is wrong.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from optbuild.common.units import human_size

MAX_BYTES = 4 << 20
MAX_DEPTH = 64

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def nests_deeper(data: bytes, max_depth: int) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects deeper than ``max_depth``,
    found by scanning its brackets (strings aside) before any parser sees it: a hostile
    100,000 '[' would otherwise raise RecursionError inside json.loads."""
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub(b'""', data)):
        if bracket.group() in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


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
    if nests_deeper(data, MAX_DEPTH):
        raise ValueError(f"{path} is nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
