"""Sample inputs, one module for every step and command that feeds a model: data sources
(calibrate, verify, the OpenVINO INT8 engine), seeded random samples (verify, bench) and the
seeded feeds of the steps' own checks, drawn from the recipe's input declarations
(optbuild.model.inputdecl).

A data source (the ``data`` parameter) is one of three forms, told apart by its spelling:

``path/to/file.npz``
    One array per model input, stored under the input's name.
``path/to/folder``
    ``<input name>.npy`` per input (same meaning as an .npz entry), or a sub-folder
    ``<input name>/`` holding one ``.npy`` file per sample, taken in file-name order.
``path/to/file.py:callable``
    ``callable(**data_args)`` returns an iterable of feed dicts (input name -> array); it
    may be infinite when ``samples`` bounds it. The file and the project-local modules it
    imports enter the key, like an export's model callable.

Stacked arrays (an .npz entry, ``<name>.npy``) hold many samples: with one axis more than
the model input, axis 0 enumerates samples; with the model input's rank, axis 0 is the
batch axis and is cut into samples of one row (of B rows when the model fixes batch B).
A single sample (a sub-folder file, a value yielded by a callable) has the model input's
rank, or one axis less, in which case a batch axis of 1 is added.

Every sample is checked against the model's declared inputs before anything runs: a
missing or unknown input name, a wrong dtype (no silent casts: float64 is not float32),
a wrong rank or a wrong static dimension, an empty set, or inputs with different sample
counts each raise a StepError that names the input and its expected dtype and shape.

numpy and onnxruntime are imported inside the functions: step modules import this module
when a recipe is validated, where nothing heavy may load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import TensorSpec
from optbuild.common import usermodule
from optbuild.common.callables import Call
from optbuild.common.errors import StepError
from optbuild.model.inputdecl import DOCS

if TYPE_CHECKING:
    import numpy as np

    from optbuild.model.inputdecl import InputDecl, InputDecls

UNDECLARED_SIZES = (1, 2, 3)  # an undeclared symbolic dim, check by check
DEFAULT_INT_RANGE = (0, 7)  # integers without a declaration: token ids, indices (inclusive)

# Scalars a recipe may pass to a data callable as keyword arguments.
DataArg = str | int | float | bool

# --- the ``data`` parameter (validated when the recipe loads) -----------------------------
def check_data_source(value: str) -> str:
    """Pydantic validator of a ``data`` parameter: .npz, folder or file.py:callable."""
    value = value.strip()
    if not value:
        raise ValueError("expected 'file.npz', 'folder' or 'file.py:callable', got an empty string")
    if ".py:" in value:
        path, _, attr = value.rpartition(":")
        if not path.endswith(".py") or not attr.replace(".", "_").isidentifier():
            raise ValueError(f"expected 'path/to/file.py:callable', got {value!r}")
        return value
    lowered = value.lower()
    if lowered.endswith(".py"):
        raise ValueError(f"{value!r} names a Python file but no callable: write '{value}:function'")
    if lowered.endswith(".npy"):
        raise ValueError(f"{value!r} is a single .npy file: put one '<input name>.npy' per input "
                         "in a folder and name the folder, or use an .npz file")
    if lowered.endswith((".onnx", ".json", ".pt", ".pth", ".pkl", ".txt", ".csv")):
        raise ValueError(f"{value!r} is not calibration data: expected 'file.npz', a folder "
                         "of .npy files, or 'file.py:callable'")
    return value


def non_default(params: Any, names: tuple[str, ...] | list[str]) -> list[str]:
    """Which of ``names`` hold a value other than their default.

    (Not ``model_fields_set``: the worker re-validates every param from a full dump, so a
    cross-field check must not depend on which keys the recipe spelled out.)
    """
    fields = type(params).model_fields
    return [n for n in names if getattr(params, n) != fields[n].get_default(call_default_factory=True)]


def is_callable_source(value: str) -> bool:
    return ".py:" in value


def data_calls(value: str | None, args: dict[str, Any], field: str = "data",
               args_field: str = "data_args") -> list[Call]:
    """A data callable as ``Step.calls`` declares it: the parameter ``field``, called as
    ``callable(**args)``, ``args`` the parameter ``args_field``."""
    if value is None or not is_callable_source(value):
        return []
    return [Call(field, value, keywords=tuple(args), keywords_field=args_field)]


def data_key_files(value: str | None, base_dir: Path, project_root: Path) -> list[Path]:
    """Files whose bytes key a data source: the .npz, every .npy of a folder, or the
    callable's file with the project-local modules it imports."""
    if value is None:
        return []
    if is_callable_source(value):
        from optbuild.common.pyimports import local_imports

        entry = (base_dir / value.rpartition(":")[0]).resolve()
        files = [entry]
        if entry.is_file():
            files.extend(p for p in local_imports(entry, project_root) if p not in files)
        return files
    path = (base_dir / value).resolve()
    if path.is_dir():
        return sorted(p for p in path.rglob("*.npy") if p.is_file())
    return [path]  # a missing path is reported by the loader as "file not found"


