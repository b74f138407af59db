"""kind = "benchmark": measure a model's latency and throughput on this host.

The model of ``input`` (an ONNX or ORT-format model on onnxruntime: on the CPU, or on the
execution provider its onnxruntime engine step names, CUDA on gpu.0; an OpenVINO IR; a
TensorRT engine on gpu.0: whatever ``optbuild.backends.registry`` runs for its artifact) is
opened by its backend and run on one seeded random sample of its declared shapes
(``seed``; symbolic dims get ``dynamic_size`` unless the recipe's ``[inputs.NAME]`` or the
step's ``inputs`` declare them, or declare a dim of the same name in another input:
optbuild.model.samples.measured_specs): ``warmup`` untimed runs, then ``runs`` timed ones
(optbuild.model.timing.time_calls: time.perf_counter_ns per run, the garbage collector off).
On a GPU the sample is put on the device once, before timing (onnxruntime CUDA: inputs and
outputs bound on gpu.0 with an IOBinding), and each run returns when the device is done, so
the figures are the device's time, not the host's copies (``Runner.timed_call``).

A figure must be of what serves. A batch of 1 is real serving, a sequence of one token or an
image one pixel wide is not: a dim that the model leaves open, that is not the batch (axis 0,
or a symbolic name that is axis 0 of some input: optbuild.model.samples.is_batch) and that no
declaration sizes fails the step while ``dynamic_size`` is 1, naming the input, the dim and the
declaration to write. An error rather than a warning: the figure is cached and ``select``
chooses by it, where a warning in one build's log is never seen again. A declared size, 1
included (one token per decoding step), is measured as declared.

Outputs: the measured artifact's files, unchanged and under their names (hard links where
the file system allows, else copies; the cache keeps one copy of identical bytes), the
model's file being the step's main output, so that a step downstream (``select``) can hand on
the model it chooses; and ``benchmark.json``::

    {"format": "optbuild.benchmark", "version": 4,
     "model": {"file": "model.onnx", "digest": "blake3-256:..."},
     "runtime": "onnxruntime 1.23.2 (CPU), optimization level all", "level": "all", "batch": 1, "runs": 50, "warmup": 5, "threads": null,
     "inputs": {"tokens": {"shape": [1, 128], "dtype": "int64"}},
     "load": {"load_average": 0.4, "cpu_count": 8},
     "p50_ms": ..., "p90_ms": ..., "p99_ms": ..., "mean_ms": ..., "min_ms": ..., "max_ms": ...,
     "std_ms": ..., "throughput_per_s": ..., "size_bytes": ...,
     "verify": {"passed": true, "cosine": ..., "max_abs": ..., "top1": ..., "cosine_at": "output0[:, 4:84, :]"},
     "notes": []}

``runtime`` is what ran, as it says once loaded (onnxruntime: the providers its session
has, ``session.get_providers()``: "onnxruntime 1.31.1 (CUDA, CPU) on gpu.0 (NVIDIA H100 80GB
HBM3)", CUDA running every node it has a kernel for) and, for onnxruntime, its graph
optimization ``level``: the one an onnxruntime engine step optimized the model at, else
onnxruntime's default, "all". The model is loaded and timed in a forked child process
(optbuild.model.isolation): where it crashes onnxruntime (a native crash: SIGSEGV, SIGBUS,
SIGILL, SIGFPE) at its default level, it is measured again at the next lower level ("all",
"extended", "basic", "disable"), and ``notes`` says which level crashed and which ran (a
server must open it at that level too); another failure is not retried. ``inputs`` are the shapes and dtypes
measured, per input; ``load`` the 1-minute load average
(null where the system keeps none) and the CPU count as timing began, and ``others_cpu``, the
share of the CPUs other processes took while it timed (optbuild.model.timing.watch_load, as
``optbuild bench`` records it; null off Linux): a measurement is a fact about a moment, and
one taken beside other work says so. min / max / std are the spread of
the timed runs.

``threads`` is the intra-op threads it ran on (the metrics' ``threads`` too); null, the
parameter not set, is the runtime's default: all the host's cores (onnxruntime: one thread per
physical core; OpenVINO: as its performance hint says), ``load.cpu_count`` of them. A figure
taken on all cores of a busy host and one taken on 1 thread differ by more than most leads:
set ``threads`` to what serves.

``throughput_per_s`` is batch (the first axis of the first input) / mean latency;
``size_bytes`` the bytes of the input artifact's files. ``verify`` summarises the
``report.json`` of the ``check`` step (a verify step whose candidate is this same model,
told by its content digest): whether it passed and the worst cosine, max_abs and top-1 over
its outputs and the parts of outputs its thresholds are checked on (see verify's ``slices``:
a detector whose [1, 84, N] output gives cosine 0.99998 whole and 0.0 on its class scores
records 0.0), null where it computed none; ``cosine_at`` names the output or part of that
cosine. Null without ``check``.

Hardware and tools: a measurement is true of the host it was taken on. The key holds the
distributions of the backend that runs the model and the host fields its results depend on
(``Backend.host_fields``: cpu.arch and cpu.flags for onnxruntime on the CPU and OpenVINO,
gpu.0's model and compute capability for onnxruntime on CUDA, gpu.0's compute capability
for TensorRT), and, because latency depends on the device itself, the CPU's model and count
for a CPU runtime or gpu.0's model for a GPU one; never a GPU's serial or UUID (two of one
model give one key). The step
is unavailable where the backend cannot run the model (``Backend.unavailable``). As verify,
it learns the backend from its input step (``bind``) and, in the worker, from the artifact.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from optbuild.backends import registry
from optbuild.backends.base import Backend, Manifest
from optbuild.common.errors import StepError, first_line
from optbuild.common.recipetable import StepRef
from optbuild.model.inputdecl import StepInputs, check_declarations, inputs_field
from optbuild.model.isolation import Stage, opened_stack
from optbuild.steps import fields
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext, StepParams, link_files

if typing.TYPE_CHECKING:
    from optbuild.backends.base import TensorSpec
    from optbuild.common.fingerprint import Fingerprint

FORMAT = "optbuild.benchmark"
# 2: the inputs measured, the load, min / max / std; 3: level, onnxruntime's graph optimization
# level it ran at (null for another runtime), and notes (a level that crashed, retried lower); 4:
# verify's worst figures over the parts of outputs too, and where the worst cosine is (cosine_at)
REPORT_VERSION = 4
REPORT = "benchmark.json"

# Where the latency of a runtime's results depends on the device beyond the fields its
# numbers depend on (Backend.host_fields): the CPU's model and cores, or the GPU's model.
CPU_TIMING_FIELDS = ("cpu.model", "cpu.count")
GPU_TIMING_FIELDS = ("gpu.0.name",)


class BenchmarkParams(StepParams):
    input: StepRef = Field(examples=["quantize_int8"])
    """The step whose model is measured: an ONNX or ORT-format model (onnxruntime, CPU), or an
    engine step, run by its backend: 'onnxruntime' on its provider (CUDAExecutionProvider: on
    gpu.0, inputs bound there), 'tensorrt' / 'tensorrt-rtx' on gpu.0, 'openvino' on the CPU.
    The step is unavailable on hosts that cannot run it, saying what they lack (onnxruntime-gpu,
    a CUDA GPU). Its files are the step's outputs, unchanged."""
    check: StepRef | None = Field(None, examples=["verify_int8"])
    """A verify step whose candidate is this same model (the same content): its report's passed
    and worst cosine, max_abs and top-1 (over outputs and their checked parts) are copied into
    benchmark.json ('verify'). Not set: 'verify' is null."""
    runs: int = Field(50, ge=1, examples=[200])
    """Timed inferences; p50 / p90 / p99 / mean latency and their spread (min, max, std) are
    over these. benchmark.json also records the shapes and dtypes measured, per input, and the
    load average and CPU count as timing began."""
    warmup: int = Field(5, ge=0, examples=[20])
    """Untimed inferences before timing (caches, thread pools, lazy initialization)."""
    threads: int | None = Field(None, ge=1, examples=[4])
    """Intra-op threads of the runtime (onnxruntime, OpenVINO), recorded in benchmark.json and
    the metrics. Not set: the runtime's default, all the host's cores."""
    seed: int = fields.seed_field(note=" Floats are standard normal, integers uniform in [0, 8), "
                                       "booleans uniform, unless declared.")
    dynamic_size: int = fields.dynamic_size_field(
        "the model", example=8,
        note=": the batch measured, when the batch axis is dynamic. The batch is axis 0, and any dim named "
             "like an input's axis 0; another dim left open (a sequence length, an image's height or "
             "width; a time-major model's axis 0 is declared) is an error while this is 1, unless inputs "
             "or the recipe's [inputs.NAME] declare its size, 1 included")
    inputs: StepInputs = inputs_field(
        " A declared input follows its declaration (a dim range: its opt, else its min), a dim named "
        "like one a declaration sizes takes that size, the others dynamic_size.", example={"x": {"shape": [8, 3, 224, 224]}})

    @model_validator(mode="after")
    def _consistent(self) -> BenchmarkParams:
        if self.check is not None and self.check == self.input:
            raise ValueError("check and input name the same step: check names a verify step of input's model")
        return self


