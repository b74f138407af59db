"""The one module that parses TOML: a file read with a size bound, or text, and the parse
error with its file and line; and optbuild.toml's tables as written, for the light readers
that must not load the project (the build server's [build], diff's lock file, completion).

Standard library only, and imported by those readers only when they read: the no-op fast
path, which reads no TOML, never imports it.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from optbuild.common.projectroot import CONFIG_NAME

MAX_BYTES = 16 << 20  # a project's TOML file is a few KiB; a bigger one is no recipe
_LINE = re.compile(r"at line (\d+)")


class TomlError(ValueError):
    """Invalid TOML (or a file too large to be a recipe): tomllib's words, the file, the line."""

    def __init__(self, message: str, file: Path | None = None, line: int | None = None):
        super().__init__(message)
        self.file, self.line = file, line


def loads(text: str, file: Path | None = None) -> dict[str, Any]:
    """Parse ``text`` (read from ``file``, when named, for the error). TomlError on invalid
    TOML; RecursionError on arrays or inline tables nested deeper than the parser goes."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _LINE.search(str(exc))
        raise TomlError(str(exc), file, int(match.group(1)) if match else None) from None


def load(path: Path, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """Parse the file ``path``: OSError (or UnicodeDecodeError) when it cannot be read,
    TomlError when it is invalid or larger than ``max_bytes``."""
    with open(path, "rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TomlError(f"larger than {max_bytes >> 20} MiB: not a project's TOML file", path)
    return loads(data.decode("utf-8"), path)


def config_tables(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The optbuild.toml of the project at ``root`` as written there, unvalidated; None when it
    cannot be read or parsed (loading the project says why, naming file and line)."""
    try:
        return load(Path(root) / CONFIG_NAME)
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None


def config_table(root: str | os.PathLike[str], name: str) -> dict[str, Any] | None:
    """Table ``[name]`` of the project's optbuild.toml as written ({} when absent or not a
    table); None when the file cannot be read or parsed."""
    tables = config_tables(root)
    if tables is None:
        return None
    table = tables.get(name, {})
    return table if isinstance(table, dict) else {}
