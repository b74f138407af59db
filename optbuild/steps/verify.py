"""kind = "verify": compare a candidate model's outputs with a reference's, fail past thresholds.

Both models run on onnxruntime (CPU, default session options) over the same samples: those
of ``data`` (the forms calibrate takes: .npz, folder of .npy, ``file.py:callable``) or
seeded random inputs of the reference's declared shapes (``samples``, ``seed``; unknown
dims get ``dynamic_size``, integer inputs draw from ``int_range``). The candidate may be an
ORT-format model (an onnxruntime engine step with format = "ort"); a float16 candidate gets
its float inputs cast to float16.

Figures, per output, over all samples:

``max_abs``  largest |candidate - reference| over every element.
``max_rel``  max_abs divided by the reference's largest magnitude (robust near zero, unlike
             an element-wise ratio; the same measure the export and simplify checks use).
``cosine``   cosine similarity of all the output's values, samples concatenated;
             ``cosine_min`` (reported, not checked) is the worst single sample's.
``top1``     share of positions (every index but the last axis) whose argmax over the last
             axis agrees: top-1 agreement of class scores. Computed, and checked against
             ``min_top1``, only where the last axis holds class scores: on ``top1_outputs``,
             or by default on the float outputs with a last axis of 2 or more that a Softmax
             or LogSoftmax over that axis computes (through Identity, Cast and Q/DQ nodes;
             read from the reference's ONNX graph) or that are [batch, classes], rank 2.
             Anything else (a pixel map [N, 1, H, W], a recurrent state [2, N, 128], box
             regressions, rank-3 logits without a Softmax) gets no top-1 unless named.

Thresholds (``max_abs``, ``max_rel``, ``min_cosine``, ``min_top1``) apply to every compared
output; at least one must be set. The artifact is ``report.json`` (figures, thresholds,
checks, latencies) and ``report.txt`` (the same as a table). They name the models compared
by file and content digest, never by step: the key holds the models' content, not the steps'
names, so two verify steps over byte-identical models share one entry, and a report restored
for either must be true of both. When a check fails the step fails with that table as its
message; nothing is cached, and the next build runs it again.

Hardware: quantized kernels differ between CPUs (x86 without VNNI saturates where VNNI
does not), so the key holds cpu.arch and cpu.flags: a verdict is reused only on CPUs alike.

Engine candidates: when ``candidate`` names an engine step with backend "tensorrt" or
"tensorrt-rtx", the reference still runs on onnxruntime (CPU) and the candidate's
``model.engine`` on gpu.0 through ``optbuild.backends.tensorrt``'s TrtRunner, over the same
samples, each of which must fit one of the engine's optimization profiles (checked first,
from its ``engine.json``). Such a step is hardware-bound: it is unavailable on a host without
an NVIDIA GPU, without the runtime's module or cuda-python, or (TensorRT-RTX) whose gpu.0 is
not among the engine step's targets. Its key adds the runtime's distribution and version,
and gpu.0's compute capability: the kernels that ran depend on it (the engine's own bytes,
tactics included, are in the key already, as the candidate's content). TensorRT-RTX
specializes an engine for the GPU that loads it, so its key holds gpu.0's model name too.
Nothing of this is written in the verify step: planning learns it from the candidate step
(``bind``), the worker from the engine's ``engine.json``.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from optbuild.backends.tensorrt import RUNTIMES, Runtime
from optbuild.backends.tensorrt.host import (
    cudart_missing,
    gpu_missing,
    module_missing,
    rtx_target_missing,
    runtime_distribution,
)
from optbuild.callables import Call
from optbuild.errors import StepError, StepUnavailable
from optbuild.steps.base import Artifact, Step, StepContext, StepParams, StepRef
from optbuild.steps.calibdata import (
    DataArg,
    check_data_source,
    data_calls,
    data_key_files,
    non_default,
    ort_distribution,
)
from optbuild.steps.inputdecl import StepInputs, check_declarations

if typing.TYPE_CHECKING:
    from optbuild.fingerprint import Fingerprint

REPORT_VERSION = 2  # 2: models named by file and digest, not by step
DataSource = Annotated[str, AfterValidator(check_data_source)]


class VerifyParams(StepParams):
    reference: StepRef = Field(
        description="The step whose model is taken as right (an ONNX or ORT-format model, run on "
                    "onnxruntime, CPU).",
        examples=["simplify"])
    candidate: StepRef = Field(
        description="The step whose model is tested: an ONNX or ORT-format model (onnxruntime, "
                    "CPU), or an engine step of backend 'tensorrt' / 'tensorrt-rtx', whose engine "
                    "then runs on gpu.0 (the step is unavailable on hosts that cannot run it).",
        examples=["quantize_int8"])
    data: DataSource | None = Field(
        None,
        description="Sample inputs, in the forms calibrate takes: an .npz file, a folder of .npy "
                    "files or 'file.py:callable' (see 'Data sources and data callables'). Their "
                    "dtypes must be the reference's input types. Not set: seeded random inputs "
                    "(samples, seed, dynamic_size, int_range).",
        examples=["models/calib.py:images"])
    data_args: dict[str, DataArg] = Field(
        {},
        description="Keyword arguments for a data callable: names -> strings, integers, floats or "
                    "booleans, passed as `callable(**data_args)`; e.g. another seed than "
                    "calibration's for held-out samples. Only with a 'file.py:callable' data source.",
        examples=[{"count": 64, "seed": 1}])
    samples: int | None = Field(
        None, ge=1,
        description="With data: use at most this many samples (not set: all). With random inputs: "
                    "this many samples (not set: 8).",
        examples=[32])
    seed: int = Field(
        0, ge=0,
        description="Random inputs only: the seed of the generator (numpy default_rng), so the "
                    "samples are the same on every run.",
        examples=[1])
    dynamic_size: int = Field(
        1, ge=1,
        description="Random inputs only: the size given to every dimension the reference does "
                    "not fix (symbolic or unknown, the batch axis included).",
        examples=[4])
    int_range: list[int] = Field(
        [0, 8],
        description="Random inputs only: integer inputs (token ids, indices) are drawn uniformly "
                    "from [low, high), high excluded; low < high. Floats are standard normal, "
                    "booleans uniform.",
        examples=[[0, 30522]])
    inputs: StepInputs = Field(
        None,
        description="Random inputs only: what the reference's inputs take (see 'Model inputs'); "
                    "replaces the recipe's [inputs.NAME] entry of the same input. A declared input "
                    "follows its declaration, the others dynamic_size and int_range.",
        examples=[{"sr": {"values": [8000, 16000]}}])
    outputs: list[str] = Field(
        [],
        description="Names of the outputs to compare (each must exist in both models). Empty: "
                    "every output of the reference.",
        examples=[["logits"]])
    max_abs: float | None = Field(
        None, ge=0,
        description="Fail when the largest |candidate - reference| over all elements of an "
                    "output exceeds this. Not set: not checked (at least one threshold is "
                    "required).",
        examples=[0.02])
    max_rel: float | None = Field(
        None, ge=0,
        description="Fail when max_abs divided by the reference output's largest magnitude "
                    "exceeds this. Not set: not checked.",
        examples=[0.01])
    min_cosine: float | None = Field(
        None, ge=-1, le=1,
        description="Fail when the cosine similarity of an output's values (all samples "
                    "concatenated) is below this (-1 to 1). Not set: not checked.",
        examples=[0.999])
    min_top1: float | None = Field(
        None, ge=0, le=1,
        description="Fail when the share of positions whose argmax over the last axis agrees "
                    "(top-1 agreement, 0 to 1) is below this, on the outputs that hold class "
                    "scores (see top1_outputs). Not set: not checked.",
        examples=[0.95])
    top1_outputs: list[str] = Field(
        [],
        description="The outputs whose last axis holds class scores: top-1 is computed and "
                    "min_top1 checked on these (needs min_top1; within outputs when that is set; "
                    "each a float output with a last axis of 2 or more). Empty: the compared float "
                    "outputs with a last axis of 2 or more that a Softmax or LogSoftmax over that "
                    "axis computes in the reference's ONNX graph (through Identity, Cast, Q/DQ), "
                    "or that have rank 2, [batch, classes]; others (pixel maps, recurrent states, "
                    "boxes, rank-3 logits without a Softmax) get no top-1 unless named here.",
        examples=[["logits"]])

    @field_validator("int_range")
    @classmethod
    def _range(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or value[0] >= value[1]:
            raise ValueError(f"int_range must be [low, high) with low < high, got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> VerifyParams:
        if self.reference == self.candidate:
            raise ValueError("reference and candidate name the same step")
        if all(t is None for t in (self.max_abs, self.max_rel, self.min_cosine, self.min_top1)):
            raise ValueError("set at least one threshold: max_abs, max_rel, min_cosine or min_top1")
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
        return self


# GPU fields in the key of a verify step whose candidate is an engine of that runtime.
_GPU_FIELDS = {
    "tensorrt": ("gpu.0.compute_capability",),
    "tensorrt-rtx": ("gpu.0.compute_capability", "gpu.0.name"),  # specialized at load, per GPU
}


class Verify(Step):
    """Compares a candidate model's outputs with a reference's and fails past thresholds."""

    kind = "verify"
    Params = VerifyParams
    version = "2"  # 2: reports name no steps; top-1 only on class scores
    primary_output = "report.json"
    host_fields = ("cpu.arch", "cpu.flags")

    # What the candidate step says of itself (see bind): its TensorRT flavour, None for a
    # model onnxruntime runs, and for TensorRT-RTX the compute capabilities it targets.
    runtime: Runtime | None = None
    targets: tuple[str, ...] = ()

    def bind(self, upstream: Mapping[str, Step]) -> None:
        candidate = upstream.get("candidate")
        runtime = getattr(candidate, "runtime", None)  # TensorRT / TensorRT-RTX engine steps
        if isinstance(runtime, Runtime):
            self.runtime = runtime
            self.targets = tuple(getattr(candidate.params, "targets", None) or ())

    def tool_names(self) -> tuple[str, ...]:
        if (runtime := self.runtime) is None:
            return (ort_distribution(), "numpy")
        return (ort_distribution(), "numpy", runtime_distribution(runtime.module))

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        gpu = _GPU_FIELDS[self.runtime.backend] if self.runtime is not None else ()
        return {name: host.get(name) for name in self.host_fields + gpu}

    def unavailable(self, host: Fingerprint) -> str | None:
        if (runtime := self.runtime) is None:
            return None
        needs = []
        if (error := gpu_missing(host)) is not None:
            needs.append(f"an NVIDIA GPU to run the {runtime.label} engine (here: {error})")
        elif runtime.backend == "tensorrt-rtx" and (why := rtx_target_missing(host, self.targets)) is not None:
            needs.append(f"a GPU the {runtime.label} engine runs on: {why}")
        for missing in (module_missing(runtime.module, runtime.label, runtime.extra),
                        cudart_missing(runtime.extra)):
            if missing is not None:
                needs.append(missing)
        return "needs " + " and ".join(needs) if needs else None

    @staticmethod
    def _engine_manifest(art: Artifact) -> dict[str, Any] | None:
        """The ``engine.json`` of an engine candidate (its backend, targets, profiles); None
        for an ONNX / ORT-format model."""
        primary = art.primary
        if primary is None or primary.suffix != ".engine":
            return None
        try:
            manifest = json.loads(Path(art.files.get("engine.json") or art.dir / "engine.json").read_text())
            backend = manifest["backend"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StepError(f"the candidate {art.step} has no readable engine.json beside {primary.name} "
                            f"({type(exc).__name__}: {exc}); verify takes engines from engine steps") from None
        if backend not in RUNTIMES:
            raise StepError(f"the candidate {art.step} is an engine of backend {backend!r}; verify runs "
                            f"engines of {', '.join(map(repr, RUNTIMES))}")
        return manifest

    @staticmethod
    def _engine_infer(ctx: StepContext, art: Artifact, manifest: dict[str, Any], names: list[str],
                      stack: contextlib.ExitStack) -> tuple[Callable[[dict[str, Any]], list], str]:
        """(feed -> outputs in ``names`` order, what runs it) for the engine candidate ``art``,
        on a TrtRunner that ``stack`` closes."""
        from optbuild.backends.tensorrt.loader import open_engine
        from optbuild.backends.tensorrt.runner import TrtRunner

        targets = manifest.get("targets")
        targets = [] if targets in (None, "default") else list(targets)
        assert art.primary is not None
        try:
            loaded = open_engine(art.primary, ctx.host, runtime=RUNTIMES[manifest["backend"]], targets=targets)
        except StepUnavailable as exc:
            raise StepError(f"the candidate {art.step} cannot run on this host: {exc}") from None
        runner = stack.enter_context(TrtRunner(loaded))
        ctx.log(f"candidate: {loaded.label} on {loaded.device}")

        def infer(feed: dict[str, Any]) -> list:
            outputs = runner.infer(feed)
            return [outputs[name] for name in names]

        return infer, f"{loaded.label} on {loaded.device}"

    def key_files(self):
        files = super().key_files()
        files.extend(p for p in data_key_files(self.params.data, self.base_dir, self.project_root)
                     if p not in files)
        return files

    def calls(self) -> list[Call]:
        return data_calls(self.params.data, self.params.data_args)

    def run(self, ctx: StepContext) -> None:
        import numpy as np

        from optbuild.steps import calibdata

        p = self.params
        ref_art, cand_art = ctx.inputs["reference"], ctx.inputs["candidate"]
        manifest = self._engine_manifest(cand_art)  # None: the candidate runs on onnxruntime
        sessions = {}
        for role, art in (("reference", ref_art), ("candidate", cand_art))[:1 if manifest else 2]:
            if art.primary is None or art.primary.suffix not in (".onnx", ".ort"):
                raise StepError(f"{role} {art.step} gives no ONNX or ORT-format model")
            try:
                sessions[role] = calibdata.session(art.primary)
            except Exception as exc:
                raise StepError(f"onnxruntime cannot load the {role} {art.step}: {exc}") from None
        ref_specs = calibdata.input_specs(sessions["reference"])
        if manifest is None:
            cand_specs = {s.name: s for s in calibdata.input_specs(sessions["candidate"])}
            cand_inputs = sorted(cand_specs)
            cand_names = [o.name for o in sessions["candidate"].get_outputs()]
        else:
            cand_inputs = [entry["name"] for entry in manifest["inputs"]]
            cand_names = [entry["name"] for entry in manifest["outputs"]]
            if extra := [n for n in cand_inputs if n not in {s.name for s in ref_specs}]:
                raise StepError(f"the candidate engine {cand_art.step} has inputs {extra} the reference "
                                f"{ref_art.step} lacks (it has {[s.name for s in ref_specs]})")
        if missing := [s.name for s in ref_specs if s.name not in cand_inputs]:
            raise StepError(f"the candidate {cand_art.step} lacks inputs {missing} of the reference "
                            f"(it has {cand_inputs})")
        if p.data is not None:
            samples = calibdata.load_samples(p.data, ctx.base_dir, ref_specs, args=p.data_args, limit=p.samples)
            source = p.data + (f" ({', '.join(f'{k}={v}' for k, v in p.data_args.items())})" if p.data_args else "")
        else:
            check_declarations(ref_specs, p.inputs, f"the reference {ref_art.step}")
            samples = calibdata.random_samples(ref_specs, p.samples or 8, p.seed, dynamic_size=p.dynamic_size,
                                               int_range=(p.int_range[0], p.int_range[1]), decls=p.inputs)
            source = samples.source

        ref_names = [o.name for o in sessions["reference"].get_outputs()]
        names = p.outputs or ref_names
        for name in names:
            if name not in ref_names:
                raise StepError(f"outputs: the reference {ref_art.step} has no output {name!r} (it has {ref_names})")
            if name not in cand_names:
                raise StepError(f"the candidate {cand_art.step} has no output {name!r} (it has {cand_names})")
        if manifest is not None:
            _check_profiles(manifest, samples.feeds, source, cand_art.step)

        def cast(feed: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for name, value in feed.items():
                want = cand_specs[name].dtype
                floats = ("float16", "float32", "float64")
                out[name] = value.astype(want) if want != str(value.dtype) and want in floats \
                    and str(value.dtype) in floats else value
            return out

        results: dict[str, dict[str, list]] = {"reference": {n: [] for n in names},
                                               "candidate": {n: [] for n in names}}
        latency = {}
        engine_runtime = None  # what ran an engine candidate, for the report
        with contextlib.ExitStack() as stack:
            infer: dict[str, Callable[[dict[str, Any]], list]] = {
                "reference": lambda feed: sessions["reference"].run(names, feed)}
            if manifest is None:
                infer["candidate"] = lambda feed: sessions["candidate"].run(names, feed)
                cand_feeds = [cast(f) for f in samples.feeds]
            else:
                infer["candidate"], engine_runtime = self._engine_infer(ctx, cand_art, manifest, names, stack)
                cand_feeds = samples.feeds  # the runner casts to the engine's types
            for role, feeds in (("reference", samples.feeds), ("candidate", cand_feeds)):
                try:
                    infer[role](feeds[0])  # warm-up
                    started = time.perf_counter()
                    for feed in feeds:
                        for name, value in zip(names, infer[role](feed)):
                            results[role][name].append(np.asarray(value))
                    latency[role] = (time.perf_counter() - started) / len(feeds) * 1000
                except Exception as exc:
                    art = ref_art if role == "reference" else cand_art
                    raise StepError(f"the {role} {art.step} fails on the samples: {type(exc).__name__}: "
                                    f"{exc}") from None

        first = {n: results["reference"][n][0] for n in names}
        if p.top1_outputs:
            top1_names = p.top1_outputs
            for n in top1_names:
                if n not in names:
                    raise StepError(f"top1_outputs: no compared output {n!r} (compared: {names})")
                if not _argmax_applies(first[n]):
                    raise StepError(f"top1 does not apply to output {n!r} ({first[n].dtype} "
                                    f"{list(first[n].shape)}): it needs a float output with a last axis "
                                    "of 2 or more")
        else:
            axes = softmax_axes(ref_art.primary)
            top1_names = [n for n in names if class_scores(first[n], axes.get(n))]
            if p.min_top1 is not None and not top1_names:
                shapes = ", ".join(f"{n} {first[n].dtype} {list(first[n].shape)}" for n in names)
                raise StepError(f"min_top1 is set but no compared output holds class scores on its last "
                                f"axis ({shapes}): by default only a float output that a Softmax / LogSoftmax "
                                "over its last axis computes, or a [batch, classes] one of rank 2, does. "
                                "Name the outputs whose last axis is the classes in top1_outputs")
        figures = {n: _figures(results["reference"][n], results["candidate"][n], top1=n in top1_names)
                   for n in names}
        checks = []
        for n in names:
            f = figures[n]
            if f.get("shape_mismatch"):
                checks.append(_check(n, "shape", f["shape_mismatch"], "==", "reference", False))
                continue
            for metric, op, threshold in (("max_abs", "<=", p.max_abs), ("max_rel", "<=", p.max_rel),
                                          ("cosine", ">=", p.min_cosine)):
                if threshold is not None:
                    checks.append(_check(n, metric, f[metric], op, threshold,
                                         _holds(f[metric], op, threshold)))
            if p.min_top1 is not None and n in top1_names:
                checks.append(_check(n, "top1", f["top1"], ">=", p.min_top1, _holds(f["top1"], ">=", p.min_top1)))
        passed = all(c["ok"] for c in checks)
        report = {
            "version": REPORT_VERSION,
            "reference": _model_entry(ref_art.primary),
            "candidate": _model_entry(cand_art.primary),
            "data": {"source": source, "samples": len(samples)},
            "thresholds": {"max_abs": p.max_abs, "max_rel": p.max_rel, "min_cosine": p.min_cosine,
                           "min_top1": p.min_top1},
            "outputs": figures,
            "checks": checks,
            "latency_ms": {k: round(v, 4) for k, v in latency.items()},
            "passed": passed,
        }
        if manifest is not None:
            report["runtime"] = {"reference": "onnxruntime (CPU)", "candidate": engine_runtime}
        text = _table(report)
        ctx.log(text)
        for n in names:
            for metric in ("max_abs", "max_rel", "cosine", "top1"):
                if figures[n].get(metric) is not None:
                    ctx.metrics[f"{n}.{metric}" if len(names) > 1 else metric] = figures[n][metric]
        ctx.metrics.update(samples=len(samples), passed=passed,
                           reference_ms=report["latency_ms"]["reference"],
                           candidate_ms=report["latency_ms"]["candidate"])
        if not passed:
            raise StepError(text)
        (ctx.out_dir / "report.json").write_text(json.dumps(_jsonable(report), indent=1) + "\n")
        (ctx.out_dir / "report.txt").write_text(text + "\n")


# Ops whose output holds their input's values in its layout: a graph output behind them is
# what the op before them computed (a Softmax's probabilities behind an Identity or a Cast).
_PASS_THROUGH = frozenset({"Identity", "Cast", "QuantizeLinear", "DequantizeLinear"})


def softmax_axes(model: Path) -> dict[str, int]:
    """Graph output -> the axis of the Softmax / LogSoftmax that computes it (through
    Identity, Cast and Q/DQ nodes); the outputs that other ops compute are absent, and so is
    every output of an ORT-format model, which onnx cannot read."""
    if model.suffix != ".onnx":
        return {}
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    producer = {out: node for node in proto.graph.node for out in node.output}
    axes = {}
    for output in proto.graph.output:
        node = producer.get(output.name)
        while node is not None and node.op_type in _PASS_THROUGH:
            node = producer.get(node.input[0])
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            default = -1 if opset >= 13 else 1  # opset 13 moved the default from 1 to -1
            axes[output.name] = next((a.i for a in node.attribute if a.name == "axis"), default)
    return axes


def _argmax_applies(array: Any) -> bool:
    """Whether an argmax over the last axis can be taken at all: float, 2 or more entries."""
    import numpy as np

    return np.issubdtype(array.dtype, np.floating) and array.ndim >= 1 and array.shape[-1] >= 2


def class_scores(array: Any, softmax_axis: int | None) -> bool:
    """Whether the last axis of an output (``array``, one sample) holds class scores, so that
    its argmax means something: a Softmax / LogSoftmax over that axis computed it
    (``softmax_axis``, from ``softmax_axes``), or, with no Softmax, it is [batch, classes]
    (rank 2). A pixel map or a recurrent state has a last axis too, and no classes on it."""
    if not _argmax_applies(array):
        return False
    if softmax_axis is not None:
        return softmax_axis in (-1, array.ndim - 1)
    return array.ndim == 2


def _model_entry(path: Path) -> dict[str, str]:
    """A compared model as the report names it: file name and content digest (what the key
    holds), never the step that made it."""
    from optbuild.digest import ALGORITHM, hash_file

    return {"file": path.name, "digest": f"{ALGORITHM}:{hash_file(path)[0]}"}


def _check_profiles(manifest: dict[str, Any], feeds: list[dict[str, Any]], source: str, step: str) -> None:
    """StepError unless every sample fits one of the engine's optimization profiles: said
    before any GPU work, naming the sample, the input, its shape and the profile's bounds."""
    from optbuild.backends.tensorrt.profiles import ShapeMismatch, choose_profile, from_manifest

    inputs, profiles = from_manifest(manifest)
    for index, feed in enumerate(feeds):
        try:
            choose_profile(inputs, profiles, {name: feed[name].shape for name in inputs})
        except ShapeMismatch as exc:
            raise StepError(f"sample {index} of {source} does not fit the candidate engine {step}: {exc}. "
                            "Feed samples the engine takes (e.g. a smaller batch), or widen the engine "
                            "step's profiles") from None


