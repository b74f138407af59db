"""The step parameter reference, generated from the step classes and their Params models.

One text serves ``optbuild kinds`` and docs/steps.md (``python -m optbuild.steps.manual >
docs/steps.md``; tests/test_reference.py fails when the file is stale), so the reference
cannot drift from the code. Only step modules are imported, and they import nothing heavy.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import itertools
import json
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo

from optbuild.common.errors import OptbuildError
from optbuild.common.recipetable import CALLABLE_REF, INPUT_PATH, STEP_REF
from optbuild.model.samples import check_data_source
from optbuild.steps import registry
from optbuild.steps.base import Step

GENERATE = "python -m optbuild.steps.manual > docs/steps.md"
WIDTH = 92  # descriptions are wrapped to this: the text reads the same in a terminal

_MARKERS = {id(STEP_REF): "step", id(INPUT_PATH): "path", id(CALLABLE_REF): "file.py:callable"}
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
_BOUNDS = {annotated_types.Ge: ("ge", ">="), annotated_types.Gt: ("gt", ">"),
           annotated_types.Le: ("le", "<="), annotated_types.Lt: ("lt", "<")}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def step_names(kind: str, backend: str | None = None, local: dict[str, str] | None = None) -> list[str]:
    """Registry names ("kind" or "kind/backend") that ``kind`` and ``backend`` select (with
    the project-local kinds ``local``): every backend of a kind that has backends when none
    is given. OptbuildError, with a "did you mean", for an unknown kind or backend."""
    if "/" in kind and backend is None:
        kind, backend = kind.split("/", 1)
    known = registry.known_kinds(local)
    if kind not in known:
        hint = difflib.get_close_matches(kind, known, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise OptbuildError(f"unknown step kind {kind!r}{suggestion} (known: {', '.join(known)})")
    choices = registry.backends(kind, local)
    if backend is None:
        return [f"{kind}/{name}" for name in choices] or [kind]
    if backend not in choices:
        hint = difflib.get_close_matches(backend, choices, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        what = f"one of: {', '.join(choices)}" if choices else "it has no backends"
        raise OptbuildError(f"unknown backend {backend!r} for kind {kind!r}{suggestion} ({what})")
    return [f"{kind}/{backend}"]


def step_class(name: str, local: dict[str, str] | None = None) -> type[Step]:
    return registry.step_class(registry.implementation_of(name, local))


def summary(cls: type[Step]) -> str:
    """The first line of the class docstring: what the kind does, in one sentence."""
    return (inspect.getdoc(cls) or "").split("\n", 1)[0].strip()


def notes(cls: type[Step]) -> str:
    """The class docstring after its first line: what a user must know beyond the parameters
    (how to choose a level, how a tie is broken), printed as written, between the summary and
    the parameters."""
    return (inspect.getdoc(cls) or "").partition("\n")[2].strip()


def overview(names: list[str]) -> str:
    """A Markdown table of ``names`` (registry names): kind, backend, what it does."""
    rows = ["| kind | backend | what it does |", "|---|---|---|"]
    for name in names:
        kind, _, backend = name.partition("/")
        link = f"[`{kind}`](#{anchor(name)})"
        rows.append(f"| {link} | {f'`{backend}`' if backend else ''} | {summary(step_class(name))} |")
    return "\n".join(rows)


def kind_reference(name: str, local: dict[str, str] | None = None) -> str:
    """The reference of one registry name ("quantize", "engine/onnxruntime") in Markdown:
    its summary, the keys that select it, and every parameter with type, default,
    description and examples."""
    cls = step_class(name, local)
    kind, _, backend = name.partition("/")
    params = cls.Params
    hints = typing.get_type_hints(params, include_extras=True)
    selector = f'kind = "{kind}"' + (f'\nbackend = "{backend}"' if backend else "")
    lines = [f"## {name}", "", summary(cls), ""] + ([notes(cls), ""] if notes(cls) else [])
    lines += ["```toml", "[steps.NAME]", selector, "```", ""]
    for field_name, field in params.model_fields.items():
        if field_name == "backend" and backend:
            continue  # shown with kind above
        lines += _parameter(field_name, field, hints[field_name], description(params, field_name))
    return "\n".join(lines).rstrip() + "\n"


def description(model: type[BaseModel], name: str) -> str | None:
    """What field ``name`` of ``model`` means: its ``description=`` if it has one, else the
    docstring under it in the source. Read here, for the reference only: pydantic's
    ``use_attribute_docstrings`` would parse each params class's module when it is defined,
    on every build (about 5 ms a class)."""
    return model.model_fields[name].description or _docstrings(model).get(name)


@functools.cache
def _docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Attribute docstrings of ``model`` and of its bases (a subclass's win)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls is BaseModel or not issubclass(cls, BaseModel):
            continue
        node = next((n for n in _module_tree(inspect.getsourcefile(cls) or "").body
                     if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
        body = node.body if node is not None else []
        for field, doc in itertools.pairwise(body):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                found[field.target.id] = inspect.cleandoc(doc.value.value)
    return found


@functools.cache
def _module_tree(path: str) -> ast.Module:
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return ast.Module(body=[], type_ignores=[])


def _parameter(name: str, field: FieldInfo, annotation: Any, text: str | None) -> list[str]:
    if field.is_required():
        default = "**required**"
    else:
        value = field.get_default(call_default_factory=True)
        default = "default: not set" if value is None else f"default: `{toml(value)}`"
    lines = [f"- `{name}`: {type_text(annotation)}{_bounds(field)}; {default}"]
    if text:
        lines.append(textwrap.fill(text, WIDTH, initial_indent="  ", subsequent_indent="  ",
                                   break_long_words=False, break_on_hyphens=False))
    for example in field.examples or []:
        lines.append(f"  Example: `{name} = {toml(example)}`")
    return lines


def _bounds(field: FieldInfo) -> str:
    bounds = [f"{symbol} {toml(getattr(item, attr))}"
              for item in field.metadata if (bound := _BOUNDS.get(type(item)))
              for attr, symbol in [bound]]
    return f" ({', '.join(bounds)})" if bounds else ""


def type_text(annotation: Any) -> str:
    """A parameter's type in the words of a recipe author: 'step', '"int8" | "uint8"',
    'list of string', 'table {string: integer}'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        metadata = annotation.__metadata__
        for item in metadata:
            if id(item) in _MARKERS:
                return _MARKERS[id(item)]
            if isinstance(item, AfterValidator) and item.func is check_data_source:
                return "data source"
        return type_text(args[0])
    if origin is Literal:
        return " | ".join(toml(value) for value in args)
    if origin in (typing.Union, types.UnionType):
        shown = [type_text(arg) for arg in args if arg is not type(None)]
        return " or ".join(shown)
    if origin is list:
        inner = type_text(args[0])
        return f"list of ({inner})" if " " in inner else f"list of {inner}"
    if origin is dict:
        return f"table {{{type_text(args[0])}: {type_text(args[1])}}}"
    if origin is tuple:
        return "[" + ", ".join(type_text(arg) for arg in args) + "]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "{ " + ", ".join(annotation.model_fields) + " }"
    if annotation is Any:
        return "any"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def toml(value: Any) -> str:
    """``value`` as a TOML inline value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml(item) for item in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_key(k)} = {toml(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {value!r}")


def _key(key: Any) -> str:
    return str(key) if _BARE_KEY.match(str(key)) else json.dumps(str(key))


def anchor(name: str) -> str:
    """GitHub's anchor of the heading ``## name``."""
    return re.sub(r"[^a-z0-9 _-]", "", name.lower()).replace(" ", "-")


