"""TOML documents that remember where each key was written, for error messages.

tomllib gives values without positions, so the lines of table headers and keys are found
by a light scan of the text, made when a problem first asks for a line (a project of 1,000
recipes that loads without one never scans). It is only used to point at a line; a key it
cannot place falls back to the line of its nearest enclosing table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.common import tomlfile
from optbuild.common.errors import Problem, ProjectError
from optbuild.project.parsed import ParsedRecipes

_BARE = r"[A-Za-z0-9_-]+"
_KEY = rf"(?:{_BARE}|\"(?:[^\"\\]|\\.)*\"|'[^']*')"
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?")
_ASSIGN = re.compile(rf"^\s*({_DOTTED})\s*=")
_PART = re.compile(_KEY)


def _split_key(dotted: str) -> tuple[str, ...]:
    return tuple(p.strip("\"'") for p in _PART.findall(dotted))


@dataclass
class TomlDocument:
    path: Path
    data: dict[str, Any]
    text: str = field(default="", repr=False)
    context: str = ""  # for a template: the recipe it was expanded for, named in its problems
    aliases: dict[str, str] = field(default_factory=dict)  # a matrix step's instance -> the step written
    _lines: dict[tuple, int] | None = field(default=None, repr=False)

    @property
    def lines(self) -> dict[tuple, int]:
        """The line of each table and key written in the text (scanned at the first call)."""
        if self._lines is None:
            self._lines = _scan_lines(self.text)
        return self._lines

    def alias(self, instance: str, name: str) -> None:
        """Point the lines of step ``instance`` (a matrix expansion) at those of step ``name``."""
        self.aliases[instance] = name

    def line_of(self, loc: tuple) -> int | None:
        """Line of the key at ``loc`` (a path of keys and list indices), or of its parent."""
        loc = tuple(str(part) for part in loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            name = self.aliases.get(loc[1]) if len(loc) > 1 and loc[0] == "steps" else None
            if name is not None and (written := ("steps", name, *loc[2:])) in self.lines:
                return self.lines[written]
            loc = loc[:-1]
        return None

    def problem(self, loc: tuple, message: str) -> Problem:
        return Problem(
            f"{message} (expanded for {self.context})" if self.context else message,
            file=self.path,
            line=self.line_of(loc),
            field=".".join(str(p) for p in loc) or None,
        )


def _set_with_parents(lines: dict[tuple, int], key: tuple[str, ...], number: int) -> None:
    """``key`` and each table above it, unless placed already: the first line that names a
    table (``[steps.a]`` names ``steps``) is where a problem with that table shows."""
    for end in range(1, len(key) + 1):
        lines.setdefault(key[:end], number)


def _scan_lines(text: str) -> dict[tuple, int]:
    lines: dict[tuple, int] = {}
    table: tuple[str, ...] = ()
    array_counts: dict[tuple, int] = {}
    in_multiline: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        if header := _HEADER.match(line):
            table = _split_key(header.group(2))
            if header.group(1) == "[[":
                index = array_counts.get(table, 0)
                array_counts[table] = index + 1
                _set_with_parents(lines, table, number)
                table = (*table, str(index))
            _set_with_parents(lines, table, number)
        elif assign := _ASSIGN.match(line):
            _set_with_parents(lines, (*table, *_split_key(assign.group(1))), number)
            rest = line[assign.end():]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_multiline = quote
    return lines


def load_toml(path: Path, parsed: ParsedRecipes | None = None) -> TomlDocument:
    """Parse ``path`` (taken from ``parsed`` when its text was parsed last run); a syntax
    error or unreadable file raises ProjectError with its line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProjectError([Problem("file not found", file=path)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProjectError([Problem(f"cannot read: {exc}", file=path)]) from None
    try:
        data = parsed.loads(text, path) if parsed is not None else tomlfile.loads(text, path)
    except tomlfile.TomlError as exc:
        raise ProjectError([Problem(f"invalid TOML: {exc}", file=path, line=exc.line)]) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ProjectError([Problem("invalid TOML: arrays or inline tables nested too deeply",
                                    file=path, line=_deepest_line(text))]) from None
    return TomlDocument(path, data, text)


def _deepest_line(text: str) -> int:
    """The line where brackets and braces nest deepest (strings ignored: only a hint)."""
    depth = deepest = 0
    line = where = 1
    for char in text:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest, where = depth, line
        elif char in "]}":
            depth -= 1
        elif char == "\n":
            line += 1
    return where
