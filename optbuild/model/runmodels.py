"""Opening and running the models of a check (verify, benchmark, select) where a native crash
cannot end the step: each on the backend that runs its artifact, at an optimization level
(``Backend.levels``: onnxruntime's graph optimization levels) lowered past the one that
crashed it (optbuild.model.isolation).

onnxruntime crashed (SIGSEGV) on a float16 ViT at "all", its default, and ran it at a lower
level (issue 24): a model at onnxruntime's default is tried at the next level down, and the
report says so, since a server must open it at that level too. A level an engine step fixed
is kept. Reports name a compared model by file and content digest (``model_entry``).
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from optbuild.backends.base import Backend, Manifest, Runner
from optbuild.common.errors import StepError, StepUnavailable, first_line
from optbuild.model.isolation import ChildDied, Crash, Crashed, Stage, run_isolated

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


def entered_runner(stack: contextlib.ExitStack, side: tuple[Backend, Manifest], path: Path,
                   host: Fingerprint, what: str, *, threads: int | None = None, level: str | None = None) -> Runner:
    """The runner of the artifact ``path`` (``what``, as messages name it) on its backend,
    entered on ``stack``; StepError saying why when this host cannot run it or it does not
    load. ``level``: onnxruntime's graph optimization level (``start_level``, ``run_models``;
    None for another backend). Verify, benchmark and select open what they run this way."""
    backend, manifest = side
    if (why := backend.unavailable(host, manifest)) is not None:
        raise StepError(f"{what} cannot run on this host: {why}")
    try:
        runner = backend.open(path, manifest, host, threads=threads)
        if level is not None:  # an onnxruntime runner (OrtRunner), not yet entered: it opens at it
            typing.cast(Any, runner).level = level
        return stack.enter_context(runner)
    except StepUnavailable as exc:
        raise StepError(f"{what} cannot run on this host: {exc}") from None
    except StepError:
        raise
    except Exception as exc:
        raise StepError(f"{backend.label} cannot load {what}: {first_line(exc)}") from None


def model_entry(path: Path) -> dict[str, str]:
    """A compared model as the report names it: file name and content digest (what the key
    holds), never the step that made it."""
    from optbuild.common.digest import ALGORITHM, hash_file

    return {"file": path.name, "digest": f"{ALGORITHM}:{hash_file(path)[0]}"}


R = typing.TypeVar("R")


class ModelsCrashed(StepError):
    """The models crashed where no lower level is left to try: ``side`` is the one that crashed
    last (None: while no model loaded or ran)."""

    def __init__(self, message: str, side: Any):
        super().__init__(message)
        self.side = side


def start_level(side: tuple[Backend, Manifest]) -> str | None:
    """The optimization level a model opens at on a backend that has levels (onnxruntime's
    graph optimization levels): the one its engine step optimized it at (engine.json's
    ``level``: kept, never lowered), else the backend's default; None for a backend without."""
    backend, manifest = side
    if not backend.levels:
        return None
    return str(manifest.get("level") or backend.levels[0])


def lowered(side: tuple[Backend, Manifest], level: str | None) -> str | None:
    """The level to try ``side`` at after it crashed at ``level``: the next one down, for a
    model that its engine step did not fix a level for; None otherwise."""
    levels = side[0].levels
    if start_level(side) is None or side[1].get("level") or level not in levels[:-1]:
        return None
    return levels[levels.index(level) + 1]


def at_level(label: str, level: str | None) -> str:
    """A runtime's label for reports, with onnxruntime's level where it has one."""
    return f"{label}, optimization level {level}" if level is not None else label


