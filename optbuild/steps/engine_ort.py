"""kind = "engine", backend = "onnxruntime": an offline-optimized model for onnxruntime.

onnxruntime applies its graph optimizations at ``level`` for the execution ``provider`` and
saves the result as ONNX (``format = "onnx"``, model.onnx) or in ORT format (``format =
"ort"``, model.ort, loadable by minimal onnxruntime builds). A session loading it then skips
that work. The default is "all", the level onnxruntime opens any model at: a lower one saves a
graph without the CPU's NCHWc convolution layouts, and since verify, benchmark and select open
an engine at its own level (as a server must, to run what was verified), it ran conv nets at
0.30-0.72x of the plain model they open at "all" (issue 33). What each level does to which
models: ``OrtEngine``'s docstring, which the reference (docs/steps.md) prints.

Before it is kept, the result must load in onnxruntime (with the step's providers, at the
step's level, as verify and benchmark open it) and, at level "basic" in ONNX format (plain
ONNX), pass onnx.checker's full check, even with ``check = 0``; higher levels write
onnxruntime's own operators, e.g. LayerNormalization in the default domain below opset 17,
which onnx.checker rejects and onnxruntime runs. With the CPU provider it is then compared
with the input model on ``check`` seeded random inputs (per output, max error relative to the
input's <= ``tolerance``, or absolute <= ``atol``).

``engine.json`` beside it names the backend and the provider ({"backend": "onnxruntime",
"provider": "CUDAExecutionProvider", "level": ..., "format": ...}): verify and benchmark run
the model on that provider at that level (optbuild.backends.onnxruntime,
optbuild.model.runmodels.start_level), so a model optimized for CUDA is checked and timed on
CUDA, and ``select`` hands the file on with it.

Key: params, the input model's content, the onnxruntime version and distribution (host
fields, read from package metadata). "extended" and "all" also take cpu.arch and cpu.flags:
what they emit depends on the CPU (FIELD-NOTES: "all" inserts com.microsoft.nchwc ops).
Providers other than CPU need them present on the building host (and, for CUDA, an NVIDIA
GPU: the step is unavailable elsewhere, saying what it needs, as the backend says it for
verify and benchmark); the session's actual provider is checked too.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from optbuild.backends.manifest import write_manifest
from optbuild.backends.onnxruntime import BACKEND, providers
from optbuild.backends.onnxruntime.loader import session
from optbuild.common.errors import StepError, first_line
from optbuild.common.recipetable import StepRef
from optbuild.model.inputdecl import StepInputs, inputs_field
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext, StepParams
from optbuild.steps.fields import check_field, input_field, tolerance_field
from optbuild.steps.rewrite_check import Atol, atol_field

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


def _saving() -> list[str]:
    """The providers onnxruntime saves the graph it optimized for (``Provider.saves_graph``):
    those that compile subgraphs into their own nodes (TensorRT, OpenVINO) cannot serialize it."""
    return [name for name, p in providers.PROVIDERS.items() if p.saves_graph]


class OrtEngineParams(StepParams):
    backend: Literal["onnxruntime"] = Field(examples=["onnxruntime"])
    """Selects this engine: an onnxruntime model optimized offline."""
    input: StepRef = input_field("optimized (e.g. a simplify or quantize step).")
    level: Literal["basic", "extended", "all"] = Field("all", examples=["extended"])
    """onnxruntime's graph optimization level: 'basic' (constant folding, redundant nodes
    removed; plain ONNX), 'extended' (also provider-specific fusions into com.microsoft ops) or
    'all' (also layout changes such as NCHWc convolutions on x86: the level onnxruntime opens a
    plain model at). Verify, benchmark and select open the engine at this level. 'extended' and
    'all' depend on the CPU: its arch and flags enter the key. See 'Levels' above for what each
    does to which models."""
    format: Literal["onnx", "ort"] = Field("onnx", examples=["ort"])
    """'onnx' writes model.onnx; 'ort' writes model.ort, the ORT format that minimal onnxruntime
    builds load."""
    provider: str = Field(
        providers.CPU,
        description="The execution provider to optimize for: " + ", ".join(_saving()) + ". "
                    "Others must be present in this host's onnxruntime (CUDA and ROCm also need a "
                    "GPU); providers that compile the graph (TensorRT, OpenVINO...) are rejected.",
        examples=["CUDAExecutionProvider"])
    check: int = check_field("the result must still load in onnxruntime (and at level 'basic', format "
                             "'onnx', pass onnx.checker's full check).", scope="; CPU provider only")
    tolerance: float = tolerance_field("the optimized model", default=1e-3, example=1e-4)
    atol: Atol = atol_field()
    inputs: StepInputs = inputs_field()

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        known, saving = providers.PROVIDERS, ", ".join(_saving())
        if value in known and known[value].saves_graph:
            return value
        if value in known:
            raise ValueError(f"{value} compiles the graph into nodes onnxruntime cannot save; offline "
                             f"optimization works with {saving}"
                             + (" (for TensorRT use kind 'engine' with backend 'tensorrt')"
                                if "tensorrt" in value.lower() else ""))
        import difflib

        by_case = {name.lower(): name for name in known}
        hint = ([by_case[value.lower()]] if value.lower() in by_case
                else difflib.get_close_matches(value, list(known), n=1))
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(f"unknown execution provider {value!r}{suggestion} (one of: {saving})")


class OrtEngine(Step[OrtEngineParams]):
    """An onnxruntime model optimized offline (graph level, ONNX or ORT format), checked.

    Levels: verify, benchmark and select open the engine at its level (engine.json's
    "level"), as a server must to run what was verified, while they open a plain ONNX model at
    'all', onnxruntime's default. An engine below 'all' is therefore opened with less done to
    it than the model it came from: on the CPU, conv nets lose the NCHWc layouts.

    - `basic`: constant folding, redundant nodes removed, Conv+BatchNorm folded: plain ONNX
      that onnx.checker passes, the same on every CPU. Conv nets: about 0.7x the speed of the
      plain model (no fusions, no layouts). Transformers, MLPs: within 15 % of the others.
    - `extended`: also fusions into com.microsoft ops: Conv+activation (FusedConv), GELU,
      LayerNormalization, attention. Conv nets: 0.30-0.72x the speed of the plain model (no
      layouts). Transformers, MLPs: the fusions that matter to them.
    - `all`, the default: also layouts, NCHWc convolutions and pooling on x86
      (com.microsoft.nchwc, blocked by the CPU's vector width) and NHWC uint8 convolutions.
      Conv nets: the speed of the plain model, its optimization done once, ahead.
      Transformers, MLPs: the graph of 'extended' (the layouts touch no MatMul).

    Measured on x86 CPUs with onnxruntime 1.31, one thread: a 5-layer conv net, and a 2-layer
    encoder at 64 tokens (which ran at 'basic' in 0.87x the time of 'all'): where the levels
    are close, benchmark both and let select choose.

    On CUDA, ROCm and DirectML the fusions are the provider's, and 'all' adds layouts only to
    the nodes left to the CPU. 'extended' and 'all' write onnxruntime's own operators
    (onnx.checker may refuse them), and 'all' writes ops for this CPU's vector width: the key
    holds cpu.arch and cpu.flags, and the model is for CPUs like this one. Use 'basic' for a
    model another tool must read, and a lower level for a model that crashes onnxruntime at
    'all' (verify and benchmark say at which level it ran). Triton's onnxruntime backend
    opens a model at 'all' unless its config.pbtxt says `optimization { graph { level: 1 } }`
    (extended) or `level: -1` (basic).
    """

    primary_output: str = "model.onnx"  # or model.ort: set per step from its format

    Params = OrtEngineParams
    preload = ONNX_TOOLS
    builds_engine = True
    version = "2"  # 2: engine.json names the provider the model runs on

    def __init__(self, params: OrtEngineParams, base_dir: Path, project_root: Path):
        super().__init__(params, base_dir, project_root)
        # the main output's name follows the format (read per instance by the executor)
        self.primary_output = "model.ort" if params.format == "ort" else "model.onnx"

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        fields = ["onnxruntime.version", "onnxruntime.distribution"]
        if self.params.level != "basic":
            fields += ["cpu.arch", "cpu.flags"]
        return {name: host.get(name) for name in fields}

    def runs_on(self) -> dict[str, Any]:
        """What engine.json will say of the model: onnxruntime, on the step's provider."""
        return {"backend": BACKEND.name, "provider": self.params.provider}

    def unavailable(self, host: Fingerprint) -> str | None:
        return BACKEND.unavailable(host, self.runs_on())

    def run(self, ctx: StepContext) -> None:
        p = self.params
        source = ctx.onnx_input("the onnxruntime engine")
        out = ctx.out_dir / self.primary_output
        try:
            session(source, p.level, provider=p.provider, save=out)
        except Exception as exc:
            raise StepError(f"onnxruntime failed to optimize {ctx.inputs['input'].step} at level {p.level!r} "
                            f"for {p.provider}: {type(exc).__name__}: {first_line(exc)}") from None
        if not out.is_file():
            raise StepError(f"onnxruntime wrote no optimized model for {ctx.inputs['input'].step}")
        ctx.metrics.update(level=p.level, format=p.format, provider=p.provider,
                           bytes_before=source.stat().st_size, bytes_after=out.stat().st_size)
        self._describe(ctx, source, out)
        optimized = self._load(ctx, out)
        manifest = {**self.runs_on(), "level": p.level, "format": p.format}
        write_manifest(ctx.out_dir, manifest)
        if p.provider == providers.CPU and p.check:
            self._check(ctx, source, optimized)
        elif not p.check:
            ctx.log("numeric check disabled (check = 0); the result loads in onnxruntime")

    def _load(self, ctx: StepContext, out: Path) -> Any:
        """A session over the written model: one that cannot load must not be cached, even
        with check = 0. Plain ONNX (level basic) must also pass onnx.checker's full check."""
        import onnx

        label, level = ctx.inputs["input"].step, self.params.level
        if out.suffix == ".onnx" and level == "basic":
            try:
                onnx.checker.check_model(str(out), full_check=True)
            except Exception as exc:
                raise StepError(f"the level-basic model onnxruntime wrote of {label} fails onnx.checker's "
                                f"full check: {first_line(exc)}") from None
        try:  # at the step's level, as verify and benchmark open it (runmodels.start_level)
            return session(out, level, provider=self.params.provider)
        except Exception as exc:
            raise StepError(f"onnxruntime cannot load the level-{level} model it wrote of {label}: "
                            f"{first_line(exc)}") from None

    def _describe(self, ctx: StepContext, source: Path, out: Path) -> None:
        import onnx

        before = onnx.load(str(source), load_external_data=False)
        ctx.metrics["nodes_before"] = len(before.graph.node)
        if out.suffix == ".onnx":
            after = onnx.load(str(out), load_external_data=False)
            domains: dict[str, int] = {}
            for node in after.graph.node:
                domains[node.domain or "ai.onnx"] = domains.get(node.domain or "ai.onnx", 0) + 1
            ctx.metrics.update(nodes_after=len(after.graph.node), domains=domains)
            ctx.log(f"level {self.params.level}: {len(before.graph.node)} -> {len(after.graph.node)} nodes "
                    f"({', '.join(f'{d}: {n}' for d, n in sorted(domains.items()))})")
        else:
            ctx.log(f"level {self.params.level}: ORT format, {out.stat().st_size} bytes")

    def _check(self, ctx: StepContext, source: Path, optimized: Any) -> None:
        from optbuild.model.compare import compare_outputs
        from optbuild.model.inputdecl import check_declarations
        from optbuild.model.samples import describe_tried, feeds
        from optbuild.steps.rewrite_check import blame, infer_outputs, reference_runner, shapes

        p = self.params
        label, decls = ctx.inputs["input"].step, p.inputs
        worst_abs = worst_rel = 0.0
        with reference_runner(source, ctx.host) as reference:
            specs = reference.input_specs()
            check_declarations(specs, decls, label)
            names = reference.output_names()
            for check in range(p.check):
                feed = feeds(specs, decls, check)
                try:
                    got = optimized.run(names, feed)
                except Exception as exc:
                    raise blame(exc, source, feed, label, f"the level-{p.level} model",
                                describe_tried(specs, decls, [check]), ctx.host) from None
                result = compare_outputs(names, infer_outputs(reference, feed, names), got)
                failure = result.failure(p.tolerance, p.atol)
                if failure:
                    raise StepError(f"the level-{p.level} model disagrees with its input (check {check}, "
                                    f"seeded inputs {shapes(feed)}): {failure}")
                worst_abs, worst_rel = max(worst_abs, result.max_abs), max(worst_rel, result.max_rel)
        ctx.metrics.update(max_abs_error=worst_abs, max_rel_error=worst_rel)
