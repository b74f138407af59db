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

This module is the step: what its key holds, and the models run on the samples. Its parameters
live in ``verify_params``, the judgement of the outputs (top-1, parts, checks, warnings) in
``verify_judge``, and the report's table in optbuild.model.verifyreport.
"""

from __future__ import annotations

import contextlib
import json
import time
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optbuild.backends import registry
from optbuild.backends.base import Backend, Manifest, Runner, TensorSpec
from optbuild.common.errors import StepError
from optbuild.model import thresholds, verifyreport
from optbuild.model.inputdecl import check_declarations
from optbuild.model.isolation import Stage, opened_stack
from optbuild.model.runmodels import at_level, entered_runner, model_entry, run_models
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext
from optbuild.steps.fields import DataSourceStep
from optbuild.steps.verify_judge import judge
from optbuild.steps.verify_params import VerifyParams

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint
    from optbuild.model.samples import Samples

# 2: models named by file and digest, not by step; 3: what ran each side; 4: slices, degenerate
# and collapsed outputs, the user metric; 5: notes (a threshold that did not apply); 6: levels,
# onnxruntime's graph optimization level of each side, and a note for a level that crashed; 7:
# warnings (a threshold that did not apply, a reference that ignores its input), top-1 per token
# and per pixel (top1_axis, one_class), flat
REPORT_VERSION = 7


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
    checks_model = "candidate"

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

    def key_folders(self, files: Sequence[Path]) -> list[Path]:
        """As a data source's: the metric's imports are Python files."""
        return super().key_folders(files)

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
        text = verifyreport.table(report)
        ctx.log(text)
        for warning in report["warnings"]:
            ctx.warn(warning)
        for n in names_compared:
            for metric in ("max_abs", "max_rel", "cosine", "top1"):
                if figures[n].get(metric) is not None:
                    ctx.metrics[f"{n}.{metric}" if len(names_compared) > 1 else metric] = figures[n][metric]
        for part, g in thresholds.judged(figures).items():  # the parts checked: a detector's scores
            if part not in figures:
                ctx.metrics.update({f"{part}.{metric}": g[metric] for metric in ("max_abs", "max_rel", "cosine")})
        for figure, value in (user["figures"] if user else {}).items():
            ctx.metrics[f"metric.{figure}"] = value
        ctx.metrics.update(samples=report["data"]["samples"], passed=passed,
                           reference_ms=report["latency_ms"]["reference"],
                           candidate_ms=report["latency_ms"]["candidate"])
        if not passed and self.params.fail is not False:
            raise StepError(text)
        (ctx.out_dir / "report.json").write_text(json.dumps(verifyreport.jsonable(report), indent=1) + "\n")
        (ctx.out_dir / "report.txt").write_text(text + "\n")

    def _check(self, ctx: StepContext, sides: dict[str, tuple[Backend, Manifest]], levels: Mapping[str, str | None],
               stage: Stage) -> dict[str, Any]:
        """The report (without its text): both models run on the samples, at ``levels``
        (onnxruntime's, per side), and their outputs compared. Run in a forked child: ``stage``
        says which model it loads or runs, for a crash to be told."""
        p = self.params
        with opened_stack() as stack:
            stage(("reference", "loading"))
            runners = {"reference": self._open(ctx, "reference", sides["reference"], stack, levels["reference"])}
            ref_specs = runners["reference"].input_specs()
            stage("drawing the samples")
            samples, source = self._samples(ctx, ref_specs, sides)
            stage(("candidate", "loading"))
            runners["candidate"] = self._open(ctx, "candidate", sides["candidate"], stack, levels["candidate"])
            names = self._compared(ctx, runners, ref_specs)
            results, latency = _run_both(ctx, runners, samples.feeds, names, stage)
            labels = {role: at_level(runner.label, levels[role]) for role, runner in runners.items()}

        verdict = judge(p, _model(ctx, "reference"), results, names, len(samples), ctx.base_dir, stage)
        return {
            "version": REPORT_VERSION,
            "reference": model_entry(_model(ctx, "reference")),
            "candidate": model_entry(_model(ctx, "candidate")),
            "data": {"source": source, "samples": len(samples)},
            "thresholds": verdict.thresholds,
            "outputs": verdict.figures,
            "metric": verdict.user,
            "checks": verdict.checks,
            "latency_ms": {k: round(v, 4) for k, v in latency.items()},
            "runtime": labels,
            "passed": all(c["ok"] for c in verdict.checks),
            "notes": [],
            "warnings": verdict.warnings,
        }

    def _samples(self, ctx: StepContext, ref_specs: list[TensorSpec],
                 sides: dict[str, tuple[Backend, Manifest]]) -> tuple[Samples, str]:
        """The samples both models run on (``data``, else drawn for the reference's inputs)
        and where they came from; StepError for one that a side cannot take (checked before
        an engine loads on a GPU)."""
        from optbuild.model import samples as sampling

        p = self.params
        if p.data is not None:
            samples = sampling.load_samples(p.data, ctx.base_dir, ref_specs, args=p.data_args, limit=p.samples)
            source = p.data + (f" ({', '.join(f'{k}={v}' for k, v in p.data_args.items())})" if p.data_args else "")
        else:
            check_declarations(ref_specs, p.inputs, f"the reference {ctx.inputs['reference'].step}")
            samples = sampling.random_samples(ref_specs, p.samples or 8, p.seed, dynamic_size=p.dynamic_size,
                                               int_range=(p.int_range[0], p.int_range[1]), decls=p.inputs)
            source = samples.source
        for role, (backend, manifest) in sides.items():
            for index, feed in enumerate(samples.feeds):
                if (why := backend.unfit(manifest, feed)) is not None:
                    raise StepError(f"sample {index} of {source} does not fit the {role} "
                                    f"{ctx.inputs[role].step}: {why}. Feed samples it takes (e.g. a "
                                    "smaller batch), or widen its step's profiles")
        return samples, source

    def _compared(self, ctx: StepContext, runners: dict[str, Runner], ref_specs: list[TensorSpec]) -> list[str]:
        """The outputs compared (``outputs``, else all the reference's); StepError when the two
        models' inputs differ or one lacks a compared output."""
        ref_step, cand_step = ctx.inputs["reference"].step, ctx.inputs["candidate"].step
        cand_inputs = [s.name for s in runners["candidate"].input_specs()]
        if missing := [s.name for s in ref_specs if s.name not in cand_inputs]:
            raise StepError(f"the candidate {cand_step} lacks inputs {missing} of the reference (it has {cand_inputs})")
        if extra := [n for n in cand_inputs if n not in {s.name for s in ref_specs}]:
            raise StepError(f"the candidate {cand_step} has inputs {extra} the reference "
                            f"{ref_step} lacks (it has {[s.name for s in ref_specs]})")
        ref_names, cand_names = runners["reference"].output_names(), runners["candidate"].output_names()
        names = self.params.outputs or ref_names
        for name in names:
            if name not in ref_names:
                raise StepError(f"outputs: the reference {ref_step} has no output {name!r} (it has {ref_names})")
            if name not in cand_names:
                raise StepError(f"the candidate {cand_step} has no output {name!r} (it has {cand_names})")
        return names


def _run_both(ctx: StepContext, runners: dict[str, Runner], feeds: list[dict[str, Any]], names: list[str],
              stage: Stage) -> tuple[dict[str, dict[str, list]], dict[str, float]]:
    """Each model run on every sample after a warm-up: the ``names`` outputs per model, and its
    mean latency (ms) a sample; StepError naming the model that fails."""
    import numpy as np

    results: dict[str, dict[str, list]] = {role: {n: [] for n in names} for role in runners}
    latency = {}
    for role, runner in runners.items():
        stage((role, "running"))
        cast = [runner.cast(f) for f in feeds]
        try:
            runner.infer(cast[0])  # warm-up
            started = time.perf_counter()
            for feed in cast:
                outputs = runner.infer(feed)
                for name in names:
                    results[role][name].append(np.asarray(outputs[name]))
            latency[role] = (time.perf_counter() - started) / len(cast) * 1000
        except Exception as exc:
            raise StepError(f"the {role} {ctx.inputs[role].step} fails on the samples: "
                            f"{type(exc).__name__}: {exc}") from None
    return results, latency


def _model(ctx: StepContext, role: str) -> Path:
    """The file of the ``role`` model: StepError when its step gives none."""
    art = ctx.inputs[role]
    if art.primary is None:
        raise StepError(f"the {role} {art.step} gives no model")
    return art.primary
