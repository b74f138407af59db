"""Optimization profiles: how a recipe writes them, and which one takes given input shapes.

Pure Python, so a consumer can check its samples against an engine's manifest
(``engine.json``) before it touches a GPU, and the runner can pick the profile to activate
with the same rule. An error names the input, its shape and the profile's bounds.

A recipe's ``profiles`` nests three levels (list of profiles, input name, min / opt / max),
and a level left out makes pydantic say only "Input should be a valid dictionary or
instance of ShapeRange": ``form_problem`` says which level is missing and shows the
recipe's own value rewritten in the expected form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple


class Bounds(NamedTuple):
    """min / opt / max shape of one input in one profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def holds(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for d, lo, hi in zip(shape, self.min, self.max))

    def describe(self) -> str:
        return f"min {list(self.min)}, max {list(self.max)}"


# Input name -> its declared shape (-1: dynamic); a profile: input name -> Bounds.
Inputs = Mapping[str, Sequence[int]]
Profile = Mapping[str, Bounds]


class ShapeMismatch(ValueError):
    """Input shapes that no profile of the engine takes (the message says which and why)."""


def from_manifest(manifest: Mapping[str, Any]) -> tuple[dict[str, tuple[int, ...]], list[dict[str, Bounds]]]:
    """(inputs, profiles) of an engine step's ``engine.json``."""
    inputs = {entry["name"]: tuple(entry["shape"]) for entry in manifest.get("inputs", [])}
    profiles = [{name: Bounds(tuple(rng["min"]), tuple(rng["opt"]), tuple(rng["max"]))
                 for name, rng in profile.items()} for profile in manifest.get("profiles", [])]
    return inputs, profiles


def _declared(shape: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def choose_profile(inputs: Inputs, profiles: Sequence[Profile], shapes: Mapping[str, Sequence[int]]) -> int:
    """Index of the first profile that takes ``shapes`` (input name -> shape); 0 for an
    engine without profiles. ShapeMismatch when the ranks or fixed dimensions differ from
    ``inputs``, or when no profile's min / max bounds hold every shape."""
    for name, declared in inputs.items():
        shape = tuple(shapes[name])
        if len(shape) != len(declared) or any(0 <= d != s for d, s in zip(declared, shape)):
            raise ShapeMismatch(f"input {name!r} has shape {list(shape)}; the engine takes "
                                f"{_declared(declared)}")
    misses = []
    for index, profile in enumerate(profiles):
        outside = [(name, bounds) for name, bounds in profile.items()
                   if name in shapes and not bounds.holds(tuple(shapes[name]))]
        if not outside:
            return index
        name, bounds = outside[0]
        misses.append((index, name, bounds))
    if not misses:
        return 0
    if len(misses) == 1:
        _, name, bounds = misses[0]
        raise ShapeMismatch(f"input {name!r} has shape {list(shapes[name])}, outside the engine's "
                            f"optimization profile ({bounds.describe()})")
    listed = "; ".join(f"profile {i}: input {name!r} has shape {list(shapes[name])}, outside "
                       f"{bounds.describe()}" for i, name, bounds in misses)
    raise ShapeMismatch(f"the input shapes fit none of the engine's {len(misses)} optimization "
                        f"profiles: {listed}")


# --- the recipe's form ------------------------------------------------------------------------
EXAMPLE = [{"image": {"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224], "max": [32, 3, 224, 224]}}]
FORM = ("a list of tables, one per optimization profile, each mapping an input name to its "
        "min, opt and max shapes")
_BOUNDS = ("min", "opt", "max")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_PLACEHOLDER = "INPUT_NAME"  # the input's name, where the recipe does not give it


def _a(value: Any) -> str:
    """What a TOML value is, in words."""
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
             list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def toml_value(value: Any) -> str:
    """``value`` written as a TOML inline value (``...`` for a shape still to fill in)."""
    if value is Ellipsis:
        return "[...]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{k if _BARE_KEY.fullmatch(k) else json.dumps(k)} = {toml_value(v)}"
                          for k, v in value.items())
        return "{ " + items + " }"
    return repr(value)


def _bounds(value: Any) -> dict[str, Any] | None:
    """min / opt / max from what a recipe gave for one input: the table, or one shape for all
    three; None when neither."""
    if isinstance(value, list):
        return dict.fromkeys(_BOUNDS, value)
    if isinstance(value, dict):
        return {bound: value.get(bound, ...) for bound in _BOUNDS}
    return None


def _rewrite(profile: dict[str, Any]) -> dict[str, Any] | None:
    """One profile in the expected form, from a recipe's near miss; None when it is no near miss."""
    if any(bound in profile for bound in _BOUNDS):  # min / opt / max with no input name above them
        name = next((profile[key] for key in ("input", "name") if isinstance(profile.get(key), str)),
                    _PLACEHOLDER)
        profile = {name: {bound: profile[bound] for bound in _BOUNDS if bound in profile}}
    rewritten = {name: _bounds(value) for name, value in profile.items()}
    return None if None in rewritten.values() else rewritten


def _first_miss(value: Any) -> str | None:
    """What is wrong with the form of a recipe's ``profiles``, first thing first; None: nothing."""
    if isinstance(value, dict):
        return "profiles is one table, not a list of them"
    if not isinstance(value, list):
        return f"profiles is {_a(value)}"
    for index, profile in enumerate(value):
        if not isinstance(profile, dict):
            return f"profile {index} is {_a(profile)}, not a table"
        if given := [bound for bound in _BOUNDS if bound in profile]:
            return (f"profile {index} has {' / '.join(given)} at its top level: they go in a table "
                    f"named after the input")
        for name, shapes in profile.items():
            if isinstance(shapes, list):
                return (f"input {name!r} of profile {index} has one shape, not min, opt and max "
                        f"(the same three make a fixed shape)")
            if not isinstance(shapes, dict):
                return f"input {name!r} of profile {index} is {_a(shapes)}, not a table of min, opt and max"
    return None


def form_problem(value: Any) -> str | None:
    """A message saying how ``value``, a recipe's ``profiles``, misses the expected form, with
    the value rewritten in that form where it can be (else an example); None when it has the
    form (its shapes are checked elsewhere)."""
    miss = _first_miss(value)
    if miss is None:
        return None
    profiles = value if isinstance(value, list) else [value]
    rewritten = [_rewrite(p) if isinstance(p, dict) else None for p in profiles]
    if None in rewritten:
        return f"{miss}; expected {FORM}, e.g. profiles = {toml_value(EXAMPLE)}"
    return f"{miss}; write profiles = {toml_value(rewritten)} ({FORM})"
