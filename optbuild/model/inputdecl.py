"""What a model's inputs may hold, declared once in a recipe (optbuild.model.samples draws the
seeded feeds from it).

Every self-check (simplify, opset, quantize, the onnxruntime engine, verify without data)
runs models on seeded random inputs. A model's own declaration often cannot say what it
takes: symbolic dims that must be multiples of 32, two dims that share a name, a sample
rate that must be 8000 or 16000. The recipe says it once, per input name::

    [inputs.x]
    shape = [1, 3, 48, [32, 320]]   # a dim: a size, [min, max] or [min, opt, max]
    range = [0.0, 1.0]              # values drawn uniformly from [low, high]
    [inputs.sr]
    values = [8000, 16000]          # only these values

and a step's own ``inputs`` table replaces the recipe's entry of the same input. Check ``k``
of a step takes, for a dim range, its (opt,) min, max, ... in turn; for an undeclared
symbolic dim, 1, 2, 3 in turn; a scalar with ``values`` takes each value in turn.

The models here are validated when a recipe loads; numpy is imported inside the functions.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from optbuild.common.errors import StepError
from optbuild.common.recipetable import KEYED_WHEN_SET, RecipeTable

if TYPE_CHECKING:
    from optbuild.backends.base import TensorSpec

DOCS = "docs/steps.md#model-inputs"

Dtype = Literal["float32", "float16", "float64", "bfloat16", "int64", "int32", "int16", "int8",
                "uint64", "uint32", "uint16", "uint8", "bool"]


def sizes(dim: int | list[int]) -> list[int]:
    """The sizes a declared dim allows at its ends (and opt): [n] for a fixed size."""
    return dim if isinstance(dim, list) else [dim]


def _check_shape(shape: list[int | list[int]]) -> list[int | list[int]]:
    for axis, dim in enumerate(shape):
        if isinstance(dim, list) and len(dim) not in (2, 3):
            raise ValueError(f"dim {axis}: a range is [min, max] or [min, opt, max], got {dim}")
        if any(s < 0 for s in sizes(dim)) or sizes(dim) != sorted(sizes(dim)):
            raise ValueError(f"dim {axis}: sizes must be >= 0 and in order min <= opt <= max, got {dim}")
    return shape


# A declared shape, one entry per dim: a size, [min, max] or [min, opt, max] (sizes >= 0, in order).
Shape = Annotated[list[int | list[int]], AfterValidator(_check_shape)]


class InputDecl(RecipeTable):
    """One model input: its shape with values for symbolic dims, its dtype, its values."""

    shape: Shape | None = Field(default=None, examples=[[1, 3, 48, [32, 320]]])
    """The input's shape, one entry per dim: a size, [min, max] or [min, opt, max]. Checks take
    each range's opt (when given), min, max in turn; a TensorRT engine without profiles gets one
    profile from it."""
    dtype: Dtype | None = Field(default=None, examples=["float32"])
    """The element type the model takes (checked against the model's declaration)."""
    range: tuple[float, float] | None = Field(default=None, examples=[[0.0, 1.0]])
    """[low, high]: values drawn uniformly from it (integers: both ends included). Default:
    floats from N(0, 1), integers from 0 to 7."""
    values: list[int | float | bool] | None = Field(default=None, examples=[[8000, 16000]])
    """The only values the input takes: each element is drawn from them; a scalar (one element)
    takes each in turn, check by check."""

    @model_validator(mode="after")
    def _one_source_of_values(self) -> InputDecl:
        if self.range is not None and self.values is not None:
            raise ValueError("give either range or values, not both")
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range: low {self.range[0]} is above high {self.range[1]}")
        if self.values is not None and not self.values:
            raise ValueError("values: give at least one value")
        return self


InputDecls = dict[str, InputDecl]
# The ``inputs`` parameter of a step: keyed only when set (steps had no such field before).
StepInputs = Annotated[InputDecls | None, KEYED_WHEN_SET]


# The parts of a declaration; a step kind says which it reads (StepParams.inputs_read).
PARTS = ("shape", "dtype", "range", "values")


def narrowed(decls: InputDecls | None, parts: tuple[str, ...] = PARTS,
             names: Collection[str] | None = None) -> InputDecls | None:
    """``decls`` with only the ``parts`` of the inputs in ``names`` (None: every input), what a
    step reads of them: it runs on and is keyed on that alone, so that a shape only a benchmark
    reads does not rebuild an export. None when nothing is left (and then not in the key)."""
    kept = {}
    for name, decl in (decls or {}).items():
        if names is not None and name not in names:
            continue
        part = decl.model_copy(update={field: None for field in PARTS if field not in parts})
        if any(getattr(part, field) is not None for field in PARTS):
            kept[name] = part
    return kept or None


def merged(recipe: InputDecls | None, step: InputDecls | None) -> InputDecls | None:
    """The recipe's declarations with the step's entries replacing those of the same input."""
    if not recipe and not step:
        return None
    return {**(recipe or {}), **(step or {})}


# --- against a model ---------------------------------------------------------------------
def check_declarations(specs: list[TensorSpec], decls: InputDecls | None, label: str) -> None:
    """StepError when a declaration names no input of the model, or contradicts its rank,
    a static dim or its dtype: a mistake in the recipe must not become a puzzling failure."""
    names = [s.name for s in specs]
    by_name = {s.name: s for s in specs}
    for name, decl in (decls or {}).items():
        spec = by_name.get(name)
        if spec is None:
            lowered = {n.lower(): n for n in names}
            hint = [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=1)]
            raise StepError(f"inputs.{name}: {label} has no input {name!r}"
                            + (f"; did you mean {hint[0]!r}?" if hint else "")
                            + f" (its inputs: {', '.join(names)})")
        if decl.dtype is not None and decl.dtype != spec.dtype:
            raise StepError(f"inputs.{name}: dtype {decl.dtype} declared, {label} takes {spec.dtype}")
        if decl.shape is None:
            continue
        if len(decl.shape) != len(spec.shape):
            raise StepError(f"inputs.{name}: shape {decl.shape} has rank {len(decl.shape)}, "
                            f"{label} declares {spec.describe()} (rank {len(spec.shape)})")
        for axis, (dim, fixed) in enumerate(zip(decl.shape, spec.shape)):
            if isinstance(fixed, int) and sizes(dim) != [fixed] * len(sizes(dim)):
                raise StepError(f"inputs.{name}: dim {axis} is fixed at {fixed} in {label}, "
                                f"the declaration gives {dim}")


