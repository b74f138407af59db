"""Measure built models on this host: the latency and throughput of every model of the
selected steps on the backend that runs it (optbuild.backends: onnxruntime on the CPU for
ONNX and ORT-format models, OpenVINO for its IR, TensorRT engines on a GPU host), PyTorch
eager as the baseline where a recipe exports from PyTorch, and the figures of the verify
steps that checked them.

``bench(ws, targets, options)`` is what ``optbuild bench`` runs:

1. Targets are steps ("recipe:step") or recipes (every step whose output a backend runs on
   this host: onnx, export, simplify, quantize, engine, or a plug-in kind with such an
   output; the others, and engines this host cannot run, are skipped with a note).
2. They are built with ``api.build`` (the cache makes that free when nothing changed), with
   the verify steps whose candidate is one of them. ``build=False`` (``--no-build``) only
   restores from the caches and fails, naming the steps, when any would have to build.
3. Every model gets warm-up runs, then ``runs`` timed runs on seeded random inputs of the
   shapes the recipe declares, as the build's steps read them (``_declarations``: the step's
   ``inputs``, else the recipe's ``[inputs.NAME]``; a range: its opt, else its min), else of
   the model's own: a symbolic batch (optbuild.model.samples.is_batch) is ``batch`` (also the
   batch of a declared range that holds it), other open dimensions ``dim``, with a note that
   says to declare them; integer inputs (token ids) are drawn from a declared range, else the
   ``int_range`` of a verify step that checks one of the models, else [0, 8). Every model of
   a recipe gets the same inputs. An export step also gives a "PyTorch eager" row: its
   callable, loaded the way the export step loads it, run under ``torch.no_grad()`` on the
   same inputs; where ``torch.cuda.is_available()``, also a "PyTorch eager (CUDA)" row: the
   module and inputs on cuda:0, each timed call ending in ``torch.cuda.synchronize()`` (CUDA
   launches return before the GPU is done), so GPU variants have their eager baseline.
4. Timed runs are interleaved across the models of a recipe in ``rounds`` blocks (each block
   opens with one untimed run), so load from other processes on a shared host hits every
   row alike instead of whichever model was running at the time. The garbage collector is
   off while timing, as in ``timeit``.
5. ``build/<recipe>/bench.json`` is written for every recipe benched (and with ``plot``,
   ``build/<recipe>/bench.png``).

Figures per row: latency p50 / p90 / p99 / mean (ms), throughput (samples/s = batch / mean
latency), session load time, model size, speed-up against the baseline row (the reference of
the recipe's verify steps where there is one), and the verify step's cosine, max abs and
top-1 from its ``report.json``.

numpy, onnxruntime and torch are imported inside the functions that use them.
"""

from __future__ import annotations

import io
import json
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.builder.status import Status
from optbuild.common.atomic import write_atomic
from optbuild.common.errors import OptbuildError, first_line
from optbuild.common.units import human_size
from optbuild.model import timing
from optbuild.model.inputdecl import DOCS
from optbuild.model.timing import gc_off, latency_figures

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.backends.base import Backend, Manifest, TensorSpec
    from optbuild.builder.report import Reporter
    from optbuild.common.fingerprint import Fingerprint
    from optbuild.model.inputdecl import InputDecls
    from optbuild.project.recipe import StepSpec

BENCH_VERSION = 2  # 2: rows of any backend; host.runtimes says what ran them
BENCH_FILE = "bench.json"
PLOT_FILE = "bench.png"


class BenchError(OptbuildError):
    """The bench cannot run or measure what was asked (printed without a traceback)."""