_INTRO = f"""\
# Step parameter reference

Generated from the step classes: do not edit it by hand, run `{GENERATE}`
(the tests fail when it is stale). `optbuild kinds KIND` prints the same text for one kind.

Each `[steps.NAME]` table of a recipe is a step: `kind` (and, for `engine`, `backend`)
selects what it does, the other keys are its parameters, below. Unknown keys are errors,
and so are options of another mode or method (e.g. `percentile` with `method = "minmax"`).
Paths are relative to the recipe file. A **step** parameter names another step's output:
`"simplify"` (same recipe) or `"cnn:simplify"` (another recipe). Every parameter's value
enters the step's key; descriptions and comments do not.

Every step also takes `enabled = false`, which parks it without deleting it: the step and
the steps that depend on it are skipped, saying why, and the build is still ok. A step that
fails in its own code is remembered under its key: later builds (and `plan`) report that
failure without running it again, until its key changes or `--retry-failed` is given.
"""

_DATA = """\
## Data sources and data callables

The `data` parameter of `calibrate` and `verify` takes one of three forms, told apart by
its spelling. The samples are checked against the model's declared inputs (the calibrated
model for `calibrate`, the `reference` for `verify`) before anything runs; a mismatch fails
the step with a message naming the input and its expected dtype and shape.

- `"calib.npz"`: one array per model input, stored under the input's name.
- `"calib/"` (a folder): `<input name>.npy` per input, read like an `.npz` entry, or a
  sub-folder `<input name>/` with one `.npy` file per sample, taken in file-name order.
- `"models/calib.py:images"`: a data callable (below).

Stacked arrays (an `.npz` entry, `<input name>.npy`) hold many samples: with one axis more
than the model input, axis 0 enumerates samples; with the model input's rank, axis 0 is the
batch axis and is cut into samples of one row (of B rows when the model fixes batch B).
Every input must have the same number of samples. The data files enter the key.

### Data callables

```toml
data = "models/calib.py:images"
data_args = { count = 64, seed = 0 }    # images(count=64, seed=0)
```

```python
import numpy as np

def images(count: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"image": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
```

- **Call.** The callable is called once, as `callable(**data_args)`, in the step's worker
  process, with its file's folder first on `sys.path` (so it can import its siblings).
  `data_args` values are strings, integers, floats or booleans.
- **What it yields.** Any iterable (a generator, a list) of feed dicts: model input name ->
  array, one entry for every model input and no other. At most `samples` of them are taken,
  so the iterable may be endless when `samples` is set.
- **Dtypes.** Each value goes through `numpy.asarray` and must then have exactly the
  input's element type: `float32` for `tensor(float)`, `int64` for `tensor(int64)`,
  `float16`, `bool`... Nothing is cast: a Python float becomes `float64` and a Python int
  `int64`, so build arrays with an explicit dtype (`.astype(np.float32)`). For `verify`,
  that is the reference's type; a float16 candidate gets the float inputs cast for it.
- **Batch axis.** A value has the input's full rank, batch axis included (a sample may hold
  several rows when the batch is dynamic), or one axis less when the model's first
  dimension is dynamic or 1: a batch axis of 1 is then added. Every dimension the model
  fixes must match. For an engine candidate, each sample must fit one of its profiles.
- **Scalar inputs.** A rank-0 input takes a 0-d array of the exact dtype:
  `np.array(0.5, dtype=np.float32)` or `np.float32(0.5)` (a bare `0.5` is float64).
- **The key.** The callable's file, the project-local modules it imports and `data_args`
  enter the key; the values it produces and files it opens do not. Seed every random
  generator, and put data it reads in an `.npz` or a folder source instead.

### Random inputs

`verify` without `data`, and the built-in numeric checks of `simplify`, `opset`, `quantize`
and `engine` (backend `onnxruntime`), feed seeded random inputs: what the recipe declares
for each input (see [Model inputs](#model-inputs)), else the model's declared shapes, with
standard normal floats, uniform integers (`int_range` for `verify`, 0 to 7 for the checks)
and uniform booleans. A dimension the model does not fix, undeclared, gets `dynamic_size`
(`verify`) or 1, 2, 3 in turn, check by check (the checks). A check that fails says what it
fed and how to declare other inputs. String inputs need a data source.

### Export callables

`model = "models/cnn.py:build"` (kind `export`) names a callable taking no arguments that
returns `(module, example_inputs)`: a `torch.nn.Module` (put in eval mode, after `weights`
is loaded into it) and a tensor or a tuple of tensors, one per `forward()` argument in
order. The example inputs fix every shape the export does not mark in `dynamic_axes`; each
dynamic axis is checked once more one larger. The file, the project-local modules it
imports, `weights` and `extra_files` enter the key.

Give a size of 2 or more on every dynamic axis (a batch of 2): `exporter = "dynamo"`
(torch.export) takes an axis of size 1 in the example for the constant 1. The TorchScript
exporter calls `forward()` with every parameter positionally, defaults included: a model
whose `forward()` is decorated (transformers) or takes flags (`is_causal`) fails so; return
a wrapper module whose `forward()` calls the model with keywords (and `return_dict=False`),
or use the dynamo exporter. `nn.MultiheadAttention`'s eval-mode fast path is turned off while
the TorchScript exporter traces (no opset has its operator); an operator that exporter cannot
translate at all fails with the message to use `exporter = "dynamo"` (opset >= 18).
"""

