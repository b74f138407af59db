"""Problems in a project's words: a pydantic validation error, an unknown key or a non-finite
number turned into file, line, field and a message that says what was written and what is
expected."""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from optbuild.common.errors import Problem
from optbuild.project.tomlsource import TomlDocument


def _table_model(annotation: Any, loc: tuple) -> type[BaseModel] | None:
    """The model of the table at ``loc`` inside a value of type ``annotation``, following
    fields, list items, dict values and Optional; None where that is ambiguous."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return _table_model(args[0], loc) if len(args) == 1 else None
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if not loc:
        return annotation if is_model else None
    part, rest = loc[0], loc[1:]
    if is_model:
        field_info = annotation.model_fields.get(str(part))
        return _table_model(field_info.annotation, rest) if field_info is not None else None
    if origin is list and isinstance(part, int):
        return _table_model(args[0], rest)
    if origin is dict:
        return _table_model(args[1], rest)
    return None


def unknown_key(key: str, known: list[str], expected: str | None = None) -> str:
    """"unknown key" with the closest known key, or else ``expected`` (default: the known keys)."""
    if hint := difflib.get_close_matches(key, known, n=1):
        return f"unknown key; did you mean {hint[0]!r}?"
    if expected is None and known:
        expected = f"expected one of: {', '.join(known)}"
    return f"unknown key ({expected})" if expected else "unknown key"


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false"}
_ALSO_EXPECTED = {"list_type": "a list", "string_type": "a string", "dict_type": "a table", "model_type": "a table"}


def _union_member(model: type[BaseModel], loc: tuple) -> bool:
    """Whether ``loc``'s last part names a member of a union field (pydantic's
    ``keep_io_types.bool``): no key the recipe wrote."""
    table = _table_model(model, loc[:-2]) if len(loc) >= 2 else None
    field_info = table.model_fields.get(str(loc[-2])) if table is not None else None
    if field_info is None:
        return False
    members = [a for a in typing.get_args(field_info.annotation) if a is not type(None)]
    return typing.get_origin(field_info.annotation) in (typing.Union, types.UnionType) and len(members) > 1


def _merge_unions(errors: Sequence[Mapping[str, Any]], model: type[BaseModel]) -> list[dict]:
    """The errors of a union field's members as one error at the field, where each says what
    the member expects (``bool | list[str]`` given "yes": "expected true or false or a list,
    got the string 'yes'"); other errors as they are."""
    merged: dict[tuple, dict] = {}
    out: list[dict] = []
    for error in errors:
        expected = _EXPECTED.get(error["type"]) or _ALSO_EXPECTED.get(error["type"])
        if expected is None or not _union_member(model, error["loc"]):
            out.append(dict(error))
            continue
        loc = error["loc"][:-1]
        if loc not in merged:
            merged[loc] = {**error, "loc": loc, "type": "union_type", "expected": []}
            out.append(merged[loc])
        merged[loc]["expected"].append(expected)
    for error in merged.values():
        error["msg"] = f"expected {' or '.join(error['expected'])}, got {_written(error['input'])}"
    return out


def _written(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the string {value!r}"
    return repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"


def wrong_type(kind: str, value: Any) -> str:
    """Why ``value`` is not of the strict type ``kind`` (pydantic's error type), and the fix:
    a recipe's numbers and booleans are taken as written, never converted."""
    message = f"expected {_EXPECTED[kind]}, got {_written(value)}"
    if isinstance(value, str) and kind != "bool_type":
        return f"{message}: write the number without quotes"
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return f"{message}: write {value.lower()} without quotes"
    if kind == "int_type" and isinstance(value, float) and value.is_integer():
        return f"{message}: write {int(value)}"
    return message


def validation_problems(doc: TomlDocument, prefix: tuple, exc: ValidationError, model: type[BaseModel],
                        top_keys: tuple[str, ...] = ()) -> list[Problem]:
    """``exc`` (from validating ``model`` at ``prefix`` of ``doc``) as located problems, in
    the recipe's words. ``top_keys``: keys valid beside ``model``'s fields at its top level
    (a step's ``kind``), offered when an unknown key is near one."""
    problems = []
    for error in _merge_unions(exc.errors(), model):
        loc = (*prefix, *error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            table = _table_model(model, error["loc"][:-1])
            known = [] if table is None else list(table.model_fields)
            if len(error["loc"]) == 1:
                known = [*top_keys, *known]
            message = unknown_key(str(error["loc"][-1]), known)
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "value_error":  # our validators' words, without pydantic's prefix
            message = str(error["ctx"]["error"])
        elif error["type"] in _EXPECTED:
            message = wrong_type(error["type"], error["input"])
        problems.append(doc.problem(loc, message))
    return problems


def non_finite_problems(doc: TomlDocument, prefix: tuple, value: Any) -> list[Problem]:
    """A problem for each infinite or NaN number in ``value`` (at ``prefix`` of ``doc``), nested
    tables and arrays included. TOML reads ``inf``, ``nan`` and ``1e999`` (which overflows) as
    floats, and a parameter enters the step's key as JSON, which has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        written = "nan" if math.isnan(value) else ("-" if value < 0 else "") + "inf (or a number too large for a float)"
        return [doc.problem(prefix, f"{written} is not a finite number: a parameter enters the step's key, which "
                                    "holds finite numbers only; write a finite value")]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in non_finite_problems(doc, (*prefix, key), item)]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in non_finite_problems(doc, (*prefix, index), item)]
    return []