@dataclass(frozen=True)
class BenchOptions:
    runs: int = 100  # timed runs per model
    warmup: int = 10  # untimed runs per model before timing
    batch: int = 1  # size of a symbolic first dimension
    threads: int | None = None  # intra-op threads (onnxruntime) / torch.set_num_threads; None: theirs
    build: bool = True  # False: restore from the caches only (--no-build)
    plot: bool = False  # also write bench.png (needs matplotlib)
    seed: int = 0  # random inputs
    dim: int = 16  # size of other symbolic dimensions
    rounds: int = 10  # interleaving blocks (1: every model's runs in one go)

    def __post_init__(self) -> None:
        for name, low in (("runs", 1), ("warmup", 0), ("batch", 1), ("dim", 1), ("rounds", 1)):
            if getattr(self, name) < low:
                raise BenchError(f"{name} must be at least {low}, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise BenchError(f"threads must be at least 1, got {self.threads}")


@dataclass
class Row:
    """One measured model (or the PyTorch module behind an export step)."""

    step: str  # recipe:step
    runtime: str  # the backend that ran it ("onnxruntime", "openvino", ...), "torch" or "torch-cuda"
    label: str  # "ORT static INT8", "PyTorch eager", ...
    precision: str  # "fp32", "static INT8", ...
    artifact: Path | None  # the model file (for torch: the export's callable)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> shape, dtype
    batch: int = 1
    load_ms: float = 0.0
    size_bytes: int | None = None
    times_ns: list[int] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    throughput: float = 0.0  # samples per second
    speedup: float | None = None  # baseline p50 / this p50
    verify: list[dict[str, Any]] = field(default_factory=list)
    runner: str = ""  # what ran it, with its version: "onnxruntime 1.23.2 (CPU)"
    on_gpu: bool = False  # it ran on an NVIDIA GPU

    @property
    def name(self) -> str:
        return f"{self.step} ({self.runtime})"

    def as_json(self, root: Path) -> dict[str, Any]:
        artifact = None
        if self.artifact is not None:
            artifact = str(self.artifact.relative_to(root)) if self.artifact.is_relative_to(root) \
                else str(self.artifact)
        return {
            "step": self.step, "runtime": self.runtime, "runner": self.runner, "label": self.label,
            "precision": self.precision, "artifact": artifact, "size_bytes": self.size_bytes, "inputs": self.inputs,
            "batch": self.batch, "load_ms": round(self.load_ms, 3),
            "latency_ms": {k: round(v, 4) for k, v in self.latency_ms.items()},
            "throughput": round(self.throughput, 2), "speedup": None if self.speedup is None
            else round(self.speedup, 3), "verify": self.verify,
        }


@dataclass
class RecipeBench:
    """The bench of one recipe: its rows, what was skipped, and where it was written."""

    recipe: str
    rows: list[Row]
    settings: dict[str, Any]
    host: dict[str, Any]
    baseline: Row | None = None
    notes: list[str] = field(default_factory=list)
    file: Path | None = None  # bench.json
    plot_file: Path | None = None

    def as_json(self, root: Path) -> dict[str, Any]:
        return {
            "version": BENCH_VERSION, "recipe": self.recipe,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": self.host, "settings": self.settings,
            "baseline": None if self.baseline is None else {"step": self.baseline.step,
                                                             "runtime": self.baseline.runtime},
            "rows": [row.as_json(root) for row in self.rows], "notes": self.notes,
        }


# --- what to bench -------------------------------------------------------------------------
def runs_on(spec: StepSpec) -> tuple[Backend, Manifest] | None:
    """What runs the step's main output (optbuild.backends.registry); None: not a model."""
    from optbuild.backends import registry

    return registry.for_step(spec.step)


# Kinds whose model is a copy of another step's (benched there): benchmark, select.
CARRIERS = ("benchmark", "select")


def not_benched(spec: StepSpec, host: Fingerprint) -> str | None:
    """Why bench cannot run the step's output on this host; None when it can."""
    if spec.kind in CARRIERS:
        return "carries the model of the step it measured or chose"
    on = runs_on(spec)
    if on is None:
        return "no model output"
    backend, manifest = on
    return backend.unavailable(host, manifest)


def _refusal(spec: StepSpec, why: str) -> str:
    on = runs_on(spec)
    if on is None:
        return (f"{spec.id} is a {spec.kind} step: its output ({spec.step.primary_output or 'no file'}) is "
                "not a model a backend runs; bench takes steps that give models (onnx, export, simplify, "
                "quantize, engine) or a recipe")
    source = spec.deps.get("input")
    hint = f"; bench the model it is built from ({source})" if source else ""
    return (f"{spec.id} is a {on[0].label} engine ({spec.step.primary_output}) and this host cannot run it: "
            f"{why}{hint}")


def select(ws: Workspace, targets: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(recipe -> model steps to bench, recipe -> notes on the steps skipped), in graph order."""
    if not targets:
        raise BenchError("name a recipe or a recipe:step to bench")
    steps = ws.project.steps
    recipes = {spec.recipe for spec in steps.values()}
    wanted: set[str] = set()
    skipped: dict[str, dict[str, list[str]]] = {}
    host = _fingerprint()
    for target in targets:
        if target in steps:
            if (why := not_benched(steps[target], host)) is not None:
                raise BenchError(_refusal(steps[target], why))
            wanted.add(target)
        elif target in recipes:
            found = False
            for sid, spec in steps.items():
                if spec.recipe != target:
                    continue
                if (why := not_benched(spec, host)) is None:
                    wanted.add(sid)
                    found = True
                else:
                    if (on := runs_on(spec)) is not None:
                        why = f"{on[0].label} engines: {why}"
                    skipped.setdefault(target, {}).setdefault(why, []).append(spec.name)
            if not found:
                raise BenchError(f"recipe {target!r} has no step that gives a model this host can run")
        else:
            ws.graph.select([target])  # raises "unknown target ...; did you mean ...?"
            raise BenchError(f"unknown target {target!r}")
    chosen: dict[str, list[str]] = {}
    for sid in ws.graph.order:
        if sid in wanted:
            chosen.setdefault(steps[sid].recipe, []).append(sid)
    notes = {recipe: [f"not benched ({why}): {', '.join(names)}" for why, names in by_reason.items()]
             for recipe, by_reason in skipped.items() if recipe in chosen}
    return chosen, notes


def verify_steps(ws: Workspace, models: list[str]) -> dict[str, list[str]]:
    """model step -> the verify steps whose candidate it is."""
    found: dict[str, list[str]] = {}
    for sid in ws.graph.order:
        spec = ws.project.steps[sid]
        if spec.kind == "verify" and (candidate := spec.deps.get("candidate")) in models:
            found.setdefault(candidate, []).append(sid)
    return found


# --- labels ----------------------------------------------------------------------------------
def precision(ws: Workspace, sid: str, _seen: frozenset[str] = frozenset()) -> str:
    """What a model computes in: a quantize step's mode or an engine's precision, else that of
    the model it came from."""
    spec = ws.project.steps[sid]
    params = spec.step.params
    mode = getattr(params, "mode", None) if spec.kind == "quantize" else None
    if mode in ("static", "dynamic"):
        return f"{mode} INT8"
    chosen = mode or getattr(params, "precision", None)
    if isinstance(chosen, str) and chosen != "fp32":
        return chosen.upper() if chosen.startswith("int") else chosen
    source = spec.deps.get("input")
    if source is not None and source not in _seen and source in ws.project.steps:
        return precision(ws, source, _seen | {sid})
    return "source" if spec.kind == "onnx" else "fp32"


def _label(ws: Workspace, sid: str, backend: Backend) -> str:
    """"ORT static INT8", "OV INT8": the backend and the precision. An engine built for the
    runtime that also runs the model it came from (onnxruntime's offline-optimized model) is
    told apart from that model as "ORT-optimized"."""
    spec = ws.project.steps[sid]
    source = ws.project.steps.get(spec.deps.get("input", ""))
    same = spec.kind.startswith("engine/") and source is not None and (on := runs_on(source)) is not None \
        and on[0].name == backend.name
    return f"{backend.short}{'-optimized' if same else ''} {precision(ws, sid)}"


@cache
def _fingerprint() -> Fingerprint:
    """This host, as the backends judge whether they can run here."""
    from optbuild.common.fingerprint import Fingerprint

    return Fingerprint()


# --- building --------------------------------------------------------------------------------
def _build(ws: Workspace, models: list[str], verifies: list[str], options: BenchOptions,
           reporter: Reporter | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Build (or restore) the models and their verify steps: (outcomes, verify step -> note
    for those that gave no report)."""
    from optbuild import api
    from optbuild.builder.report import Reporter

    result = api.build(ws, [*models, *verifies], reporter=reporter or Reporter(), keep_going=True,
                       fetch_only=not options.build)
    outcomes = result.outcomes
    needed = ws.graph.select(models)
    missing = [sid for sid in needed if outcomes.get(sid) is not None and outcomes[sid].status == Status.WOULD_BUILD]
    if missing:
        listed = "\n".join(f"  {sid}" + (f"  ({'; '.join(outcomes[sid].reasons)})" if outcomes[sid].reasons else "")
                           for sid in missing)
        raise BenchError(f"--no-build: {len(missing)} step(s) the bench needs are in neither the local nor "
                         f"the remote cache:\n{listed}\ndrop --no-build to build them here, or build them first "
                         f"(optbuild build {' '.join(models)})")
    problems = []
    for sid in models:
        outcome = outcomes.get(sid)
        if outcome is None or not outcome.status.ok:
            status = outcome.status if outcome is not None else "not built"
            error = (outcome.error or "").strip() if outcome is not None else ""
            if not error and outcome is not None and outcome.status == Status.SKIPPED:
                error = "an upstream step failed"
            problems.append(f"{sid} is {status}" + (f": {error}" if error else ""))
    if problems:
        raise BenchError("cannot bench what did not build:\n" + "\n".join(problems))
    notes = {}
    for sid in verifies:
        outcome = outcomes.get(sid)
        if outcome is None or not outcome.status.ok:
            status = outcome.status if outcome is not None else "not built"
            what = {Status.FAILED: "failed (a threshold is exceeded or it could not run: see the build output)",
                    Status.WOULD_BUILD: "is not built (--no-build)"}.get(status, f"is {status}")
            notes[sid] = f"{sid} {what}: no verify figures from it"
    return outcomes, notes


def _artifact(ws: Workspace, sid: str, outcome: Any) -> Path:
    spec = ws.project.steps[sid]
    primary = outcome.entry.primary if outcome.entry is not None else None
    path = ws.project.build_dir / spec.recipe / spec.name / primary if primary else None
    if path is None or not path.is_file():
        raise BenchError(f"{sid} has no model file in {ws.project.build_dir / spec.recipe / spec.name}")
    return path


def _verify_figures(ws: Workspace, sid: str, outcome: Any) -> dict[str, Any] | None:
    """The figures of a verify step's report.json: worst over outputs, and per output."""
    spec = ws.project.steps[sid]
    path = ws.project.build_dir / spec.recipe / spec.name / (outcome.entry.primary or "report.json")
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    outputs = report.get("outputs") or {}

    def worst(metric: str, pick: Callable) -> float | None:
        values = [f[metric] for f in outputs.values() if isinstance(f.get(metric), (int, float))]
        return pick(values) if values else None

    return {
        "step": sid, "reference": spec.deps.get("reference"),  # the report names files, not steps
        "cosine": worst("cosine", min), "max_abs": worst("max_abs", max), "top1": worst("top1", min),
        "passed": report.get("passed"), "samples": (report.get("data") or {}).get("samples"),
        "data": (report.get("data") or {}).get("source"),
        "outputs": {name: {k: f.get(k) for k in ("cosine", "cosine_min", "max_abs", "max_rel", "top1")}
                    for name, f in outputs.items()},
    }


# --- inputs ----------------------------------------------------------------------------------
def _int_range(ws: Workspace, verifies: list[str]) -> tuple[int, int]:
    for sid in verifies:
        value = getattr(ws.project.steps[sid].step.params, "int_range", None)
        if value:
            return int(value[0]), int(value[1])
    return 0, 8


def _declarations(ws: Workspace, sid: str) -> InputDecls | None:
    """What the recipe declares of the step's model inputs, as its build read it: the step's
    ``inputs`` (the recipe's [inputs.NAME] with the step's own entries), or for a kind without
    that parameter (an onnx source) the recipe's [inputs.NAME], read again from its file (the
    project keeps them only inside the steps' parameters)."""
    from optbuild.project import template
    from optbuild.project.recipe import RecipeInputs
    from optbuild.project.tomlsource import load_toml

    spec = ws.project.steps[sid]
    if "inputs" in type(spec.step.params).model_fields:
        return spec.step.params.inputs
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
class _Runner:
    row: Row
    call: Callable[[], Any]


def _model_size(path: Path) -> int:
    """The bytes of a model: its file and the files that share its stem (model.xml and
    model.bin, an .onnx and its external data named after it)."""
    return sum(p.stat().st_size for p in path.parent.iterdir() if p.is_file() and p.name.startswith(path.stem))


def _model_runner(ws: Workspace, sid: str, path: Path, options: BenchOptions, int_range: tuple[int, int],
                  stack: ExitStack) -> tuple[_Runner, list[str]]:
    """The step's model, opened by the backend that runs it, on seeded inputs."""
    from optbuild.backends import registry
    from optbuild.model import samples as sampling

    backend, manifest = registry.for_artifact(path, sid)
    try:
        runner = stack.enter_context(backend.open(path, manifest, _fingerprint(), threads=options.threads))
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
    row = Row(sid, backend.name, _label(ws, sid, backend), precision(ws, sid), path,
              inputs={s.name: {"shape": list(s.shape), "dtype": s.dtype} for s in specs},
              batch=_batch_of(specs), load_ms=runner.load_ms, size_bytes=_model_size(path), runner=runner.label,
              on_gpu=runner.on_gpu)
    return _Runner(row, runner.timed_call(feeds)), notes  # on a GPU: device time, not the host's copies


@contextmanager
def _torch_runner(ws: Workspace, sid: str, export_model: Path, options: BenchOptions,
                  int_range: tuple[int, int], outcomes: dict[str, Any], device: str = "cpu") -> Iterator[_Runner]:
    """The export step's PyTorch module, loaded as the export step loads it, on the inputs the
    exported model gets, on ``device`` ("cpu" or "cuda"). Open while measuring: the model's
    sibling modules stay importable."""
    import torch

    from optbuild.backends import registry
    from optbuild.model import samples as sampling
    from optbuild.steps.base import Artifact, StepContext

    spec = ws.project.steps[sid]
    step = spec.step  # an optbuild.steps.export.Export
    upstream = {}  # what its worker saw: the outputs of the steps it names (weights_from)
    for field_name, dep in spec.deps.items():
        dep_spec, outcome = ws.project.steps[dep], outcomes.get(dep)
        folder = ws.project.build_dir / dep_spec.recipe / dep_spec.name
        primary = outcome.entry.primary if outcome is not None and outcome.entry is not None else None
        files = {p.name: p for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}
        upstream[field_name] = Artifact(dep, folder, files, folder / primary if primary else None)
    ctx = StepContext(sid, step.base_dir, ws.project.root, export_model.parent, upstream, _fingerprint())
    cuda = device == "cuda"
    started = time.perf_counter()
    with step.load_module(ctx) as (module, examples):
        load_ms = (time.perf_counter() - started) * 1000
        # the inputs the exported model gets (same seed, same shapes), by the export's input names
        backend, manifest = registry.for_artifact(export_model, sid)
        with backend.open(export_model, manifest, _fingerprint()) as exported:
            specs, decls, _ = _inputs(ws, sid, exported.input_specs(), options)  # noted with the model's row
        feeds = sampling.random_samples(specs, 1, options.seed, int_range=int_range, decls=decls).feeds[0]
        names = list(step.params.input_names) or [s.name for s in specs]
        args = tuple(torch.from_numpy(feeds[names[i]]) if i < len(names) and names[i] in feeds else example
                     for i, example in enumerate(examples))
        what = f"the PyTorch module of {sid} ({step.params.model})"
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

        source = ctx.path(step.params.model.rpartition(":")[0])
        runner = (f"torch {torch.__version__} (CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)})"
                  if cuda else "")
        row = Row(sid, "torch-cuda" if cuda else "torch", "PyTorch eager (CUDA)" if cuda else "PyTorch eager",
                  precision(ws, sid), source, inputs={s.name: {"shape": list(s.shape), "dtype": s.dtype} for s in specs},
                  batch=int(args[0].shape[0]) if args and args[0].dim() else 1, load_ms=load_ms, runner=runner)
        yield _Runner(row, call_cuda if cuda else call)


# --- measuring -------------------------------------------------------------------------------
def measure(runners: list[_Runner], options: BenchOptions, say: Callable[[str], None] = lambda message: None) -> None:
    """Warm up every runner, then time ``runs`` calls of each, interleaved in blocks; ``say``
    what it does (a bench of a large model takes minutes)."""
    for runner in runners:
        if options.warmup:
            say(f"  warm-up  {runner.row.name}")
        for _ in range(options.warmup):
            runner.call()
    blocks = timing.blocks(options.runs, options.rounds)
    say(f"  timing   {len(runners)} model{'s' if len(runners) > 1 else ''}: {options.runs} runs each"
        + (f", interleaved in {len(blocks)} rounds" if len(blocks) > 1 and len(runners) > 1 else ""))
    clock = time.perf_counter_ns
    with gc_off():
        for size in blocks:
            for runner in runners:
                if len(blocks) > 1:
                    runner.call()  # untimed: caches and thread pools after the previous model
                times = runner.row.times_ns
                call = runner.call
                for _ in range(size):
                    started = clock()
                    call()
                    times.append(clock() - started)
    for runner in runners:
        row = runner.row
        row.latency_ms = latency_figures(row.times_ns)
        row.throughput = row.batch / (row.latency_ms["mean"] / 1000)
        say(f"  measured {row.name}  p50 {_ms(row.latency_ms['p50'])} ms")


def _baseline(rows: list[Row]) -> Row | None:
    """The reference most verify steps compare with, else the first fp32 model row that is
    not an optimized engine of a plain model's runtime."""
    references = Counter(v["reference"] for row in rows for v in row.verify if v.get("reference"))
    for reference, _ in references.most_common():
        for row in rows:
            if row.step == reference and not row.runtime.startswith("torch"):
                return row
    if len(rows) < 2:
        return None
    models = [row for row in rows if not row.runtime.startswith("torch")]
    fp32 = [row for row in models if row.precision == "fp32" and "-optimized " not in row.label]
    return (fp32 or models or rows or [None])[0]


def _host(rows: list[Row], torch_version: str | None) -> dict[str, Any]:
    import numpy

    host = _fingerprint()
    return {"hostname": platform.node(), "cpu": host.get("cpu.model"), "arch": host.get("cpu.arch"),
            "cpu_count": host.get("cpu.count"), "os": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "runtimes": sorted({row.runner for row in rows if row.runner}), "torch": torch_version}


def _imports() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError as exc:
        raise BenchError(f"bench needs numpy ({exc}): pip install 'optbuild[onnx]'") from None


def _cuda_available() -> bool:
    """Whether torch can run on a GPU here (a CUDA build of torch, and a GPU it sees)."""
    import torch

    return torch.cuda.is_available()


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def bench(ws: Workspace, targets: list[str], options: BenchOptions | None = None, *,
          reporter: Reporter | None = None, progress: Callable[[str], None] | None = None) -> list[RecipeBench]:
    """Build ``targets`` (or with ``options.build`` False, restore them), measure their models,
    and write ``build/<recipe>/bench.json`` for each recipe. Returns one result per recipe.
    ``progress`` gets a line as each model (and runtime) is loaded, warmed up and measured."""
    options = options or BenchOptions()
    say = progress or (lambda message: None)
    if options.plot:
        _plot_module()  # fail before minutes of measuring, not after
    chosen, skipped = select(ws, targets)
    models = [sid for sids in chosen.values() for sid in sids]
    verify_of = verify_steps(ws, models)
    verifies = [v for sid in models for v in verify_of.get(sid, [])]
    _imports()
    outcomes, build_notes = _build(ws, models, list(dict.fromkeys(verifies)), options, reporter)
    figures = {v: f for v in dict.fromkeys(verifies)
               if outcomes.get(v) is not None and outcomes[v].status.ok
               and (f := _verify_figures(ws, v, outcomes[v])) is not None}
    torch_version = _torch_version() if any(ws.project.steps[s].kind == "export" for s in models) else None
    results = []
    for recipe, sids in chosen.items():
        notes = list(skipped.get(recipe, []))
        recipe_verifies = [v for sid in sids for v in verify_of.get(sid, [])]
        notes += [build_notes[v] for v in dict.fromkeys(recipe_verifies) if v in build_notes]
        int_range = _int_range(ws, recipe_verifies)
        runners: list[_Runner] = []
        eager = [sid for sid in sids if ws.project.steps[sid].kind == "export" and torch_version is not None]
        devices = ["cpu", *(["cuda"] if eager and _cuda_available() else [])]
        say(f"bench {recipe}: {len(sids) + len(eager) * len(devices)} models, {options.warmup} warm-up + "
            f"{options.runs} timed runs each, batch {options.batch}, threads {options.threads or 'default'}")
        with ExitStack() as stack:
            for sid in sids:
                path = _artifact(ws, sid, outcomes[sid])
                if ws.project.steps[sid].kind == "export":
                    if torch_version is None:
                        notes.append(f"{sid}: no PyTorch eager baseline: torch is not installed "
                                     "(pip install 'optbuild[torch]')")
                    else:
                        for device in devices:
                            say(f"  load     {sid} (torch{'' if device == 'cpu' else ', ' + device})")
                            runners.append(stack.enter_context(
                                _torch_runner(ws, sid, path, options, int_range, outcomes, device)))
                say(f"  load     {sid} ({runs_on(ws.project.steps[sid])[0].name})")
                runner, row_notes = _model_runner(ws, sid, path, options, int_range, stack)
                runners.append(runner)
                notes += [note for note in row_notes if note not in notes]  # the recipe's models share inputs
                runner.row.verify = [figures[v] for v in verify_of.get(sid, []) if v in figures]
            if eager and "cuda" not in devices and any(r.row.on_gpu for r in runners):
                notes.append("no PyTorch eager (CUDA) row beside the CUDA models: torch.cuda.is_available() "
                             f"is false for torch {torch_version} (a CPU build of torch?); install a CUDA build "
                             "of torch to get one")
            load = timing.host_load()
            if (busy := timing.busy_note(load)) is not None:
                notes.append(busy)
            with _torch_threads(options.threads, any(r.row.runtime.startswith("torch") for r in runners)) \
                    as torch_threads:
                measure(runners, options, say)
        rows = [r.row for r in runners]
        baseline = _baseline(rows)
        if baseline is not None:
            for row in rows:
                row.speedup = baseline.latency_ms["p50"] / row.latency_ms["p50"]
        settings = {"runs": options.runs, "warmup": options.warmup, "batch": options.batch,
                    "threads": options.threads, "torch_threads": torch_threads, "seed": options.seed,
                    "other_dims": options.dim, "int_range": list(int_range),
                    "rounds": len(timing.blocks(options.runs, options.rounds)), "gc_disabled": True}
        result = RecipeBench(recipe, rows, settings, {**_host(rows, torch_version), "load_average": load["load_average"]},
                             baseline, notes)
        out_dir = ws.project.build_dir / recipe
        result.file = out_dir / BENCH_FILE
        write_atomic(result.file, (json.dumps(result.as_json(ws.project.root), indent=1) + "\n").encode())
        if options.plot:
            result.plot_file = out_dir / PLOT_FILE
            plot(result, result.plot_file)
        results.append(result)
    return results


@contextmanager
def _torch_threads(threads: int | None, used: bool) -> Iterator[int | None]:
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


# --- presenting ------------------------------------------------------------------------------
COLUMNS = ("model", "step", "size", "p50 ms", "p90 ms", "p99 ms", "samples/s", "speed-up",
           "cosine", "max abs", "top-1", "verified by")


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def table_rows(result: RecipeBench) -> list[list[str]]:
    """The table's cells, as text (COLUMNS)."""
    cells = []
    for row in result.rows:
        verify = row.verify[0] if row.verify else {}

        def fig(key: str, fmt: str, verify: dict[str, Any] = verify) -> str:
            value = verify.get(key)
            return format(value, fmt) if isinstance(value, (int, float)) else ""

        step = row.step.split(":", 1)[1]
        speedup = "" if row.speedup is None else f"{row.speedup:.2f}x"
        if row is result.baseline:
            speedup += " (base)"
        checked = ""
        if verify:
            checked = verify["step"].split(":", 1)[1] + ("" if verify.get("passed") else " FAILED")
            if len(row.verify) > 1:
                checked += f" (+{len(row.verify) - 1})"
        cells.append([
            row.label, step, "" if row.size_bytes is None else human_size(row.size_bytes),
            _ms(row.latency_ms["p50"]), _ms(row.latency_ms["p90"]), _ms(row.latency_ms["p99"]),
            f"{row.throughput:,.0f}", speedup, fig("cosine", ".5f"), fig("max_abs", ".3g"),
            fig("top1", ".3f"), checked,
        ])
    return cells


def title(result: RecipeBench) -> str:
    s = result.settings
    threads = f"{s['threads']} thread{'s' if s['threads'] != 1 else ''}" if s["threads"] else "default threads"
    versions = ", ".join([*result.host.get("runtimes", []),
                          *([f"torch {result.host['torch']}"] if result.host.get("torch") else [])])
    return (f"{result.recipe}: batch {s['batch']}, {threads}, {s['runs']} timed runs after {s['warmup']} "
            f"warm-up ({versions}; {result.host.get('cpu') or result.host.get('arch')})")


def footer(result: RecipeBench) -> list[str]:
    lines = []
    if result.baseline is not None:
        lines.append(f"speed-up: p50 of {result.baseline.step} ({result.baseline.label}) / p50 of the row; "
                     "samples/s: batch / mean latency")
    refs = sorted({v["reference"] for row in result.rows for v in row.verify if v.get("reference")})
    if refs:
        lines.append(f"cosine, max abs, top-1: the verify step's report, candidate vs {', '.join(refs)}")
    lines += [f"note: {n}" for n in result.notes]
    if result.file is not None:
        lines.append(f"written: {result.file}" + (f", {result.plot_file}" if result.plot_file else ""))
    return lines


def plain_table(result: RecipeBench) -> str:
    cells = table_rows(result)
    right = {2, 3, 4, 5, 6, 7, 8, 9, 10}
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in cells)) for i in range(len(COLUMNS))]

    def line(values: list[str] | tuple[str, ...]) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return "\n".join([title(result), line(COLUMNS), line(["-" * w for w in widths]),
                      *(line(r) for r in cells), *footer(result)])


