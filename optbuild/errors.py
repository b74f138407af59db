"""Errors that reach the user as a message, never as a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class OptbuildError(Exception):
    """Base of every error the CLI prints as a plain message with a non-zero exit."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none): libraries'
    multi-line errors, tracebacks included, shortened for a one-line message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the project, located as precisely as we can."""

    message: str
    file: Path | None = None
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = str(self.file)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class ProjectError(OptbuildError):
    """The project does not validate; nothing is built. Holds every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class StepError(OptbuildError):
    """A step failed for a reason it can explain (bad model, bad data, tool error)."""


class StepUnavailable(OptbuildError):
    """A step cannot run on this host; the message names what it needs."""


class CacheError(OptbuildError):
    """The cache is unusable (not a corrupt entry: those are misses)."""
