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
   a recipe gets the same inputs. A step that loads its PyTorch module (an export:
   ``runners.LoadsModule``) also gives a "PyTorch eager" row: the module, loaded the way the
   step loads it, run under ``torch.no_grad()`` on the same inputs; where
   ``torch.cuda.is_available()``, also a "PyTorch eager (CUDA)" row: the module and inputs on
   cuda:0, each timed call ending in ``torch.cuda.synchronize()`` (CUDA launches return before
   the GPU is done), so GPU variants have their eager baseline.
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

import json
import platform
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optbuild.app.bench.build import artifact_path, build_models, verify_figures
from optbuild.app.bench.results import BENCH_FILE, BenchError, BenchOptions, RecipeBench, Row, ms
from optbuild.app.bench.runners import (
    LoadsModule,
    Runner,
    model_runner,
    set_torch_threads,
    torch_runner,
    verified_int_range,
)
from optbuild.app.bench.targets import host_fingerprint, runs_on, select, verify_steps
from optbuild.common.atomic import write_atomic
from optbuild.model import timing
from optbuild.model.timing import gc_off, latency_figures

if TYPE_CHECKING:
    from optbuild.api import Workspace
    from optbuild.builder.outcome import Outcome
    from optbuild.builder.report import Reporter


# --- measuring -------------------------------------------------------------------------------
def time_runners(runners: list[Runner], options: BenchOptions, say: Callable[[str], None] = lambda message: None) -> None:
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
        say(f"  measured {row.name}  p50 {ms(row.latency_ms['p50'])} ms")


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
    return (fp32 or models or rows)[0]


def _host(rows: list[Row], torch_version: str | None) -> dict[str, Any]:
    import numpy

    host = host_fingerprint()
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


@dataclass
class _Built:
    """What the build gave the measuring: each step's outcome, the verify steps of each model
    and their figures, and torch's version where a model step loads a PyTorch module."""

    outcomes: dict[str, Outcome]
    verify_of: dict[str, list[str]]
    figures: dict[str, dict[str, Any]]
    torch_version: str | None


def bench(ws: Workspace, targets: list[str], options: BenchOptions | None = None, *,
          reporter: Reporter | None = None, progress: Callable[[str], None] | None = None) -> list[RecipeBench]:
    """Build ``targets`` (or with ``options.build`` False, restore them), measure their models,
    and write ``build/<recipe>/bench.json`` for each recipe. Returns one result per recipe.
    ``progress`` gets a line as each model (and runtime) is loaded, warmed up and measured."""
    options = options or BenchOptions()
    say = progress or (lambda message: None)
    chosen, skipped = select(ws, targets)
    models = [sid for sids in chosen.values() for sid in sids]
    verify_of = verify_steps(ws, models)
    verifies = list(dict.fromkeys(v for sid in models for v in verify_of.get(sid, [])))
    _imports()
    outcomes, build_notes = build_models(ws, models, verifies, options, reporter)
    figures = {v: f for v in verifies
               if outcomes.get(v) is not None and outcomes[v].status.ok
               and (f := verify_figures(ws, v, outcomes[v])) is not None}
    torch_version = _torch_version() if any(isinstance(ws.project.steps[s].step, LoadsModule) for s in models) else None
    built = _Built(outcomes, verify_of, figures, torch_version)
    results = []
    for recipe, sids in chosen.items():
        recipe_verifies = dict.fromkeys(v for sid in sids for v in verify_of.get(sid, []))
        notes = [*skipped.get(recipe, []), *(build_notes[v] for v in recipe_verifies if v in build_notes)]
        result = _bench_recipe(ws, recipe, sids, options, built, notes, say)
        result.file = ws.project.build_dir / recipe / BENCH_FILE
        write_atomic(result.file, (json.dumps(result.as_json(ws.project.root), indent=1) + "\n").encode())
        results.append(result)
    return results


def _bench_recipe(ws: Workspace, recipe: str, sids: list[str], options: BenchOptions, built: _Built,
                  notes: list[str], say: Callable[[str], None]) -> RecipeBench:
    """Open the runners of a recipe's models, time them interleaved, and put their rows
    beside the baseline: every model of a recipe gets the same inputs."""
    int_range = verified_int_range(ws, [v for sid in sids for v in built.verify_of.get(sid, [])])
    with ExitStack() as stack:
        runners = _open_runners(ws, recipe, sids, options, built, int_range, stack, notes, say)
        with set_torch_threads(options.threads, any(r.row.runtime.startswith("torch") for r in runners)) \
                as torch_threads, timing.watch_load() as load:
            time_runners(runners, options, say)
        if (busy := timing.busy_note(load)) is not None:
            notes.append(busy)
    rows = [r.row for r in runners]
    baseline = _baseline(rows)
    if baseline is not None:
        for row in rows:
            row.speedup = baseline.latency_ms["p50"] / row.latency_ms["p50"]
    settings = {"runs": options.runs, "warmup": options.warmup, "batch": options.batch,
                "threads": options.threads, "torch_threads": torch_threads, "seed": options.seed,
                "other_dims": options.dim, "int_range": list(int_range),
                "rounds": len(timing.blocks(options.runs, options.rounds)), "gc_disabled": True}
    host = {**_host(rows, built.torch_version), "load_average": load["load_average"], "others_cpu": load["others_cpu"]}
    return RecipeBench(recipe, rows, settings, host, baseline, notes)


def _open_runners(ws: Workspace, recipe: str, sids: list[str], options: BenchOptions, built: _Built,
                  int_range: tuple[int, int], stack: ExitStack, notes: list[str],
                  say: Callable[[str], None]) -> list[Runner]:
    """A runner per model, and PyTorch eager ones (on the CPU, and on CUDA where torch sees a
    GPU) for a step that loads its module; open until ``stack`` closes. Adds to ``notes``."""
    eager = [sid for sid in sids if isinstance(ws.project.steps[sid].step, LoadsModule)
             and built.torch_version is not None]
    devices = ["cpu", *(["cuda"] if eager and _cuda_available() else [])]
    say(f"bench {recipe}: {len(sids) + len(eager) * len(devices)} models, {options.warmup} warm-up + "
        f"{options.runs} timed runs each, batch {options.batch}, threads {options.threads or 'default'}")
    runners: list[Runner] = []
    for sid in sids:
        path = artifact_path(ws, sid, built.outcomes[sid])
        if isinstance(ws.project.steps[sid].step, LoadsModule):
            if built.torch_version is None:
                notes.append(f"{sid}: no PyTorch eager baseline: torch is not installed "
                             "(pip install 'optbuild[torch]')")
            for device in devices if sid in eager else []:
                say(f"  load     {sid} (torch{'' if device == 'cpu' else ', ' + device})")
                runners.append(stack.enter_context(
                    torch_runner(ws, sid, path, options, int_range, built.outcomes, device)))
        found = runs_on(ws.project.steps[sid])
        say(f"  load     {sid} ({found[0].name if found is not None else 'no runtime'})")
        runner, row_notes = model_runner(ws, sid, path, options, int_range, stack)
        runners.append(runner)
        notes += [note for note in row_notes if note not in notes]  # the recipe's models share inputs
        runner.row.verify = [built.figures[v] for v in built.verify_of.get(sid, []) if v in built.figures]
    if eager and "cuda" not in devices and any(r.row.on_gpu for r in runners):
        notes.append("no PyTorch eager (CUDA) row beside the CUDA models: torch.cuda.is_available() "
                     f"is false for torch {built.torch_version} (a CPU build of torch?); install a CUDA build "
                     "of torch to get one")
    return runners