def rich_table(result: RecipeBench) -> Any:  # rich.table.Table
    """The table for a terminal (title and footer are printed apart: see print_rich)."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i in (0, 1, 11) else "right", no_wrap=True)
    for row, cells in zip(result.rows, table_rows(result)):
        table.add_row(*cells, style="bold" if row is result.baseline else None)
    return table


def print_rich(results: list[RecipeBench]) -> None:
    """Rich tables on stdout, never squeezed: a terminal narrower than a table wraps its lines."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(highlight=False)
    terminal = console.width
    for i, result in enumerate(results):
        table = rich_table(result)
        natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
        console.width = max(terminal, natural)
        if i:
            console.print()
        console.print(title(result), style="bold", markup=False)
        console.print(table)
        for line in footer(result):
            console.print(line, style="dim", markup=False)


def _plot_module() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(result: RecipeBench, path: Path) -> None:
    """Horizontal bars per row: p50 latency, with p99 beside it."""
    plt = _plot_module()
    labels = [f"{row.label}\n{row.step.split(':', 1)[1]}" for row in result.rows]
    p50 = [row.latency_ms["p50"] for row in result.rows]
    p99 = [row.latency_ms["p99"] for row in result.rows]
    positions = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(labels)))
    try:
        ax.barh([p - 0.2 for p in positions], p50, height=0.4, label="p50", color="#4c72b0")
        ax.barh([p + 0.2 for p in positions], p99, height=0.4, label="p99", color="#dd8452")
        for p, a, b in zip(positions, p50, p99):
            ax.text(a, p - 0.2, f" {_ms(a)}", va="center", fontsize=8)
            ax.text(b, p + 0.2, f" {_ms(b)}", va="center", fontsize=8)
        ax.set_yticks(positions, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("latency (ms)")
        ax.set_title(title(result), fontsize=8, loc="left", wrap=True)
        ax.legend(loc="lower right")
        ax.set_xlim(0, max(p99) * 1.2)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=120)
        write_atomic(path, png.getbuffer())
    finally:
        plt.close(fig)


def as_json(results: list[RecipeBench], root: Path) -> dict[str, Any]:
    return {"version": BENCH_VERSION,
            "recipes": [{**r.as_json(root), "file": str(r.file) if r.file else None,
                         "plot": str(r.plot_file) if r.plot_file else None} for r in results]}