class Benchmark(Step[BenchmarkParams]):
    """Measures a model's latency and throughput on this host; outputs its files and a report.

    benchmark.json records what was measured: the shapes, the runtime and its level, `threads`
    (null where the parameter is not set: the runtime's default, all the host's cores; a figure
    taken on all cores of a busy host and one taken on 1 thread differ by more than most
    leads), the load, the spread, and with `check` the verify step's verdict and its worst
    cosine, max_abs and top-1 over its outputs and the parts of outputs it judges on their own,
    `cosine_at` naming where the worst cosine is (a detector's class scores,
    `output0[:, 4:84, :]`, not its whole output). A `select` step reads them.
    """

    Params = BenchmarkParams
    preload = ONNX_TOOLS
    exclusive = True  # timings taken beside other builds would measure those
    carries_model = True  # its model is a copy of the one it measured
    # 2: benchmark.json records the inputs, the load and the spread; open dims at 1 refused; 3: verify's
    # worst figures over outputs' parts (a detector's scores), threads in the metrics
    version = "3"

    # The step measured and what runs its model, as that step says (see bind). Not bound:
    # onnxruntime, as for any ONNX model.
    source: Step | None = None
    side: tuple[Backend, Manifest] | None = None

    def bind(self, upstream: Mapping[str, Step]) -> None:
        self.source = upstream.get("input")
        self.side = registry.for_step(self.source) if self.source is not None else None

    # The main output is the measured model's file under its own name (model.onnx,
    # model.engine, model.xml), which only the input step knows: an instance property where
    # Step has a class attribute. Not bound (the worker, which does not read it): model.onnx.
    @property
    def primary_output(self) -> str | None:  # type: ignore[override]
        return self.source.primary_output if self.source is not None else "model.onnx"

    def runs_on(self) -> dict[str, Any] | None:
        if self.source is not None:
            return self.source.runs_on()  # the same files: the same backend
        return super().runs_on()

    def _backend(self) -> tuple[Backend, Manifest]:
        if self.side is not None:
            return self.side
        plain = registry.onnx_backend()
        return plain, {"backend": plain.name}

    def tool_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self._backend()[0].distributions()))

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        backend, manifest = self._backend()
        fields = backend.host_fields(manifest)
        timing = GPU_TIMING_FIELDS if any(f.startswith("gpu.") for f in fields) else CPU_TIMING_FIELDS
        return {name: host.get(name) for name in dict.fromkeys((*fields, *timing))}

    def unavailable(self, host: Fingerprint) -> str | None:
        backend, manifest = self._backend()
        return backend.unavailable(host, manifest)

    # --- execution -------------------------------------------------------------------
    def run(self, ctx: StepContext) -> None:
        from optbuild.model.runmodels import model_entry, run_models
        from optbuild.model.timing import latency_figures

        p = self.params
        art = ctx.inputs["input"]
        what = f"the input {art.step}"
        if art.primary is None:
            raise StepError(f"{what} gives no model")
        side = registry.for_artifact(art.primary, what)
        if REPORT in art.files:
            raise StepError(f"{what} has a file named {REPORT}, the name of this step's report")
        verify = _verify_summary(ctx, art.primary) if p.check is not None else None
        # measured in a forked child: a native crash at onnxruntime's default level is tried
        # again at a lower one (runmodels.run_models)
        measured, levels, notes = run_models(
            lambda at, stage: self._measure(ctx, side, what, at["input"], stage), {"input": side}, {"input": what},
            "benchmark")
        for note in notes:
            ctx.log(f"note: {note}")
        latency = latency_figures(measured["times"])
        inputs = measured["inputs"]
        first = next(iter(inputs.values()), None)
        batch = int(first["shape"][0]) if first is not None and first["shape"] else 1
        size = link_files(art.files, ctx.out_dir)
        report = {
            "format": FORMAT,
            "version": REPORT_VERSION,
            "model": model_entry(art.primary),
            "runtime": measured["runtime"],
            "level": levels["input"],
            "batch": batch,
            "runs": p.runs,
            "warmup": p.warmup,
            "threads": p.threads,
            "inputs": inputs,
            "load": measured["load"],
            **{f"{figure}_ms": round(latency[figure], 6) for figure in ("p50", "p90", "p99", "mean", "min", "max", "std")},
            "throughput_per_s": round(batch / (latency["mean"] / 1000), 3),
            "size_bytes": size,
            "verify": verify,
            "notes": notes,
        }
        (ctx.out_dir / REPORT).write_text(json.dumps(report, indent=1) + "\n")
        ctx.log(f"p50 {report['p50_ms']} ms, p90 {report['p90_ms']} ms, p99 {report['p99_ms']} ms, "
                f"{report['throughput_per_s']} samples/s (batch {batch}, threads {_threads(p.threads)}), {size} bytes")
        ctx.metrics.update(p50_ms=report["p50_ms"], p90_ms=report["p90_ms"],
                           throughput_per_s=report["throughput_per_s"], size_bytes=size, threads=p.threads or "all")
        if verify is not None:
            ctx.metrics["passed"] = verify["passed"]

    def _measure(self, ctx: StepContext, side: tuple[Backend, Manifest], what: str, level: str | None,
                 stage: Stage) -> dict[str, Any]:
        """The model loaded (onnxruntime's: at ``level``) and timed: the runtime, the times
        (ns), the inputs measured and the load. Run in a forked child: ``stage`` says when it
        loads or runs the model, for a crash to be told."""
        from optbuild.model import samples as sampling
        from optbuild.model.runmodels import at_level, entered_runner
        from optbuild.model.timing import busy_note, time_calls, watch_load

        p = self.params
        backend, manifest = side
        model = ctx.inputs["input"].primary
        assert model is not None
        with opened_stack() as stack:
            stage(("input", "loading"))
            runner = entered_runner(stack, side, model, ctx.host, what, threads=p.threads, level=level)
            label = at_level(runner.label, level)
            ctx.log(f"runtime: {label} (loaded in {runner.load_ms:.1f} ms)")
            specs = runner.input_specs()
            check_declarations(specs, p.inputs, what)
            if p.dynamic_size == 1 and (open_dims := sampling.undeclared_dims(specs, p.inputs)):
                raise StepError(_degenerate(open_dims, what))
            shaped = sampling.measured_specs(specs, p.inputs, p.dynamic_size, p.dynamic_size)
            samples = sampling.random_samples(shaped, 1, p.seed, decls=p.inputs)
            feed = runner.cast(samples.feeds[0])
            shapes = ", ".join(f"{name} {value.dtype}{list(value.shape)}" for name, value in feed.items())
            if (why := backend.unfit(manifest, feed)) is not None:
                raise StepError(f"the inputs ({shapes}) do not fit {what}: {why}. Declare inputs it takes "
                                "(inputs, dynamic_size), or widen its step's profiles")
            stage(("input", "running"))
            try:
                runner.infer(feed)
            except Exception as exc:
                raise StepError(f"{what} fails on {runner.label} with inputs {shapes}: "
                                f"{type(exc).__name__}: {first_line(exc)}") from None
            ctx.log(f"inputs: {shapes} ({samples.source}); {p.warmup} warm-up + {p.runs} timed runs, "
                    f"threads {_threads(p.threads)}")
            ctx.progress(f"timing {p.warmup} warm-up + {p.runs} runs on {label}")
            with watch_load() as load:
                times = time_calls(runner.timed_call(feed), p.runs, p.warmup)
            if (busy := busy_note(load)) is not None:
                ctx.log(f"note: {busy}")
        return {"runtime": label, "times": times, "load": load,
                "inputs": {name: {"shape": list(value.shape), "dtype": str(value.dtype)}
                           for name, value in feed.items()}}