def profile_shapes(specs: list[TensorSpec], decls: InputDecls | None) -> dict[str, tuple[list[int], list[int], list[int]]] | None:
    """(min, opt, max) per input from the declarations, for a TensorRT profile; None when a
    dynamic input has no declared shape (the step then needs explicit profiles)."""
    shapes = {}
    for spec in specs:
        decl = (decls or {}).get(spec.name)
        if decl is None or decl.shape is None:
            if all(isinstance(d, int) for d in spec.shape):
                continue
            return None
        low = [sizes(d)[0] for d in decl.shape]
        high = [sizes(d)[-1] for d in decl.shape]
        opt = [d[1] if isinstance(d, list) and len(d) == 3 else (d[-1] if isinstance(d, list) else d)
               for d in decl.shape]
        shapes[spec.name] = (low, opt, high)
    return shapes


def inputs_field(note: str = "", example: dict[str, Any] | None = None) -> Any:
    """The ``inputs`` parameter of every step that runs its model on generated feeds; ``note``
    follows the common description."""
    return Field(
        None,
        description="What the model's inputs take, per input name: shape (values for symbolic dims, or "
                    "ranges), dtype, range or values (see 'Model inputs'). Entries replace the recipe's "
                    f"[inputs.NAME] entry of the same input; not set: the recipe's.{note}",
        examples=[example or {"sr": {"values": [8000, 16000]}}])
