"""Matrix steps: one ``[steps.NAME]`` table that stands for a step per combination of values.

    [steps.engine]
    kind = "engine"
    backend = "onnxruntime"
    input = "quantize[${matrix.precision}]"
    matrix = { precision = ["fp32", "int8"], threads = [1, 4] }

is four steps, ``engine[fp32,1]``, ``engine[fp32,4]``, ``engine[int8,1]`` and
``engine[int8,4]``: the values in the order the axes are written, combinations in the
order of the values. Every string in the table may hold ``${matrix.AXIS}``; a string that
is exactly one placeholder takes the value with its type (``threads = "${matrix.threads}"``
is the integer 4). An instance is an ordinary step from then on: its own key, folder
(``build/<recipe>/engine[int8,4]/``), line in ``plan``, ``graph`` and ``explain``; other
steps name one instance like any step (``input = "engine[int8,4]"``), and a build target
``recipe:engine`` selects all of them. A problem in an instance names the instance and
points at the line of the matrix step's key.

A value may be a table with a ``name``: the name is the value's token in instance names and
what ``${matrix.AXIS}`` gives, and ``${matrix.AXIS.KEY}`` gives its other keys, so that one
axis carries several parameters that go together:

    [steps.verify]
    kind = "verify"
    candidate = "${matrix.precision.model}"
    max_abs = "${matrix.precision.max_abs}"
    matrix = { precision = [{ name = "fp16", model = "quantize_fp16", max_abs = 0.005 },
                            { name = "int8", model = "quantize_int8", max_abs = 0.02 }] }

is ``verify[fp16]`` and ``verify[int8]``. A key that a value lacks is an error naming the
instance and the line of the parameter that asks for it.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from optbuild.common.errors import Problem
from optbuild.common.paths import name_problem
from optbuild.project.tomlsource import TomlDocument

KEY = "matrix"
MAX_INSTANCES = 1000  # per matrix step: a typo in an axis must not make a million steps
_PLACEHOLDER = re.compile(r"\$\{matrix\.([^}]*)\}")
_TOKEN = re.compile(r"[A-Za-z0-9_.-]+")
_SUBKEY = re.compile(r"[A-Za-z0-9_-]+")
NAME = "name"  # the key of a table value that names it


def instance_name(step: str, values: tuple[Any, ...]) -> str:
    return f"{step}[{','.join(token(v) for v in values)}]"


def token(value: Any) -> str:
    """How a matrix value reads in an instance name (TOML's spelling of booleans; a table
    value by its name)."""
    if isinstance(value, dict):
        value = value[NAME]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def base_name(step: str) -> str:
    """The matrix step an instance came from (``engine`` of ``engine[int8,4]``)."""
    return step.partition("[")[0]


def expand(steps: dict[str, Any], docs: dict[str, TomlDocument],
           problems: list[Problem]) -> tuple[dict[str, Any], list[str]]:
    """A recipe's ``[steps]`` table with each matrix step replaced by its instances, in
    place, and the matrix steps that could not expand (their problems are reported).
    ``docs``: the document each step was written in; an instance is added with its matrix
    step's, where its keys are placed at the matrix step's lines, so that a problem found
    later in an instance points there."""
    expanded: dict[str, Any] = {}
    failed: list[str] = []
    for name, raw in steps.items():
        if not (isinstance(raw, dict) and KEY in raw):
            expanded[name] = raw
            continue
        doc = docs[name]
        instances = _instances(doc, name, raw, problems)
        if not instances:
            failed.append(name)
        for instance, table in instances.items():
            if instance in steps or instance in expanded:
                problems.append(doc.problem(("steps", name, KEY), f"instance {instance!r} is also a step "
                                            "of its own in this recipe"))
                continue
            doc.alias(instance, name)
            docs[instance] = doc
            expanded[instance] = table
    return expanded, failed


def _instances(doc: TomlDocument, name: str, raw: dict[str, Any], problems: list[Problem]) -> dict[str, Any]:
    loc = ("steps", name, KEY)
    axes = raw[KEY]
    if not isinstance(axes, dict) or not axes:
        problems.append(doc.problem(loc, "a matrix is a table of axes, each a list of values: "
                                         'matrix = { precision = ["fp32", "int8"] }'))
        return {}
    for axis, values in axes.items():
        problem = _axis_problem(axis, values)
        if problem is not None:
            problems.append(doc.problem((*loc, axis), problem))
            return {}
    combinations = list(itertools.product(*axes.values()))
    if len(combinations) > MAX_INSTANCES:
        problems.append(doc.problem(loc, f"{len(combinations)} combinations; at most {MAX_INSTANCES} "
                                         "instances per matrix step"))
        return {}
    body = {k: v for k, v in raw.items() if k != KEY}
    instances = {}
    for values in combinations:
        instance = instance_name(name, values)
        if (why := name_problem(instance)) is not None:
            problems.append(doc.problem(loc, f"instance name {instance!r} {why}"))
            return {}
        try:
            instances[instance] = _substitute(body, dict(zip(axes, values, strict=True)), ())
        except KeyError as exc:
            problems.append(doc.problem(("steps", name), f"${{matrix.{exc.args[0]}}}: no such axis "
                                                          f"(axes: {', '.join(axes)})"))
            return {}
        except _ValueKeyError as exc:
            problems.append(doc.problem(("steps", name, *exc.loc), f"{instance}: {exc.message}"))
            return {}
    return instances


def _axis_problem(axis: str, values: Any) -> str | None:
    if not _TOKEN.fullmatch(axis):
        return f"axis name {axis!r} must be letters, digits, _ . -"
    if not isinstance(values, list) or not values:
        return "an axis is a non-empty list of values"
    for value in values:
        if isinstance(value, dict):
            if (problem := _table_value_problem(value)) is not None:
                return problem
        elif not isinstance(value, (str, int, float, bool)) or not _TOKEN.fullmatch(token(value)):
            return (f"value {value!r}: matrix values are strings, numbers or booleans made of "
                    "letters, digits, _ . - (they name the instances), or tables with a name")
    tokens = [token(v) for v in values]
    if len(set(tokens)) != len(tokens):
        return f"values repeat: {tokens}"
    return None


def _table_value_problem(value: dict[str, Any]) -> str | None:
    if NAME not in value:
        return (f"value {value!r}: a table value needs a {NAME!r} key, which names its instances "
                '(e.g. { name = "fp16", model = "quantize_fp16" })')
    name = value[NAME]
    if not isinstance(name, (str, int, float, bool)) or not _TOKEN.fullmatch(token(name)):
        return (f"value {value!r}: its name {name!r} must be a string, number or boolean made of "
                "letters, digits, _ . - (it names the instances)")
    for key in value:
        if not _SUBKEY.fullmatch(key):
            return f"value {token(value)!r}: key {key!r} must be letters, digits, _ - (no dots)"
    return None


class _ValueKeyError(Exception):
    """A ``${matrix.AXIS.KEY}`` that the instance's value cannot answer; ``loc``: the
    parameter that holds it."""

    def __init__(self, loc: tuple, message: str):
        super().__init__(message)
        self.loc, self.message = loc, message


def _lookup(ref: str, values: dict[str, Any], loc: tuple) -> Any:
    """The value ``${matrix.REF}`` stands for: an axis's value (a table value's name), or a
    key of a table value (``AXIS.KEY``). KeyError: no such axis."""
    if ref in values:
        value = values[ref]
        return value[NAME] if isinstance(value, dict) else value
    axis = max((a for a in values if ref.startswith(a + ".")), key=len, default=None)
    if axis is None:
        raise KeyError(ref)
    key, value = ref[len(axis) + 1:], values[axis]
    if not isinstance(value, dict):
        raise _ValueKeyError(loc, f"${{matrix.{ref}}}: the value {token(value)!r} of axis {axis!r} is not "
                                  f'a table, so it has no key {key!r} (a table value: {{ name = "...", {key} = ... }})')
    if key not in value:
        raise _ValueKeyError(loc, f"${{matrix.{ref}}}: the value {token(value)!r} of axis {axis!r} has no "
                                  f"key {key!r} (its keys: {', '.join(value)})")
    return value[key]


def _substitute(value: Any, values: dict[str, Any], loc: tuple) -> Any:
    """``value`` (at ``loc`` in its step) with every ``${matrix.AXIS}`` and
    ``${matrix.AXIS.KEY}`` replaced (KeyError: an unknown axis)."""
    if isinstance(value, dict):
        return {k: _substitute(v, values, (*loc, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, values, (*loc, i)) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    whole = _PLACEHOLDER.fullmatch(value)
    if whole:
        return _lookup(whole.group(1), values, loc)

    def inline(match: re.Match) -> str:
        found = _lookup(match.group(1), values, loc)
        if isinstance(found, (dict, list)):
            raise _ValueKeyError(loc, f"${{matrix.{match.group(1)}}} is a {'table' if isinstance(found, dict) else 'list'}: "
                                      "it can only stand alone in a string, which then takes it whole")
        return token(found)

    return _PLACEHOLDER.sub(inline, value)
