"""What ``runstep`` and a step's process (``optbuild.process.child``) tell each other.

``runstep`` writes a ``ChildSpec`` as ``spec.json`` in the step's scratch folder; the
child runs the step and writes a ``ChildResult`` where the spec says. Both are plain
dataclasses with ``to_json`` / ``from_json``: the child must start fast, so this module
imports only the standard library.

The result comes from another process, which may have crashed half-way or been broken by
the step it ran: ``ChildResult.from_json`` checks every field and raises
``ChildResultError`` saying what is wrong, which ``runstep`` turns into a step failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any


class ChildResultError(ValueError):
    """A result file that is not a step's result; the message says why."""


@dataclass(frozen=True)
class ArtifactSpec:
    """An upstream step's outputs, as the step sees them (paths as strings)."""

    step: str
    dir: str
    files: dict[str, str]
    primary: str | None = None

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ArtifactSpec:
        return cls(step=doc["step"], dir=doc["dir"], files=dict(doc["files"]), primary=doc.get("primary"))


@dataclass(frozen=True)
class ChildSpec:
    """One step to run: which kind, its parameters, its inputs and where to write."""

    implementation: str  # the step kind's class: "module:Class" or "/path/file.py:Class"
    step_id: str
    params: dict[str, Any]  # the step's validated parameters, as JSON
    base_dir: str  # the recipe's folder: relative parameters are read from there
    project_root: str
    inputs: dict[str, ArtifactSpec]  # by the parameter that names the upstream step
    out_dir: str
    result: str  # where the child writes its ChildResult
    parent_pid: int  # its runner: the child dies with it
    state_dir: str | None = None  # kept across builds (calibration data caches, say)
    # inputs whose steps did not succeed: field -> {"step", "why"}
    missing: dict[str, dict[str, str]] = field(default_factory=dict)
    progress: str | None = None  # the file the step replaces with what it is doing now

    def to_json(self) -> str:
        doc = _shallow(self)
        doc["inputs"] = {name: _shallow(a) for name, a in self.inputs.items()}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes) -> ChildSpec:
        doc = json.loads(text)
        inputs = {name: ArtifactSpec.from_dict(a) for name, a in doc.pop("inputs").items()}
        return cls(inputs=inputs, **doc)


@dataclass(frozen=True)
class ChildResult:
    """How the step went. ``expected``: a failure the step explained (its message says it
    all; no log tail on the console). ``repeats``: the same inputs would fail the same way,
    so the failure may be remembered by key."""

    ok: bool
    error: str | None = None
    expected: bool = False
    repeats: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    run_s: float | None = None
    imported: list[str] = field(default_factory=list)  # heavy tools it imported itself (steps.base.PRELOADABLE)

    def to_json(self) -> str:
        """Metrics that JSON cannot hold are written as their str()."""
        return json.dumps(_shallow(self), default=str)

    @classmethod
    def from_json(cls, text: str | bytes) -> ChildResult:
        """The result in ``text``; ChildResultError if it is not one (not JSON, not an
        object, a field missing, unknown or of the wrong type)."""
        try:  # the padding of the file's reserved space stripped first: json scans it slowly
            doc = json.loads(text.rstrip())
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise ChildResultError(f"it is not JSON ({_first_line(exc)})") from None
        if not isinstance(doc, dict):
            raise ChildResultError(f"it is a JSON {type(doc).__name__}, not an object")
        unknown = sorted(set(doc) - _RESULT_FIELDS)
        if unknown:
            raise ChildResultError(f"unknown field {unknown[0]!r}")
        if not isinstance(doc.get("ok"), bool):
            raise ChildResultError("its 'ok' is missing or not true/false")
        for name, (types, what) in _RESULT_TYPES.items():
            value = doc.get(name)
            if value is not None and (not isinstance(value, types) or (what == "a number" and isinstance(value, bool))):
                raise ChildResultError(f"its {name!r} is not {what} but {_short(value)}")
        doc["metrics"] = doc.get("metrics") or {}
        doc["expected"] = bool(doc.get("expected"))
        doc["repeats"] = bool(doc.get("repeats"))
        doc["imported"] = doc.get("imported") or []
        if not all(isinstance(name, str) for name in doc["imported"]):
            raise ChildResultError("its 'imported' holds something other than module names")
        return cls(**doc)


_RESULT_FIELDS = {"ok", "error", "expected", "repeats", "metrics", "run_s", "imported"}
_RESULT_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "error": (str, "text"), "expected": (bool, "true or false"), "repeats": (bool, "true or false"),
    "metrics": (dict, "an object"), "run_s": ((int, float), "a number"), "imported": (list, "a list")}


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shallow(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values as they are (``asdict`` deep-copies them, and
    a step's metrics need not be copyable)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
