"""Recipe tables: the pydantic models of what a recipe writes, and the markers on their fields
that say how a value enters a step's key (another step's output, an input file, a Python
callable, a parameter keyed only when set). Steps, the project loader, input declarations and
keys all read them.
"""

from __future__ import annotations

import typing
from functools import cache
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import CoreSchema


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


STEP_REF = _Marker("step-ref")
INPUT_PATH = _Marker("input-path")
CALLABLE_REF = _Marker("callable-ref")
# A parameter added after caches existed: it enters the key only when set, so adding it
# does not disown every cached result of its kind.
KEYED_WHEN_SET = _Marker("keyed-when-set")


def _check_callable(value: str) -> str:
    path, sep, attr = value.rpartition(":")
    if not sep or not path.endswith(".py") or not attr.replace(".", "_").isidentifier():
        raise ValueError(f"expected 'path/to/file.py:callable', got {value!r}")
    return value


def _check_ref(value: str) -> str:
    parts = value.split(":")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"expected 'step' or 'recipe:step', got {value!r}")
    return value


# The output of another step: "step" (same recipe) or "recipe:step".
StepRef = Annotated[str, AfterValidator(_check_ref), STEP_REF]
# A file whose bytes enter the key; relative paths are relative to the recipe file.
InputPath = Annotated[str, INPUT_PATH]
# "path/to/file.py:callable"; the file (and what it imports locally) enters the key.
CallableRef = Annotated[str, AfterValidator(_check_callable), CALLABLE_REF]


def strict_scalars(schema: Any) -> Any:
    """``schema`` (a pydantic core schema) with its int, float and bool parts strict: a recipe's
    ``runs = "50"``, ``runs = 50.0`` or ``flag = "yes"`` is an error, not coerced. Only these:
    pydantic's global strict mode would also refuse a string for a Path and a list for a tuple,
    which TOML cannot write otherwise; nor a table's keys, which TOML writes as strings
    (``dynamic_axes = {image = {0 = "batch"}}``). A strict float still takes an int."""
    if isinstance(schema, dict):
        if schema.get("type") in ("int", "float", "bool"):
            schema["strict"] = True
        for name, value in schema.items():
            if not (schema.get("type") == "dict" and name == "keys_schema"):
                strict_scalars(value)
    elif isinstance(schema, list):
        for value in schema:
            strict_scalars(value)
    return schema


class RecipeTable(BaseModel):
    """A table a recipe writes: unknown keys are errors, values are immutable, and numbers and
    booleans are taken only as written (``strict_scalars``). The docstring under a field is
    its description, which optbuild.steps.manual reads from the source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler) -> CoreSchema:
        # each table's own fields; a nested table (a definition referenced by name) does its own
        return strict_scalars(handler(source))


def _has_marker(annotation: Any, marker: _Marker) -> bool:
    if typing.get_origin(annotation) is Annotated:
        if any(m is marker for m in annotation.__metadata__):
            return True
        return _has_marker(typing.get_args(annotation)[0], marker)
    return any(_has_marker(arg, marker) for arg in typing.get_args(annotation))


@cache
def fields_with(params_cls: type[RecipeTable], marker: _Marker) -> tuple[str, ...]:
    """Names of the fields of ``params_cls`` annotated with ``marker`` (also inside Optional)."""
    hints = typing.get_type_hints(params_cls, include_extras=True)
    return tuple(name for name in params_cls.model_fields if _has_marker(hints.get(name), marker))
