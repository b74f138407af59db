"""The inputs a model is measured at, and the runners that call it: each model on the backend
that runs it, and PyTorch eager (CPU, CUDA) behind an export step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from optbuild.app.bench.results import BenchError, BenchOptions, Row
from optbuild.app.bench.targets import host_fingerprint, label, precision
from optbuild.common.errors import OptbuildError, first_line
from optbuild.model.inputdecl import DOCS

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.backends.base import TensorSpec
    from optbuild.builder.outcome import Outcome
    from optbuild.model.inputdecl import InputDecls


# --- inputs ----------------------------------------------------------------------------------
def verified_int_range(ws: Workspace, verifies: list[str]) -> tuple[int, int]:
    for sid in verifies:
        value = getattr(ws.project.steps[sid].step.params, "int_range", None)
        if value:
            return int(value[0]), int(value[1])
    return 0, 8


def _declarations(ws: Workspace, sid: str) -> InputDecls | None:
    """What the recipe declares of the step's model inputs: the recipe's [inputs.NAME] with the
    step's own entries, whole (``StepSpec.declared``; the step reads a part), or for a kind without
    that parameter (an onnx source) the recipe's [inputs.NAME], read again from its file (the
    project keeps them only inside the steps' parameters)."""
    from optbuild.project import template
    from optbuild.project.config import RecipeInputs
    from optbuild.project.tomlsource import load_toml

    spec = ws.project.steps[sid]
    if "inputs" in type(spec.step.params).model_fields:
        return spec.declared
    data, _ = template.instantiate(load_toml(ws.project.recipes[spec.recipe]), [])
    return RecipeInputs.model_validate({"inputs": data.get("inputs", {})}).inputs or None


def _inputs(ws: Workspace, sid: str, declared: list[TensorSpec],
            options: BenchOptions) -> tuple[list[TensorSpec], InputDecls | None, list[str]]:
    """(the shapes the step's model is measured at, the declarations its values follow, notes):
    the declarations with ``batch`` on each declared batch range that holds it; a note for a
    declared batch it does not fit and for each open dimension measured at ``dim`` undeclared."""
    from optbuild.model import samples as sampling
    from optbuild.model.inputdecl import check_declarations, sizes

    decls = dict(_declarations(ws, sid) or {})
    try:
        check_declarations(declared, decls, sid)
    except OptbuildError as exc:
        raise BenchError(f"{exc} (declared in {ws.project.recipes[ws.project.steps[sid].recipe]})") from None
    notes = []
    for spec in declared:
        decl = decls.get(spec.name)
        if decl is None or decl.shape is None or not spec.shape or isinstance(spec.shape[0], int):
            continue
        low, high = sizes(decl.shape[0])[0], sizes(decl.shape[0])[-1]
        if low <= options.batch <= high:
            decls[spec.name] = decl.model_copy(update={"shape": [options.batch, *decl.shape[1:]]})
        else:
            notes.append(f"[inputs.{spec.name}] declares batch {decl.shape[0]}: --batch {options.batch} "
                         "does not apply to it")
    notes += [f"{spec.name} dim {axis}" + (f" ({spec.shape[axis]!r})" if isinstance(spec.shape[axis], str) else "")
              + f" is not declared: measured at {options.dim}; declare the size it serves at with "
              f"[inputs.{spec.name}] shape = [...] in the recipe" for spec, axis in sampling.undeclared_dims(declared, decls)]
    return sampling.measured_specs(declared, decls, options.batch, options.dim), decls or None, notes


def _batch_of(specs: list[TensorSpec]) -> int:
    first = specs[0].shape if specs else ()
    return int(first[0]) if first and isinstance(first[0], int) else 1


# --- runners ---------------------------------------------------------------------------------
@dataclass
class Runner:
    row: Row
    call: Callable[[], Any]


def _model_size(path: Path) -> int:
    """The bytes of a model: its file and the files that share its stem (model.xml and
    model.bin, an .onnx and its external data named after it)."""
    return sum(p.stat().st_size for p in path.parent.iterdir() if p.is_file() and p.name.startswith(path.stem))


def model_runner(ws: Workspace, sid: str, path: Path, options: BenchOptions, int_range: tuple[int, int],
                  stack: ExitStack) -> tuple[Runner, list[str]]:
    """The step's model, opened by the backend that runs it, on seeded inputs."""
    from optbuild.backends import registry
    from optbuild.model import samples as sampling

    backend, manifest = registry.for_artifact(path, sid)
    try:
        runner = stack.enter_context(backend.open(path, manifest, host_fingerprint(), threads=options.threads))
    except Exception as exc:
        raise BenchError(f"{backend.label} cannot load {sid} ({path.name}): {type(exc).__name__}: "
                         f"{first_line(exc)}") from None
    declared = runner.input_specs()
    specs, decls, notes = _inputs(ws, sid, declared, options)
    feeds = runner.cast(sampling.random_samples(specs, 1, options.seed, int_range=int_range, decls=decls).feeds[0])
    if declared and declared[0].shape and isinstance(declared[0].shape[0], int) \
            and declared[0].shape[0] != options.batch:
        notes.append(f"{sid}: the model fixes batch {declared[0].shape[0]}; --batch {options.batch} "
                     "does not apply to it")
    try:
        runner.infer(feeds)
    except Exception as exc:
        shapes = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in specs)
        raise BenchError(f"{sid} fails on {runner.label} with inputs {shapes}: {type(exc).__name__}: "
                         f"{first_line(exc)}; declare what it takes in the recipe ([inputs.NAME] shape, range "
                         f"or values: {DOCS})") from None
    row = Row(sid, backend.name, label(ws, sid, backend), precision(ws, sid), path,
              inputs={s.name: {"shape": list(s.shape), "dtype": s.dtype} for s in specs},
              batch=_batch_of(specs), load_ms=runner.load_ms, size_bytes=_model_size(path), runner=runner.label,
              on_gpu=runner.on_gpu)
    return Runner(row, runner.timed_call(feeds)), notes  # on a GPU: device time, not the host's copies