_PROFILES = """\
## Optimization profiles

`profiles` (engine backends `tensorrt` and `tensorrt-rtx`) is a list of tables, one per
optimization profile; each maps a model input to the shapes it may take:

```toml
profiles = [
  { image = { min = [1, 3, 224, 224], opt = [8, 3, 224, 224], max = [32, 3, 224, 224] } },
  { image = { min = [64, 3, 224, 224], opt = [64, 3, 224, 224], max = [64, 3, 224, 224] } },
]
```

`min`, `opt` and `max` have the input's rank, positive sizes and `min <= opt <= max` in
every dimension; a dimension the model fixes has that size in all three. TensorRT tunes its
kernels for `opt`. Every dynamic input must appear in every profile, and a model with
dynamic inputs needs at least one profile. At run time (e.g. in a `verify` step) every
sample must fit one profile, or the step fails before any GPU work, naming the input, its
shape and the profile's bounds.
"""


_INPUTS = """\
## Model inputs

A model's own declaration often cannot say what it takes: symbolic dims that must be
multiples of 32, a sample rate that must be 8000 or 16000. A recipe says it once, per input
name, in `[inputs.NAME]` tables beside its steps; every step that runs the model on
generated inputs (`simplify`, `opset`, `quantize`, `engine`, `verify` without `data`) uses
them, and a TensorRT engine without `profiles` gets one profile from the declared shapes.
A step's own `inputs` parameter replaces the recipe's entry of the same input. A step runs
on, and is keyed on, only the parts of the declarations it reads with its parameters: export
the shapes of its inputs with dynamic axes; select the values (range, values, dtype), not
the shapes; `verify` with `data`, `quantize` with `check = false` (no `report`, no
`exclude_until`) and `simplify` / `opset` with `check = 0` none; a check reads them all,
except simplify the shape of an input `input_shapes` fixes. So a shape only a benchmark
needs rebuilds the benchmark (and the checks that feed it), not the export. A name the model
lacks, or a shape that contradicts the model, fails the step with a message that says so.

```toml
[inputs.x]
shape = [1, 3, 48, [32, 160, 320]]   # a dim: a size, [min, max] or [min, opt, max]
range = [0.0, 1.0]
[inputs.sr]
values = [8000, 16000]

[steps.engine]
kind = "engine"
backend = "onnxruntime"
input = "quantize"
inputs = { sr = { values = [16000] } }   # this step: only 16 kHz
```

Check number k (0, 1, 2, ...) takes for a `[min, opt, max]` dim opt, min, max in turn, for a
`[min, max]` dim min, max and their midpoint, and for an undeclared symbolic dim 1, 2, 3.
"""


def inputs_reference() -> str:
    """The Model inputs section: the prose, then the keys of one ``[inputs.NAME]`` table."""
    from optbuild.model.inputdecl import InputDecl

    hints = typing.get_type_hints(InputDecl, include_extras=True)
    lines = [_INPUTS, "Keys of `[inputs.NAME]` (all optional):", ""]
    for field_name, field in InputDecl.model_fields.items():
        lines += _parameter(field_name, field, hints[field_name], description(InputDecl, field_name))
    return "\n".join(lines) + "\n"


def document() -> str:
    """docs/steps.md: the built-in kinds, the data rules, inputs, profiles, each kind's parameters."""
    names = list(registry.BUILTIN)
    parts = [_INTRO, "## Kinds\n\n" + overview(names) + "\n", _DATA, inputs_reference(), _PROFILES]
    parts += [kind_reference(name) for name in names]
    return "\n".join(parts)


if __name__ == "__main__":
    print(document(), end="")
