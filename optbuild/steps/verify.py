"""kind = "verify": compare a candidate model's outputs with a reference's, fail past thresholds.

Each model runs on the backend that runs its artifact (``optbuild.backends.registry``: an
ONNX or ORT-format model on onnxruntime, CPU; an engine on the backend its ``engine.json``
names, an onnxruntime engine on the execution provider its step names: CUDA on gpu.0, with
inputs and outputs bound there, never silently on the CPU), over the same samples: those
of ``data`` (the forms calibrate takes: .npz, folder of .npy, ``file.py:callable``) or
seeded random inputs of the reference's declared shapes (``samples``, ``seed``; unknown
dims get ``dynamic_size``, integer inputs draw from ``int_range``). The candidate may be an
ORT-format model (an onnxruntime engine step with format = "ort"); a float16 candidate gets
its float inputs cast to float16.

Figures, per output, over all samples (optbuild.model.compare, as the other steps' checks):

``max_abs``  largest |candidate - reference| over every element (NaN or inf in the same
             places on both sides count as equal; anywhere else they make it inf).
``max_rel``  max_abs divided by the reference's largest finite magnitude (robust near zero, unlike
             an element-wise ratio; the same measure the export and simplify checks use).
``cosine``   cosine similarity of all the output's values, samples concatenated;
             ``cosine_min`` (reported, not checked) is the worst single sample's.
``top1``     share of positions (every index but the class axis) whose argmax over the class
             axis agrees: top-1 agreement of class scores, per row of [batch, classes], per
             token of [batch, seq, vocab], per pixel of [batch, classes, H, W]. Computed, and
             checked against ``min_top1``, only where an output holds class scores: on
             ``top1_outputs`` (the axis the rule below finds, else the last), or by default, as
             the reference's ONNX graph says (read through Identity, Cast and Q/DQ nodes), on
             the float outputs with 2 or more classes where
             - a Softmax or LogSoftmax computes it over its last axis (the classes), or over
               axis 1 of a rank-4 output ([batch, classes, H, W]);
             - a linear layer (Gemm, MatMul, MatMul + Add) computes a rank-2 [batch, classes]
               or rank-3 [batch, seq, vocab] output: a classifier's or a language model's
               logits, classes on the last axis;
             - a 1x1 Conv (a per-pixel linear layer; also behind a Resize, or an Add of such
               Convs) computes a rank-4 output: a segmentation head, classes on axis 1.
             Anything else (a pixel map [N, 1, H, W], a recurrent state [2, N, 128], box
             regressions, a wider Conv's feature map, an embedding such as BERT's pooler
             [N, 256] behind a Tanh, any output of an ORT-format reference) gets no top-1 unless
             named. report.json records the axis (``top1_axis``).

Parts of an output (``slices``). One output may concatenate quantities of different ranges: a
detector's [1, 4 + 80, anchors] holds box coordinates (0..320) and scores (0..1). Its whole-
output figures are the boxes' figures: scores wiped to 0 by one INT8 scale over both still
give cosine 0.9999. So each float output of rank 2 or more that holds no class scores (see
top-1 above: logits far below the top ones are so by nature) is cut along its non-batch axis
of the smallest size of 2 or more (the channels of [B, C, N], the 84 of [1, anchors, 84])
into runs of contiguous indices whose reference peak |value| (over all samples and the
other axes) is at least 1/16 of the output's peak, and runs of those below (a shared 8-bit
scale leaves such a part under 1/16 of its steps). One run, or more than 8 (small and large
indices interleave: noise, not parts): the output is judged whole. ``slices`` declares the
axis and the cuts of an output instead, or none. Each part gets max_abs, max_rel (to its own
peak), cosine and cosine_min, is named like ``output0[:, 4:84, :]``, and has the thresholds
(top-1 aside) and the collapse check below applied, unless its reference is constant there. The
step's metrics hold each checked part's max_abs, max_rel and cosine (``output0[:, 4:84,
:].cosine``), and a benchmark's ``check`` summary, which select's ``min_cosine`` and its table
read, the worst over outputs and parts.

Always checked, whatever the thresholds:
``reference``  an output whose reference holds one value (or no finite value) over all
             samples fails: any candidate agrees with it (a zero-initialised head gives cosine
             1 and top-1 100% for anything), so the comparison shows nothing. The fix: real
             weights, or samples that make it vary.
``candidate``  an output or part that the candidate holds constant where the reference varies
             (spans more than 1e-4 of its largest magnitude: a reference varying in its 7th
             significant digit is float rounding, and a constant is within max_rel 1e-4 of it)
             fails: it lost what it held.

Warnings (in the build's output and --json, report.json's ``warnings``, report.txt; the step
passes): a threshold that cannot be applied (``min_top1`` where no output holds class scores),
and a reference that barely depends on its input: the same class at every position of every
sample (``one_class``, over 8 positions or more), or values that change by at most 1e-4 of their largest magnitude from
sample to sample (``flat``; a randomly initialised net often does). Against such a reference
every candidate passes, so the verdict shows little.

A task metric (``metric = "file.py:fn"``, optbuild.model.usermetric) adds the user's figures
and its verdict: ``fn(reference, candidate, names)`` returns {"figure": number, ...,
"passed": bool}.

Thresholds (``max_abs``, ``max_rel``, ``min_cosine``, ``min_top1``) apply to every compared
output and part (``min_top1`` to class scores only: where no output holds any it is not applied,
with a warning, so that one template serves a classifier and an encoder); at least one of them, or
``metric``, must be set. The artifact is
``report.json`` (figures, thresholds,
checks, latencies) and ``report.txt`` (the same as a table). They name the models compared
by file and content digest, never by step: the key holds the models' content, not the steps'
names, so two verify steps over byte-identical models share one entry, and a report restored
for either must be true of both. When a check fails the step fails with that table as its
message; nothing is cached, and the next build runs it again.

Graph optimization levels: both models load and run in a forked child process
(optbuild.model.isolation), so that a native crash ends the child, not the step. onnxruntime
opens a model at its default level, "all", or at the level an onnxruntime engine step
optimized it at (its engine.json's ``level``, kept). A model at the default that crashes
onnxruntime (SIGSEGV, SIGBUS, SIGILL, SIGFPE: a float16 ViT crashes at "all" only) as it
loads or runs is tried again at the next lower level ("extended", "basic", "disable"), the
other side keeping its own; report.json's ``levels`` records the level each side ran at (null
for another runtime), its runtime line names it, and a note says which level crashed and which
ran: a server must open the model at that level too. Any other failure is not retried; a crash
at every level fails the step, naming each level tried.

Hardware and tools: the key holds the distributions of both sides' backends and the host
fields their results depend on (``Backend.host_fields``): cpu.arch and cpu.flags for
onnxruntime on the CPU (quantized kernels differ between CPUs: x86 without VNNI saturates
where VNNI does not), gpu.0's model and compute capability for onnxruntime on CUDA (never
its serial or UUID), gpu.0's compute capability for a TensorRT engine (and gpu.0's model for
TensorRT-RTX, which specializes an engine for the GPU that loads it). The step is
unavailable where either side's backend says so (``Backend.unavailable``: no GPU, a GPU the
engine was not built for, a missing module, an onnxruntime without the CUDA provider). Each sample must fit the runner before anything
runs (``Backend.unfit``: an engine's optimization profiles). Nothing of this is written in the
verify step or the recipe: planning learns it from the steps compared (``bind``), the worker
from the artifacts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from optbuild.backends import registry
from optbuild.backends.base import Backend, Manifest, Runner
from optbuild.common.errors import StepError
from optbuild.common.recipetable import KEYED_WHEN_SET, CallableRef, RecipeTable, StepRef
from optbuild.model import compare
from optbuild.model.inputdecl import InputDecls, StepInputs, check_declarations
from optbuild.model.isolation import Stage
from optbuild.model.runmodels import at_level, entered_runner, model_entry, run_models
from optbuild.model.samples import DataArg, non_default
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext, StepParams
from optbuild.steps.fields import (
    DataSource,
    DataSourceStep,
    data_args_field,
    data_field,
    dynamic_size_field,
    samples_field,
    seed_field,
)

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

# 2: models named by file and digest, not by step; 3: what ran each side; 4: slices, degenerate
# and collapsed outputs, the user metric; 5: notes (a threshold that did not apply); 6: levels,
# onnxruntime's graph optimization level of each side, and a note for a level that crashed; 7:
# warnings (a threshold that did not apply, a reference that ignores its input), top-1 per token
# and per pixel (top1_axis, one_class), flat
REPORT_VERSION = 7


class SliceDecl(RecipeTable):
    """Where one output is cut into parts that are judged on their own."""

    axis: int = Field(ge=0, examples=[1])
    """The axis the output is cut along (0 is the first, the batch axis of a [batch, ...] output)."""
    at: list[int] = Field(examples=[[4]])
    """The indices along axis where a new part starts, increasing, each above 0 and below the
    axis's size: [4] cuts [1, 84, N] into [:, 0:4, :] and [:, 4:84, :]. []: the output is
    judged whole (no automatic split)."""

    @field_validator("at")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(a <= 0 for a in value) or any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"at must be increasing indices above 0, got {value}")
        return value


class VerifyParams(StepParams):
    reference: StepRef = Field(examples=["simplify"])
    """The step whose model is taken as right (an ONNX or ORT-format model, run on onnxruntime,
    CPU)."""
    candidate: StepRef = Field(examples=["quantize_int8"])
    """The step whose model is tested: an ONNX or ORT-format model (onnxruntime, CPU), or an
    engine step, run by its backend: 'onnxruntime' on its provider (CUDAExecutionProvider: on
    gpu.0), 'tensorrt' / 'tensorrt-rtx' on gpu.0, 'openvino' on the CPU. The step is unavailable
    on hosts that cannot run it, saying what they lack (onnxruntime-gpu, a CUDA GPU)."""
    data: DataSource | None = data_field(
        "Sample inputs", default=None, examples=["models/calib.py:images"],
        note=" Their dtypes must be the reference's input types. Not set: seeded random inputs "
             "(samples, seed, dynamic_size, int_range).")
    data_args: dict[str, DataArg] = data_args_field(
        note="; e.g. another seed than calibration's for held-out samples", seed=1)
    samples: int | None = samples_field("With data: use at most this many samples (not set: all). With "
                                        "random inputs: this many samples (not set: 8).", example=32)
    seed: int = seed_field("Random inputs only: ")
    dynamic_size: int = dynamic_size_field("the reference", scope="Random inputs only: ")
    int_range: list[int] = Field([0, 8], examples=[[0, 30522]])
    """Random inputs only: integer inputs (token ids, indices) are drawn uniformly from [low,
    high), high excluded; low < high. Floats are standard normal, booleans uniform."""
    inputs: StepInputs = Field(None, examples=[{"sr": {"values": [8000, 16000]}}])
    """Random inputs only: what the reference's inputs take (see 'Model inputs'); replaces the
    recipe's [inputs.NAME] entry of the same input. A declared input follows its declaration,
    the others dynamic_size and int_range."""
    outputs: list[str] = Field([], examples=[["logits"]])
    """Names of the outputs to compare (each must exist in both models). Empty: every output of
    the reference."""
    fail: Annotated[bool | None, KEYED_WHEN_SET] = Field(None, examples=[False])
    """false: a threshold that is exceeded is recorded (report.json says passed: false, the
    table is in the log) and the step succeeds, so that a benchmark and select step downstream
    can drop the candidate. Not set or true: the build fails with the table."""
    max_abs: float | None = Field(None, ge=0, examples=[0.02])
    """Fail when the largest |candidate - reference| over all elements of an output exceeds
    this. Not set: not checked (at least one threshold is required)."""
    max_rel: float | None = Field(None, ge=0, examples=[0.01])
    """Fail when max_abs divided by the reference output's largest magnitude exceeds this. Not
    set: not checked."""
    min_cosine: float | None = Field(None, ge=-1, le=1, examples=[0.999])
    """Fail when the cosine similarity of an output's values (all samples concatenated) is below
    this (-1 to 1). Not set: not checked."""
    min_top1: float | None = Field(None, ge=0, le=1, examples=[0.95])
    """Fail when the share of positions whose argmax over the class axis agrees (top-1 agreement,
    0 to 1: per row, per token of [batch, seq, vocab], per pixel of [batch, classes, H, W]) is
    below this, on the outputs that hold class scores (see top1_outputs). Where none does (a
    template's min_top1 reaching an encoder), it is not applied and the build warns; as the only
    threshold there, the step fails. Not set: not checked."""
    top1_outputs: list[str] = Field([], examples=[["logits"]])
    """The outputs that hold class scores: top-1 is computed and min_top1 checked on these (needs
    min_top1; within outputs when that is set; each a float output with 2 or more classes; over
    the axis the rule below finds, else the last). Empty: as the reference's ONNX graph says
    (through Identity, Cast, Q/DQ), the compared float outputs that a Softmax or LogSoftmax over
    the last axis (or axis 1 of a rank-4 output) computes; rank-2 [batch, classes] and rank-3
    [batch, seq, vocab] outputs of a linear layer (Gemm, MatMul, MatMul + Add: logits, classes
    last); rank-4 [batch, classes, H, W] outputs of a 1x1 Conv (also behind a Resize: a
    segmentation head, classes on axis 1). Others (pixel maps, recurrent states, boxes, a wider
    Conv's feature maps, embeddings such as BERT's pooler behind its Tanh, the outputs of an
    ORT-format reference) get no top-1 unless named here."""
    slices: Annotated[dict[str, SliceDecl] | None, KEYED_WHEN_SET] = Field(None, examples=[{"output0": {"axis": 1, "at": [4]}}])
    """Output name -> where to cut it into parts judged on their own, for an output that
    concatenates quantities of different ranges (a detector's box coordinates and scores). Not
    given for an output: the float outputs of rank 2 or more (class scores aside) are cut along
    their non-batch axis of the smallest size of 2 or more (taken 'the channels'), into runs of indices whose
    reference peak |value| is at least 1/16 of the output's peak, and runs of those below it
    (a shared 8-bit scale gives such a part under 1/16 of its steps); at most 8 runs, else the
    output is judged whole. With two runs or more, each part, named like output0[:, 4:84, :],
    gets max_abs, max_rel (to its own peak) and min_cosine checked, and fails when the
    candidate is constant there where the reference varies."""
    metric: Annotated[CallableRef | None, KEYED_WHEN_SET] = Field(None, examples=["models/det_metric.py:agreement"])
    """A task metric: 'file.py:fn', called as fn(reference, candidate, names), reference and
    candidate mapping each compared output name to its arrays (one per sample), names the
    compared outputs. It returns a dict of named figures (numbers or None) and 'passed' (True or
    False), e.g. {'box_agreement': 0.97, 'passed': True}: reported, and checked (passed must be
    True). Counts as a threshold. The file and the project-local modules it imports enter the
    key."""

    @field_validator("int_range")
    @classmethod
    def _range(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or value[0] >= value[1]:
            raise ValueError(f"int_range must be [low, high) with low < high, got {value}")
        return value

    def inputs_read(self) -> InputDecls | None:
        """Random inputs only: with data, no declaration is read."""
        return self.inputs if self.data is None else None

    @model_validator(mode="after")
    def _consistent(self) -> VerifyParams:
        if self.reference == self.candidate:
            raise ValueError("reference and candidate name the same step")
        if all(t is None for t in (self.max_abs, self.max_rel, self.min_cosine, self.min_top1, self.metric)):
            raise ValueError("set at least one threshold: max_abs, max_rel, min_cosine, min_top1 or metric")
        if self.top1_outputs and self.min_top1 is None:
            raise ValueError("'top1_outputs' needs min_top1")
        if self.data is not None:
            random_only = non_default(self, ("seed", "dynamic_size", "int_range"))
            if random_only:
                raise ValueError(f"{', '.join(map(repr, random_only))} only apply to random inputs (no data)")
        if self.data_args and (self.data is None or ".py:" not in self.data):
            raise ValueError("'data_args' only apply to a 'file.py:callable' data source")
        if self.outputs and self.top1_outputs and (extra := sorted(set(self.top1_outputs) - set(self.outputs))):
            raise ValueError(f"top1_outputs {extra} are not in outputs")
        if self.outputs and (extra := sorted(set(self.slices or {}) - set(self.outputs))):
            raise ValueError(f"slices {extra} are not in outputs")
        return self


class Verify(DataSourceStep[VerifyParams]):
    """Compares a candidate model's outputs with a reference's and fails past thresholds."""

    Params = VerifyParams
    preload = ONNX_TOOLS
    # 2: reports name no steps; top-1 only on class scores; 3: any backend; 4: slices, degenerate
    # references and collapsed candidates fail, rank-2 top-1 only on a linear layer's output; 5: top-1
    # per token and per pixel, the collapse check relative to the reference's scale, warnings; 6: the
    # figures of the parts checked in the metrics
    version = "6"
    primary_output = "report.json"

    # What runs the reference and the candidate, as their steps say (see bind): the backend
    # and the manifest it is judged by. Not bound: onnxruntime, as for any ONNX model.
    sides: dict[str, tuple[Backend, Manifest]]

    def bind(self, upstream: Mapping[str, Step]) -> None:
        self.sides = {role: on for role in ("reference", "candidate")
                      if role in upstream and (on := registry.for_step(upstream[role])) is not None}

    def _backends(self) -> list[tuple[Backend, Manifest]]:
        """What runs each side; onnxruntime where no step said otherwise."""
        sides = getattr(self, "sides", {})
        plain = registry.onnx_backend()
        default = (plain, {"backend": plain.name})
        return [sides.get(role, default) for role in ("reference", "candidate")]

    def tool_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for backend, _ in self._backends() for name in backend.distributions()))

    def key_files(self) -> list[Path]:
        """The data's files, and the metric's file with the project-local modules it imports."""
        from optbuild.common.pyimports import local_imports

        files = super().key_files()
        if self.params.metric is not None:
            entry = (self.base_dir / self.params.metric.rpartition(":")[0]).resolve()
            if entry.is_file():
                files.extend(p for p in local_imports(entry, self.project_root) if p not in files)
        return files

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        fields = dict.fromkeys(f for backend, manifest in self._backends() for f in backend.host_fields(manifest))
        return {name: host.get(name) for name in fields}

    def unavailable(self, host: Fingerprint) -> str | None:
        reasons = [why for backend, manifest in self._backends()
                   if (why := backend.unavailable(host, manifest)) is not None]
        return "; ".join(dict.fromkeys(reasons)) or None

    @staticmethod
    def _side(ctx: StepContext, role: str) -> tuple[Backend, Manifest]:
        """What runs the ``role`` model, from its artifact."""
        return registry.for_artifact(_model(ctx, role), f"the {role} {ctx.inputs[role].step}")

    @staticmethod
    def _open(ctx: StepContext, role: str, side: tuple[Backend, Manifest], stack: contextlib.ExitStack,
              level: str | None) -> Runner:
        """The entered runner of the ``role`` model (onnxruntime's: at ``level``)."""
        art = ctx.inputs[role]
        runner = entered_runner(stack, side, _model(ctx, role), ctx.host, f"the {role} {art.step}", level=level)
        ctx.log(f"{role}: {at_level(runner.label, level)}")
        return runner

    def run(self, ctx: StepContext) -> None:
        sides = {role: self._side(ctx, role) for role in ("reference", "candidate")}
        names = {role: f"the {role} {ctx.inputs[role].step}" for role in sides}
        # the models run in a forked child: a native crash at onnxruntime's default level is
        # tried again at a lower one (run_models)
        report, levels, crash_notes = run_models(lambda at, stage: self._check(ctx, sides, at, stage),
                                                 sides, names, "verify")
        report["levels"] = levels
        report["notes"] += crash_notes
        names_compared = list(report["outputs"])
        figures, user, passed = report["outputs"], report["metric"], report["passed"]
        text = compare.table(report)
        ctx.log(text)
        for warning in report["warnings"]:
            ctx.warn(warning)
        for n in names_compared:
            for metric in ("max_abs", "max_rel", "cosine", "top1"):
                if figures[n].get(metric) is not None:
                    ctx.metrics[f"{n}.{metric}" if len(names_compared) > 1 else metric] = figures[n][metric]
        for part, g in compare.judged(figures).items():  # the parts checked: a detector's scores
            if part not in figures:
                ctx.metrics.update({f"{part}.{metric}": g[metric] for metric in ("max_abs", "max_rel", "cosine")})
        for figure, value in (user["figures"] if user else {}).items():
            ctx.metrics[f"metric.{figure}"] = value
        ctx.metrics.update(samples=report["data"]["samples"], passed=passed,
                           reference_ms=report["latency_ms"]["reference"],
                           candidate_ms=report["latency_ms"]["candidate"])
        if not passed and self.params.fail is not False:
            raise StepError(text)
        (ctx.out_dir / "report.json").write_text(json.dumps(compare.jsonable(report), indent=1) + "\n")
        (ctx.out_dir / "report.txt").write_text(text + "\n")

    def _check(self, ctx: StepContext, sides: dict[str, tuple[Backend, Manifest]], levels: Mapping[str, str | None],
               stage: Stage) -> dict[str, Any]:
        """The report (without its text): both models run on the samples, at ``levels``
        (onnxruntime's, per side), and their outputs compared. Run in a forked child: ``stage``
        says which model it loads or runs, for a crash to be told."""
        import numpy as np

        from optbuild.model import samples as sampling

        p = self.params
        ref_art, cand_art = ctx.inputs["reference"], ctx.inputs["candidate"]
        with contextlib.ExitStack() as stack:
            stage(("reference", "loading"))
            runners = {"reference": self._open(ctx, "reference", sides["reference"], stack, levels["reference"])}
            ref_specs = runners["reference"].input_specs()
            stage("drawing the samples")
            if p.data is not None:
                samples = sampling.load_samples(p.data, ctx.base_dir, ref_specs, args=p.data_args, limit=p.samples)
                source = p.data + (f" ({', '.join(f'{k}={v}' for k, v in p.data_args.items())})"
                                   if p.data_args else "")
            else:
                check_declarations(ref_specs, p.inputs, f"the reference {ref_art.step}")
                samples = sampling.random_samples(ref_specs, p.samples or 8, p.seed, dynamic_size=p.dynamic_size,
                                                   int_range=(p.int_range[0], p.int_range[1]), decls=p.inputs)
                source = samples.source
            for role, (backend, manifest) in sides.items():  # before an engine loads on a GPU
                for index, feed in enumerate(samples.feeds):
                    if (why := backend.unfit(manifest, feed)) is not None:
                        raise StepError(f"sample {index} of {source} does not fit the {role} "
                                        f"{ctx.inputs[role].step}: {why}. Feed samples it takes (e.g. a "
                                        "smaller batch), or widen its step's profiles")
            stage(("candidate", "loading"))
            runners["candidate"] = self._open(ctx, "candidate", sides["candidate"], stack, levels["candidate"])
            cand_inputs = [s.name for s in runners["candidate"].input_specs()]
            cand_names = runners["candidate"].output_names()
            if missing := [s.name for s in ref_specs if s.name not in cand_inputs]:
                raise StepError(f"the candidate {cand_art.step} lacks inputs {missing} of the reference "
                                f"(it has {cand_inputs})")
            if extra := [n for n in cand_inputs if n not in {s.name for s in ref_specs}]:
                raise StepError(f"the candidate {cand_art.step} has inputs {extra} the reference "
                                f"{ref_art.step} lacks (it has {[s.name for s in ref_specs]})")
            ref_names = runners["reference"].output_names()
            names = p.outputs or ref_names
            for name in names:
                if name not in ref_names:
                    raise StepError(f"outputs: the reference {ref_art.step} has no output {name!r} "
                                    f"(it has {ref_names})")
                if name not in cand_names:
                    raise StepError(f"the candidate {cand_art.step} has no output {name!r} (it has {cand_names})")

            results: dict[str, dict[str, list]] = {"reference": {n: [] for n in names},
                                                   "candidate": {n: [] for n in names}}
            latency = {}
            for role, runner in runners.items():
                stage((role, "running"))
                feeds = [runner.cast(f) for f in samples.feeds]
                try:
                    runner.infer(feeds[0])  # warm-up
                    started = time.perf_counter()
                    for feed in feeds:
                        outputs = runner.infer(feed)
                        for name in names:
                            results[role][name].append(np.asarray(outputs[name]))
                    latency[role] = (time.perf_counter() - started) / len(feeds) * 1000
                except Exception as exc:
                    raise StepError(f"the {role} {ctx.inputs[role].step} fails on the samples: "
                                    f"{type(exc).__name__}: {exc}") from None
            labels = {role: at_level(runner.label, levels[role]) for role, runner in runners.items()}

        stage("comparing the outputs")
        first = {n: results["reference"][n][0] for n in names}
        warnings: list[str] = []
        top1_axes = self._top1_axes(_model(ctx, "reference"), names, first)
        if p.min_top1 is not None and not top1_axes:
            warnings.append(self._top1_not_applied(names, first))
        if unknown := sorted(set(p.slices or {}) - set(names)):
            raise StepError(f"slices: no compared output {unknown[0]!r} (compared: {names})")
        figures = {n: compare.output_figures(results["reference"][n], results["candidate"][n], top1_axes.get(n),
                                             name=n, slices=self._slices(n, results["reference"][n],
                                                                         guess=n not in top1_axes))
                   for n in names}
        warnings += _reference_warnings(figures, len(samples))
        top1_names = list(top1_axes)
        thresholds = {"max_abs": p.max_abs, "max_rel": p.max_rel, "min_cosine": p.min_cosine, "min_top1": p.min_top1}
        checks = compare.threshold_checks(figures, thresholds, top1_names, samples=len(samples))
        user = None
        if p.metric is not None:
            from optbuild.model.usermetric import run_metric

            stage("running the metric")
            user_figures, user_passed = run_metric(p.metric, ctx.base_dir, results["reference"],
                                                   results["candidate"], names)
            user = {"callable": p.metric, "figures": user_figures, "passed": user_passed}
            checks.append({"output": p.metric, "metric": "passed", "value": user_passed, "op": "==",
                           "threshold": True, "ok": user_passed})
        return {
            "version": REPORT_VERSION,
            "reference": model_entry(_model(ctx, "reference")),
            "candidate": model_entry(_model(ctx, "candidate")),
            "data": {"source": source, "samples": len(samples)},
            "thresholds": thresholds,
            "outputs": figures,
            "metric": user,
            "checks": checks,
            "latency_ms": {k: round(v, 4) for k, v in latency.items()},
            "runtime": labels,
            "passed": all(c["ok"] for c in checks),
            "notes": [],
            "warnings": warnings,
        }

    def _top1_axes(self, reference: Path, names: list[str], first: dict[str, Any]) -> dict[str, int]:
        """Compared output -> the axis that holds its class scores: top1_outputs' (the axis the
        graph says, else the last), else those compare.class_axis finds in the reference's graph."""
        axes, linear = compare.softmax_axes(reference), compare.linear_axes(reference)
        found = {n: axis for n in names if (axis := compare.class_axis(first[n], axes.get(n), linear.get(n))) is not None}
        if not self.params.top1_outputs:
            return found
        named = {}
        for n in self.params.top1_outputs:
            if n not in names:
                raise StepError(f"top1_outputs: no compared output {n!r} (compared: {names})")
            named[n] = found.get(n, -1)
            if not compare.argmax_applies(first[n], named[n]):
                raise StepError(f"top1 does not apply to output {n!r} ({first[n].dtype} "
                                f"{list(first[n].shape)}): it needs a float output with a last axis "
                                "of 2 or more")
        return named

    def _top1_not_applied(self, names: list[str], first: dict[str, Any]) -> str:
        """The warning for min_top1 where no compared output holds class scores: a template's
        min_top1 over a classifier and an encoder applies to the classifier only (a table cannot
        unset it per model). With no other threshold nothing would be checked: a StepError."""
        p = self.params
        shapes = ", ".join(f"{n} {first[n].dtype} {list(first[n].shape)}" for n in names)
        why = (f"no compared output holds class scores on an axis ({shapes}): by default only a float output that a "
               "Softmax / LogSoftmax computes over its last axis (or axis 1 of [batch, classes, H, W]), a "
               "[batch, classes] or [batch, seq, vocab] one that a linear layer (Gemm, MatMul, MatMul + Add) "
               "computes, or a [batch, classes, H, W] one that a 1x1 Conv computes, does, as the reference's "
               "ONNX graph says; name the outputs whose last axis is the classes in top1_outputs")
        if all(t is None for t in (p.max_abs, p.max_rel, p.min_cosine, p.metric)):
            raise StepError(f"min_top1 is the only threshold, and it applies nowhere: {why}")
        return f"min_top1 not applied: {why}"

    def _slices(self, name: str, reference: list[Any], *, guess: bool) -> tuple[int, list[tuple[int, int]]] | None:
        """(axis, runs [start, stop)) ``name`` is cut into (see the slices parameter): as
        declared, else (with ``guess``) where its reference's scales part; None for an output
        judged whole. Class scores are not guessed at: some logits are far below the top
        ones by nature, and a cut there would judge noise."""
        import numpy as np

        shape = reference[0].shape
        if (decl := (self.params.slices or {}).get(name)) is not None:
            if decl.axis >= len(shape):
                raise StepError(f"slices.{name}.axis: {decl.axis} is past the last axis of {name} "
                                f"{list(shape)}; give an axis from 0 to {len(shape) - 1}")
            size = min(r.shape[decl.axis] if r.ndim == len(shape) else 0 for r in reference)  # every sample's
            if decl.at and decl.at[-1] >= size:
                raise StepError(f"slices.{name}.at: {decl.at[-1]} is not below the size {size} of axis "
                                f"{decl.axis} of {name} {list(shape)}; give indices from 1 to {size - 1}")
            bounds = [0, *decl.at, shape[decl.axis]]
            return decl.axis, list(itertools.pairwise(bounds))
        if (not guess or not np.issubdtype(reference[0].dtype, np.floating) or (axis := compare.split_axis(shape)) is None
                or any(r.shape != shape for r in reference)):  # parts of samples of other shapes: not guessed
            return None
        return axis, compare.scale_runs(reference, axis)


def _model(ctx: StepContext, role: str) -> Path:
    """The file of the ``role`` model: StepError when its step gives none."""
    art = ctx.inputs[role]
    if art.primary is None:
        raise StepError(f"the {role} {art.step} gives no model")
    return art.primary


def _reference_warnings(figures: dict[str, dict[str, Any]], samples: int) -> list[str]:
    """A warning per output whose reference barely depends on its input (the same class at every
    position, or values that hardly change from sample to sample): every candidate passes
    against such a reference, so the verdict shows little."""
    found = []
    for name, f in figures.items():
        if f.get("one_class") is not None:
            what = f"gives class {f['one_class']} at every position of all {samples} samples"
        elif f.get("flat"):
            what = f["flat"]
        else:
            continue
        found.append(f"the reference's output {name!r} barely depends on its input: it {what}, so any candidate close to "
                     "a constant passes. Give the reference trained weights (a randomly initialised model often "
                     "ignores its input: re-estimate its BatchNorm statistics on a few batches), or samples "
                     "that make it vary (data)")
    return found