def _threads(threads: int | None) -> str:
    """The threads a measurement ran on, as the logs say it: not set is the runtime's default."""
    return str(threads) if threads else "all cores (the runtime's default)"


def _degenerate(open_dims: list[tuple[TensorSpec, int]], what: str) -> str:
    """The error for dims that dynamic_size = 1 would measure at 1: each named, and the
    declaration that fixes them, written for the first input."""
    def dim(spec: TensorSpec, axis: int) -> str:
        name = spec.shape[axis]
        return f"input {spec.name!r} dim {axis}" + (f" ({name!r})" if isinstance(name, str) else "")

    first = open_dims[0][0]
    mine = {axis: str(first.shape[axis] or "N").upper() for spec, axis in open_dims if spec is first}
    shape = ", ".join(str(d) if isinstance(d, int) else mine.get(axis, "1") for axis, d in enumerate(first.shape))
    return (f"{', '.join(dim(spec, axis) for spec, axis in open_dims)} of {what}: not fixed by the model "
            "and not declared, so measured at dynamic_size = 1 (a sequence of one token, an image one pixel "
            "wide), not at a size that serves. Declare the size it serves at, in the recipe: "
            f"[inputs.{first.name}] shape = [{shape}], or in this step: inputs = {{ {first.name} = "
            f"{{ shape = [{shape}] }} }}, with {' and '.join(dict.fromkeys(mine.values()))} the size it serves "
            "at (or [min, opt, max]: opt is measured); a size of 1 that serves (one token per decoding step) "
            "is declared the same way")


