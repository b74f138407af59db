"""Parameter overrides for one run, without editing a file: ``-S RECIPE:STEP.PARAM=VALUE``.

``optbuild build -S cnn:quantize_int8.per_channel=false`` (also ``plan``) sets the parameter
as if the recipe said so: the value is read as a TOML value (``false``, ``18``, ``"a b"``,
``[1, 2]``), or else taken as a plain string (``-S cnn:simplify.backend=onnxslim``); a dotted
PARAM reaches into a table (``extra_options.ActivationSymmetric=true``); a matrix step's
name sets the parameter in all its instances, an instance's name in that one. The result
is validated like the recipe, and a problem it causes says which ``-S`` caused it. A step's
overrides are recorded in optbuild.lock with its build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optbuild.common import tomlfile
from optbuild.common.errors import Problem, ProjectError
from optbuild.project import matrix

FORM = "RECIPE:STEP.PARAM=VALUE"


@dataclass(frozen=True)
class Override:
    text: str  # as given on the command line
    recipe: str
    step: str
    path: tuple[str, ...]
    value: Any

    @property
    def param(self) -> str:
        return ".".join(self.path)


def parse_override(text: str) -> Override:
    """``text`` as an Override; ProjectError saying what is wrong with it."""
    target, equals, raw = text.partition("=")
    recipe, colon, rest = target.partition(":")
    if "]" in rest:  # an instance name, whose values may hold dots: step[0.5,int8].param
        step, _, param = rest.partition("]")
        step, param = step + "]", param.removeprefix(".")
    else:
        step, _, param = rest.partition(".")
    path = tuple(param.split(".")) if param else ()
    if not (equals and colon and recipe and step and path and all(path)):
        raise ProjectError([Problem(f"-S {text}: expected {FORM}, e.g. -S cnn:quantize.per_channel=false")])
    return Override(text, recipe, step, path, _value(raw))


def _value(raw: str) -> Any:
    try:
        return tomlfile.loads(f"v = {raw}")["v"]
    except tomlfile.TomlError:
        return raw


def apply_overrides(overrides: list[Override], recipe: str, steps: dict[str, Any],
          problems: list[Problem]) -> dict[str, list[Override]]:
    """Set the overrides meant for ``recipe`` in its (matrix-expanded) ``steps`` table; by
    step name, the overrides each step got."""
    applied: dict[str, list[Override]] = {}
    for override in (o for o in overrides if o.recipe == recipe):
        names = [n for n in steps if n == override.step or ("[" in n and matrix.base_name(n) == override.step)]
        if not names:
            problems.append(Problem(f"-S {override.text}: no step {override.step!r} in recipe {recipe!r}"))
        for name in names:
            if not isinstance(steps[name], dict):
                continue  # reported as the recipe's own problem
            try:
                steps[name] = _set(steps[name], override.path, override.value)
            except TypeError as exc:
                problems.append(Problem(f"-S {override.text}: {exc}"))
                continue
            applied.setdefault(name, []).append(override)
    return applied


def _set(table: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``table`` with ``value`` at ``path`` (the recipe's own data is left alone)."""
    head, rest = path[0], path[1:]
    if not rest:
        return {**table, head: value}
    inner = table.get(head, {})
    if not isinstance(inner, dict):
        raise TypeError(f"{head!r} is not a table, so it has no {'.'.join(rest)!r}")
    return {**table, head: _set(inner, rest, value)}


def blame_overrides(problems: list[Problem], step: str, overrides: list[Override]) -> list[Problem]:
    """``problems`` (found in ``step``) with those at an overridden parameter saying so."""
    fields = {f"steps.{step}.{o.param}": o for o in overrides}
    blamed = []
    for problem in problems:
        override = next((o for f, o in fields.items()
                         if problem.field and (problem.field == f or problem.field.startswith(f + "."))), None)
        blamed.append(problem if override is None else
                      Problem(f"{problem.message} (set by -S {override.text})", file=problem.file,
                              line=problem.line, field=problem.field))
    return blamed


def unknown_override_recipes(overrides: list[Override], recipes: set[str]) -> list[Problem]:
    return [Problem(f"-S {o.text}: no recipe {o.recipe!r} (recipes: {', '.join(sorted(recipes))})")
            for o in overrides if o.recipe not in recipes]