# --- model inputs ---------------------------------------------------------------------------
def _expected(specs: list[TensorSpec]) -> str:
    return "; ".join(str(s) for s in specs)


# --- loading and checking samples ------------------------------------------------------------
class Samples:
    """Validated feed dicts (input name -> array), in order, and where they came from."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], source: str):
        self.feeds = feeds
        self.source = source

    def __len__(self) -> int:
        return len(self.feeds)

    @property
    def rows(self) -> int:
        """Samples counted along the batch axis of the first input (feeds may hold batches)."""
        first = [next(iter(feed.values())) for feed in self.feeds]
        return sum(int(a.shape[0]) if a.ndim else 1 for a in first)


def _check_sample(spec: TensorSpec, array: np.ndarray, where: str) -> np.ndarray:
    """One sample for ``spec``: exact dtype, rank (or rank - 1: batch axis added), static dims."""
    if str(array.dtype) != spec.dtype:
        hint = f" (convert it with .astype('{spec.dtype}'))" if spec.dtype in _NUMERIC else ""
        raise StepError(f"input {spec.name!r} expects {spec.describe()}; {where} has dtype "
                        f"{array.dtype}{hint}")
    rank = len(spec.shape)
    if rank > 0 and array.ndim == rank - 1 and not (isinstance(spec.shape[0], int) and spec.shape[0] != 1):
        array = array[None, ...]  # a single sample without its batch axis
    if array.ndim != rank:
        raise StepError(f"input {spec.name!r} expects {spec.describe()}; {where} has shape "
                        f"{tuple(array.shape)} (rank {array.ndim}, expected {rank})")
    for axis, (want, have) in enumerate(zip(spec.shape, array.shape)):
        if isinstance(want, int) and want != have:
            raise StepError(f"input {spec.name!r} expects {spec.describe()}; {where} has shape "
                            f"{tuple(array.shape)} (dimension {axis} is {have}, expected {want})")
    return array


_NUMERIC = {"float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint64", "uint32",
            "uint16", "uint8", "bool"}


def _split_stacked(spec: TensorSpec, array: np.ndarray, where: str) -> list[np.ndarray]:
    """The samples of a stacked array (an .npz entry or ``<name>.npy``)."""
    rank = len(spec.shape)
    if str(array.dtype) != spec.dtype:
        _check_sample(spec, array, where)  # raises the dtype error
    if array.ndim == rank + 1:
        return [_check_sample(spec, array[i], f"{where} (sample {i})") for i in range(array.shape[0])]
    if array.ndim == rank and rank > 0:
        rows = spec.shape[0] if isinstance(spec.shape[0], int) else 1
        if array.shape[0] % rows:
            raise StepError(f"input {spec.name!r} expects {spec.describe()}; {where} has "
                            f"{array.shape[0]} rows, not a multiple of the model's batch {rows}")
        return [_check_sample(spec, array[i:i + rows], f"{where} (rows {i}:{i + rows})")
                for i in range(0, array.shape[0], rows)]
    raise StepError(f"input {spec.name!r} expects {spec.describe()}; {where} has shape "
                    f"{tuple(array.shape)}: a stack of samples needs rank {rank + 1} (axis 0 "
                    f"enumerates samples) or {rank} (rows of the batch axis)")


def _columns_to_feeds(columns: dict[str, list[np.ndarray]], specs: list[TensorSpec],
                      source: str) -> list[dict[str, np.ndarray]]:
    counts = {name: len(samples) for name, samples in columns.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise StepError(f"{source}: inputs have different sample counts ({listed})")
    count = next(iter(counts.values()), 0)
    return [{s.name: columns[s.name][i] for s in specs} for i in range(count)]


def _match_names(have: list[str], specs: list[TensorSpec], source: str, what: str) -> None:
    wanted = [s.name for s in specs]
    for spec in specs:
        if spec.name not in have:
            listed = ", ".join(map(repr, have)) or "nothing"
            raise StepError(f"{source} has no {what} for input {spec.name!r} (expected "
                            f"{spec.describe()}); it has {listed}")
    unknown = [name for name in have if name not in wanted]
    if unknown:
        raise StepError(f"{source} has {what}s for unknown inputs {unknown}; the model's inputs "
                        f"are {_expected(specs)}")


def _load_npz(path: Path, specs: list[TensorSpec], source: str) -> list[dict[str, np.ndarray]]:
    import numpy as np

    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StepError(f"{source} is not a readable .npz file: {exc}") from None
    with archive:
        _match_names(list(archive.files), specs, source, "array")
        columns = {s.name: _split_stacked(s, archive[s.name], f"array {s.name!r} of {source}")
                   for s in specs}
    return _columns_to_feeds(columns, specs, source)


def _load_npy(path: Path, where: str) -> np.ndarray:
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StepError(f"{where} is not a readable .npy file: {exc}") from None


def _load_folder(path: Path, specs: list[TensorSpec], source: str) -> list[dict[str, np.ndarray]]:
    have = sorted({p.stem for p in path.glob("*.npy")} | {p.name for p in path.iterdir() if p.is_dir()})
    _match_names(have, specs, source, "'<name>.npy' file or '<name>/' folder")
    columns = {}
    for spec in specs:
        stacked, folder = path / f"{spec.name}.npy", path / spec.name
        if stacked.is_file():
            columns[spec.name] = _split_stacked(spec, _load_npy(stacked, f"{source}/{stacked.name}"),
                                                f"{source}/{stacked.name}")
        else:
            files = sorted(folder.glob("*.npy"))
            columns[spec.name] = [_check_sample(spec, _load_npy(f, f"{source}/{spec.name}/{f.name}"),
                                                f"{source}/{spec.name}/{f.name}") for f in files]
    return _columns_to_feeds(columns, specs, source)


@contextmanager
def _load_callable(value: str, base_dir: Path) -> Iterator[Any]:
    """The data callable of ``value``; its file's folder stays first on sys.path until the
    block ends, so that it, and the generator it returns, can import their siblings."""
    with usermodule.callable_at(value, base_dir, lambda message: StepError(f"data callable {message}")) as target:
        yield target


def _load_from_callable(value: str, base_dir: Path, args: dict[str, Any], specs: list[TensorSpec],
                        limit: int | None) -> list[dict[str, np.ndarray]]:
    import numpy as np

    with _load_callable(value, base_dir) as function:
        try:
            produced = function(**args)
            iterator = iter(produced)
        except TypeError as exc:
            raise StepError(f"{value} must return an iterable of feed dicts (input name -> array): "
                            f"{exc}") from exc
        except Exception as exc:
            raise StepError(f"{value} raised {type(exc).__name__}: {exc}") from exc
        feeds: list[dict[str, np.ndarray]] = []
        while limit is None or len(feeds) < limit:
            index = len(feeds)
            try:
                item = next(iterator)
            except StopIteration:
                break
            except Exception as exc:
                raise StepError(f"{value} raised {type(exc).__name__} at sample {index}: {exc}") from exc
            if not isinstance(item, dict):
                raise StepError(f"{value} yielded {type(item).__name__!r} at sample {index}; expected a "
                                f"dict of input name -> array for inputs {_expected(specs)}")
            _match_names(list(item), specs, f"sample {index} of {value}", "value")
            feeds.append({s.name: _check_sample(s, np.asarray(item[s.name]), f"sample {index} of {value}")
                          for s in specs})
        return feeds


def load_samples(value: str, base_dir: Path, specs: list[TensorSpec], *, args: dict[str, Any] | None = None,
                 limit: int | None = None) -> Samples:
    """The validated samples of data source ``value`` (recipe-relative), at most ``limit``."""
    if args and not is_callable_source(value):
        raise StepError(f"data_args only apply to a 'file.py:callable' data source, not {value!r}")
    if is_callable_source(value):
        feeds = _load_from_callable(value, base_dir, args or {}, specs, limit)
    else:
        path = (base_dir / value).resolve()
        if path.is_dir():
            feeds = _load_folder(path, specs, value)
        elif path.is_file():
            if path.suffix.lower() != ".npz":
                raise StepError(f"{value} is neither an .npz file nor a folder of .npy files")
            feeds = _load_npz(path, specs, value)
        else:
            raise StepError(f"data not found: {path}")
        if limit is not None:
            feeds = feeds[:limit]
    if not feeds:
        raise StepError(f"data {value} holds no samples; expected samples for inputs {_expected(specs)}")
    return Samples(feeds, value)


def _batch_names(specs: list[TensorSpec]) -> set[str]:
    return {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], str)}


def is_batch(d: int | str | None, axis: int, batch_names: set[str]) -> bool:
    """Whether a dim the model does not fix is the batch: axis 0, or a symbolic name that is
    axis 0 of some input. (A time-major model's axis 0 is its sequence: declare it.)"""
    return axis == 0 or (isinstance(d, str) and d in batch_names)


def _declared_shapes(specs: list[TensorSpec], decls: InputDecls | None) -> tuple[dict[str, list[int]], dict[str, int]]:
    """(input -> its declared shape as check 0 takes it, symbolic dim name -> the size a
    declared shape gives it)."""
    shapes: dict[str, list[int]] = {}
    named: dict[str, int] = {}
    for spec in specs:
        decl = (decls or {}).get(spec.name)
        if decl is not None and decl.shape is not None:
            shapes[spec.name] = shape_for(spec, decl, 0)
            named.update((d, size) for d, size in zip(spec.shape, shapes[spec.name]) if isinstance(d, str))
    return shapes, named


def undeclared_dims(specs: list[TensorSpec], decls: InputDecls | None) -> list[tuple[TensorSpec, int]]:
    """(input, axis) of each dim that the model does not fix, that is not the batch
    (``is_batch``) and that no declaration gives a size (``[inputs.NAME] shape``, of its input
    or of another whose dim has the same name): a sequence length, an image's height or width.
    A measurement must not guess these."""
    batch_names = _batch_names(specs)
    shapes, named = _declared_shapes(specs, decls)
    return [(spec, axis) for spec in specs if spec.name not in shapes
            for axis, d in enumerate(spec.shape)
            if not isinstance(d, int) and d not in named and not is_batch(d, axis, batch_names)]


def measured_specs(specs: list[TensorSpec], decls: InputDecls | None, batch: int, other: int) -> list[TensorSpec]:
    """Specs with the sizes a measurement feeds: a declared shape where its input declares one
    (a range: its opt, else its min); in the other inputs, a dim named like a declared one
    takes its size, the batch (``is_batch``) ``batch`` and any other open dim ``other``."""
    batch_names = _batch_names(specs)
    shapes, named = _declared_shapes(specs, decls)
    return [replace(spec, shape=tuple(shapes[spec.name])) if spec.name in shapes else
            replace(spec, shape=tuple(d if isinstance(d, int) else named[d] if d in named
                                      else batch if is_batch(d, axis, batch_names) else other
                                      for axis, d in enumerate(spec.shape)))
            for spec in specs]


def random_samples(specs: list[TensorSpec], count: int, seed: int, *, dynamic_size: int = 1,
                   int_range: tuple[int, int] = (0, 8), decls: InputDecls | None = None) -> Samples:
    """Seeded samples of the declared shapes: standard normal floats, uniform integers in
    ``int_range`` (high exclusive), uniform booleans; unknown dims get ``dynamic_size``.
    An input in ``decls`` follows its declaration instead, sample ``k`` as check ``k`` (its
    unknown dims too get ``dynamic_size`` where it declares no shape)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = []
    for k in range(count):
        feed = {}
        for spec in specs:
            decl = (decls or {}).get(spec.name)
            if decl is not None and decl.shape is not None:
                shape = shape_for(spec, decl, k)
            else:
                shape = [d if isinstance(d, int) else dynamic_size for d in spec.shape]
            feed[spec.name] = values(rng, spec, decl, shape, k, (int_range[0], int_range[1] - 1))
        feeds.append(feed)
    return Samples(feeds, f"random (seed {seed})" + (", declared inputs" if decls else ""))


# --- seeded inputs from declarations (the steps' checks) ---------------------------------------
def _pick(dim: int | list[int], check: int) -> int:
    """Check ``check``'s size of a declared dim: [min, opt, max] -> opt, min, max; [min, max] ->
    min, max, midpoint."""
    if isinstance(dim, int):
        return dim
    order = [dim[1], dim[0], dim[2]] if len(dim) == 3 else [dim[0], dim[1], (dim[0] + dim[1]) // 2]
    return order[check % 3]


def shape_for(spec: TensorSpec, decl: InputDecl | None, check: int) -> list[int]:
    if decl is not None and decl.shape is not None:
        return [_pick(dim, check) for dim in decl.shape]
    return [d if isinstance(d, int) else UNDECLARED_SIZES[check % len(UNDECLARED_SIZES)] for d in spec.shape]


def feeds(specs: list[TensorSpec], decls: InputDecls | None, check: int, seed: int | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for check number ``check`` (seed: ``check`` unless given)."""
    import numpy as np

    rng = np.random.default_rng(check if seed is None else seed)
    feed = {}
    for spec in specs:
        decl = (decls or {}).get(spec.name)
        shape = shape_for(spec, decl, check)
        feed[spec.name] = values(rng, spec, decl, shape, check)
    return feed


def values(rng: Any, spec: TensorSpec, decl: InputDecl | None, shape: list[int], check: int,
           int_range: tuple[int, int] = DEFAULT_INT_RANGE) -> np.ndarray:
    """Seeded values for ``spec`` of ``shape``: as ``decl`` says, else N(0, 1) floats,
    uniform booleans and integers in ``int_range`` (both ends included)."""
    import numpy as np

    dtype = spec.dtype
    if dtype not in ("bool", "float32", "float16", "float64") and not dtype.startswith(("int", "uint")):
        raise StepError(f"cannot make random values for input {spec} (give a data source)")
    if decl is not None and decl.values is not None:
        if int(np.prod(shape)) == 1:
            return np.full(shape, decl.values[check % len(decl.values)]).astype(dtype)
        return rng.choice(np.asarray(decl.values), size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    low, high = decl.range if decl is not None and decl.range is not None else (None, None)
    if dtype.startswith(("int", "uint")):
        lo, hi = (int(low), int(high)) if low is not None and high is not None else int_range
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    if low is not None:
        return rng.uniform(low, high, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def describe_tried(specs: list[TensorSpec], decls: InputDecls | None, checks: list[int]) -> str:
    """What checks ``checks`` fed each input, and how to declare something else: for the
    message of a failed check."""
    parts = []
    for spec in specs:
        decl = (decls or {}).get(spec.name)
        shapes = []
        for check in checks:
            shape = shape_for(spec, decl, check)
            if shape not in shapes:
                shapes.append(shape)
        if decl is not None and decl.values is not None:
            drawn = f"values {decl.values}"
        elif spec.dtype == "bool":
            drawn = "True/False"
        elif decl is not None and decl.range is not None:
            drawn = f"in [{decl.range[0]:g}, {decl.range[1]:g}]"
        elif spec.dtype.startswith(("int", "uint")):
            drawn = f"integers {DEFAULT_INT_RANGE[0]}..{DEFAULT_INT_RANGE[1]}"
        else:
            drawn = "N(0, 1)"
        origin = "declared" if decl is not None else "the model's own"
        parts.append(f"{spec.name} {spec.dtype} {' / '.join(map(str, shapes))} {drawn} ({origin})")
    return ("fed " + "; ".join(parts) + f". Declare what the model takes in the recipe, e.g. "
            f"[inputs.{specs[0].name if specs else 'x'}] shape = [...], range = [...] or values = [...] "
            f"(see {DOCS})")