def _verify_summary(ctx: StepContext, model: Path) -> dict[str, Any]:
    """passed and the worst cosine, max_abs, top-1 of the ``check`` verify step's report.json,
    over its outputs and the parts its thresholds are checked on (thresholds.worst: a detector's
    scores part, not its whole output), and the output or part of the worst cosine; the report
    must have verified ``model`` (the same content digest)."""
    from optbuild.model import thresholds
    from optbuild.model.runmodels import model_entry

    art = ctx.inputs["check"]
    path = art.files.get("report.json") or art.primary
    if path is None or path.name != "report.json" or not path.is_file():
        raise StepError(f"check: {art.step} gives no report.json; check names a verify step")
    try:
        report = json.loads(path.read_text())
        passed, outputs = report["passed"], report.get("outputs") or {}
        candidate = (report.get("candidate") or {}).get("digest")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StepError(f"check: the report.json of {art.step} is unreadable ({type(exc).__name__}: {exc})") from None
    if candidate != (ours := model_entry(model))["digest"]:
        raise StepError(f"check: {art.step} verified another model ({candidate}) than the one measured "
                        f"({ours['file']}, {ours['digest']}); name the verify step whose candidate is input")

    if not isinstance(outputs, dict) or not all(isinstance(f, dict) for f in outputs.values()):
        raise StepError(f"check: the report.json of {art.step} is unreadable (outputs is not a table of figures)")
    found = {metric: thresholds.worst(outputs, metric) for metric in ("cosine", "max_abs", "top1")}
    summary = {"passed": bool(passed)} | {metric: None if w is None else w[0] for metric, w in found.items()}
    return summary | {"cosine_at": None if found["cosine"] is None else found["cosine"][1]}