@runtime_checkable
class LoadsModule(Protocol):
    """A step that builds its PyTorch module as it exports it (``steps.export.Export``): bench
    runs that module as the eager baseline. Its parameters may name the module's source
    (``model = "file.py:callable"``, shown in the row) and the order of its inputs
    (``input_names``); without them the row shows the exported model and the inputs go in
    the exported model's order."""

    def load_module(self, ctx: Any) -> AbstractContextManager[tuple[Any, tuple]]: ...


@contextmanager
def torch_runner(ws: Workspace, sid: str, export_model: Path, options: BenchOptions,
                 int_range: tuple[int, int], outcomes: dict[str, Outcome], device: str = "cpu") -> Iterator[Runner]:
    """The export step's PyTorch module, loaded as the export step loads it, on the inputs the
    exported model gets, on ``device`` ("cpu" or "cuda"). Open while measuring: the model's
    sibling modules stay importable."""
    import torch

    from optbuild.backends import registry
    from optbuild.model import samples as sampling
    from optbuild.steps.base import Artifact, StepContext

    spec = ws.project.steps[sid]
    step = spec.step
    if not isinstance(step, LoadsModule):
        raise BenchError(f"{sid} is a {spec.kind} step: it has no PyTorch module to run (no load_module)")
    model = getattr(step.params, "model", None)
    model = model if isinstance(model, str) else None
    upstream = {}  # what its worker saw: the outputs of the steps it names (weights_from)
    for field_name, dep in spec.deps.items():
        outcome = outcomes.get(dep)
        folder = ws.project.step_dir(dep)
        primary = outcome.entry.primary if outcome is not None and outcome.entry is not None else None
        files = {p.name: p for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}
        upstream[field_name] = Artifact(dep, folder, files, folder / primary if primary else None)
    ctx = StepContext(sid, step.base_dir, ws.project.root, export_model.parent, upstream, host_fingerprint())
    cuda = device == "cuda"
    started = time.perf_counter()
    with step.load_module(ctx) as (module, examples):
        load_ms = (time.perf_counter() - started) * 1000
        # the inputs the exported model gets (same seed, same shapes), by the export's input names
        backend, manifest = registry.for_artifact(export_model, sid)
        with backend.open(export_model, manifest, host_fingerprint()) as exported:
            specs, decls, _ = _inputs(ws, sid, exported.input_specs(), options)  # noted with the model's row
        feeds = sampling.random_samples(specs, 1, options.seed, int_range=int_range, decls=decls).feeds[0]
        names = list(getattr(step.params, "input_names", None) or ()) or [s.name for s in specs]
        args = tuple(torch.from_numpy(feeds[names[i]]) if i < len(names) and names[i] in feeds else example
                     for i, example in enumerate(examples))
        what = f"the PyTorch module of {sid}" + (f" ({model})" if model else "")
        if cuda:
            moving = time.perf_counter()
            try:
                module = module.to(device)
                args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
            except Exception as exc:
                raise BenchError(f"{what} cannot move to CUDA: {type(exc).__name__}: {first_line(exc)}") from None
            load_ms += (time.perf_counter() - moving) * 1000  # the copy to the GPU is part of loading
        with torch.no_grad():
            try:
                module(*args)
                if cuda:
                    torch.cuda.synchronize()
            except Exception as exc:
                raise BenchError(f"{what} fails on the bench inputs{' on CUDA' if cuda else ''}: "
                                 f"{type(exc).__name__}: {first_line(exc)}") from None

        def call() -> None:
            with torch.no_grad():
                module(*args)

        def call_cuda() -> None:  # the GPU's time, not the launches'
            with torch.no_grad():
                module(*args)
            torch.cuda.synchronize()

        source = ctx.path(model.rpartition(":")[0]) if model else export_model
        runner = (f"torch {torch.__version__} (CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)})"
                  if cuda else "")
        row = Row(sid, "torch-cuda" if cuda else "torch", "PyTorch eager (CUDA)" if cuda else "PyTorch eager",
                  precision(ws, sid), source, inputs={s.name: {"shape": list(s.shape), "dtype": s.dtype} for s in specs},
                  batch=int(args[0].shape[0]) if args and args[0].dim() else 1, load_ms=load_ms, runner=runner)
        yield Runner(row, call_cuda if cuda else call)


@contextmanager
def set_torch_threads(threads: int | None, used: bool) -> Iterator[int | None]:
    """torch's intra-op threads set to ``threads`` while the eager rows are timed (put back
    after); yields the number torch uses, None when no row runs torch."""
    if not used:
        yield None
        return
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
