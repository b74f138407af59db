"""Which optimization profile of an engine takes a given set of input shapes.

Pure Python, so a consumer can check its samples against an engine's manifest
(``engine.json``) before it touches a GPU, and the runner can pick the profile to activate
with the same rule. An error names the input, its shape and the profile's bounds.
"""

from __future__ import annotations

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