def _holds(value: float | None, op: str, threshold: float) -> bool:
    if value is None or not math.isfinite(value):
        return False
    return value <= threshold if op == "<=" else value >= threshold


def _check(output: str, metric: str, value: Any, op: str, threshold: Any, ok: bool) -> dict[str, Any]:
    return {"output": output, "metric": metric, "value": value, "op": op, "threshold": threshold, "ok": ok}


def _cosine(a, b) -> float:
    import numpy as np

    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _figures(reference: list, candidate: list, top1: bool) -> dict[str, Any]:
    """Figures of one output over all samples (arrays per sample); ``top1`` when its last
    axis holds class scores."""
    import numpy as np

    shapes = [(tuple(r.shape), tuple(c.shape)) for r, c in zip(reference, candidate)]
    figures: dict[str, Any] = {"shape": list(shapes[0][0]), "dtype": str(candidate[0].dtype)}
    bad = [(i, r, c) for i, (r, c) in enumerate(shapes) if r != c]
    if bad:
        i, r, c = bad[0]
        figures["shape_mismatch"] = f"sample {i}: {c} vs {r}"
        return figures
    ref = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in reference])
    cand = np.concatenate([np.asarray(c, dtype=np.float64).ravel() for c in candidate])
    if ref.size == 0:
        return figures | {"max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "cosine_min": 1.0, "top1": None}
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(ref - cand)
        max_abs = float(np.max(err)) if not np.isnan(err).any() else float("nan")
        scale = float(np.max(np.abs(ref)))
    figures["max_abs"] = max_abs
    figures["max_rel"] = max_abs / max(scale, 1e-12)
    figures["cosine"] = _cosine(ref, cand) if np.isfinite(cand).all() else float("nan")
    figures["cosine_min"] = min(
        (_cosine(np.asarray(r, np.float64).ravel(), np.asarray(c, np.float64).ravel())
         for r, c in zip(reference, candidate)), default=1.0) if np.isfinite(cand).all() else float("nan")
    agreement = None
    if top1:
        agree = total = 0
        for r, c in zip(reference, candidate):
            a = np.argmax(r.reshape(-1, r.shape[-1]), axis=-1)
            b = np.argmax(np.asarray(c).reshape(-1, c.shape[-1]), axis=-1)
            agree += int(np.sum(a == b))
            total += a.size
        agreement = agree / total if total else None
    figures["top1"] = agreement
    return figures


def _fmt(metric: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if metric in ("top1", "min_top1"):
        return f"{value * 100:.1f}%"
    if metric in ("cosine", "cosine_min"):
        return f"{value:.5f}"
    return f"{value:.4g}"


def _fmt_threshold(metric: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    return f"{value * 100:g}%" if metric == "top1" else f"{value:g}"


def _describe(entry: dict[str, str]) -> str:
    algorithm, _, digest = entry["digest"].partition(":")
    return f"{entry['file']} ({algorithm} {digest[:12]})"


def _table(report: dict[str, Any]) -> str:
    """The readable report: a header, one row per figure (checked or not), a verdict. It
    names no step (see the module's docstring)."""
    checks = {(c["output"], c["metric"]): c for c in report["checks"]}
    rows = [("output", "figure", "value", "threshold", "result")]
    for name, f in report["outputs"].items():
        if f.get("shape_mismatch"):
            rows.append((name, "shape", f["shape_mismatch"], "== reference", "FAIL"))
            continue
        for metric in ("max_abs", "max_rel", "cosine", "cosine_min", "top1"):
            if f.get(metric) is None and (name, metric) not in checks:
                continue
            check = checks.get((name, metric))
            threshold = f"{check['op']} {_fmt_threshold(metric, check['threshold'])}" if check else ""
            result = ("ok" if check["ok"] else "FAIL") if check else ""
            rows.append((name, metric, _fmt(metric, f.get(metric)), threshold, result))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        f"verify: candidate {_describe(report['candidate'])} vs reference {_describe(report['reference'])}",
        f"{report['data']['samples']} samples from {report['data']['source']}",
        "",
    ]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    lat = report["latency_ms"]
    lines.append("")
    if "runtime" in report:
        lines.append(f"latency per sample (this host): reference {lat['reference']:.3f} ms on "
                     f"{report['runtime']['reference']}, candidate {lat['candidate']:.3f} ms on "
                     f"{report['runtime']['candidate']}")
    else:
        lines.append(f"latency per sample (CPU, this host): reference {lat['reference']:.3f} ms, "
                     f"candidate {lat['candidate']:.3f} ms")
    failed = [c for c in report["checks"] if not c["ok"]]
    total = len(report["checks"])
    if failed:
        what = "; ".join(f"{c['output']} {c['metric']} {_fmt(c['metric'], c['value'])} (needs {c['op']} "
                         f"{_fmt_threshold(c['metric'], c['threshold'])})" for c in failed)
        lines.append(f"FAILED: {len(failed)} of {total} checks: {what}")
    else:
        lines.append(f"passed: {total} of {total} checks")
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    """NaN and infinities as strings (report.json stays strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