def run_models(work: Callable[[dict[Any, str | None], Stage], R], sides: Mapping[Any, tuple[Backend, Manifest]],
               names: Mapping[Any, str], what: str) -> tuple[R, dict[Any, str | None], list[str]]:
    """``work(levels, stage)`` run in a forked child (optbuild.model.isolation): ``levels`` the
    level each of ``sides`` opens at (``start_level``), ``stage`` what it does next, as (side,
    "loading" or "running") while a model loads or runs. When the child dies of a native crash
    while an onnxruntime side loaded or ran at its default level or one below, ``work`` runs
    again with that side one level lower (``lowered``), down to "disable"; any other failure is
    not retried: its exception as it was, a crash as a StepError. The value, the levels it ran
    at, and for each side that crashed a note of the levels that crashed and the one that ran
    (a server must open it at that one too). ``names``: each side as messages name it ("the
    candidate r:fp16"); ``what``: the step's kind."""
    def retry(crash: Crash[dict[Any, str | None]]) -> dict[Any, str | None] | None:
        key = crash.stage[0] if isinstance(crash.stage, tuple) else None
        if key not in sides or (lower := lowered(sides[key], crash.attempt[key])) is None:
            return None
        return {**crash.attempt, key: lower}

    first = {key: start_level(side) for key, side in sides.items()}
    try:
        outcome = run_isolated(work, first, retry=retry, what=f"{what}'s process that runs the models")
    except Crashed as exc:
        last = exc.crashes[-1].stage
        side = last[0] if isinstance(last, tuple) and last[0] in sides else None
        raise ModelsCrashed(_crash_message(exc.crashes, sides, names, what), side) from None
    except ChildDied as exc:
        raise StepError(str(exc)) from None
    notes = []
    for key in dict.fromkeys(c.stage[0] for c in outcome.crashes):
        ran = outcome.attempt[key]
        assert ran is not None  # a side that crashed ran again at a lowered level (``lowered``), a named one
        backend = sides[key][0]
        notes.append(f"{names[key]} crashed {backend.label} at {_crashes(outcome.crashes, key)}, and ran at level "
                     f"{ran}: a server must open it at that level too ({backend.level_setting(ran)})")
    return outcome.value, outcome.attempt, notes


def _crashes(crashes: list[Crash[dict[Any, str | None]]], key: Any) -> str:
    """The levels ``key`` crashed at: "level all (SIGSEGV while loading it)"."""
    mine = [c for c in crashes if isinstance(c.stage, tuple) and c.stage[0] == key]
    said = [f"{c.attempt[key]} ({c.signal} while {c.stage[1]} it)" for c in mine]
    return ("level " if len(said) == 1 else "levels ") + ", ".join(said)


def _crash_message(crashes: list[Crash[dict[Any, str | None]]], sides: Mapping[Any, tuple[Backend, Manifest]],
                   names: Mapping[Any, str], what: str) -> str:
    """Why the models could not run: the last crash, and the levels tried before it."""
    last = crashes[-1]
    key = last.stage[0] if isinstance(last.stage, tuple) else None
    stack = "the log holds the Python stack where it happened"
    if key not in sides:
        doing = f" while {last.stage}" if last.stage is not None else ""
        message = f"{what}'s process that runs the models crashed ({last.signal}){doing}: a crash inside a native library"
    elif (levels := sides[key][0].levels) and lowered(sides[key], levels[0]) is not None:  # went down them all
        message = f"{names[key]} crashed {sides[key][0].label} at every graph optimization level: {_crashes(crashes, key)}"
        stack = "the log holds the Python stack of each crash"
    else:
        backend = sides[key][0]
        level = last.attempt[key]
        message = f"{names[key]} crashed {backend.label} ({last.signal} while {last.stage[1]} it)"
        if level is not None:
            message += (f" at graph optimization level {level}, the one its engine step optimized it at, which it "
                        "keeps: a lower level on that step (level = \"basic\") may run it")
        else:
            message += ": a crash inside a native library"
    if others := [c for c in crashes if c is not last and (not isinstance(c.stage, tuple) or c.stage[0] != key)]:
        message += "; before that, " + "; ".join(f"{names[k]} crashed at {_crashes(others, k)}"
                                                 for k in dict.fromkeys(c.stage[0] for c in others))
    return f"{message} ({stack})"
