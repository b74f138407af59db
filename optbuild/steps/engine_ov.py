"""kind = "engine", backend = "openvino": an OpenVINO IR (model.xml + model.bin) from an ONNX model.

OpenVINO's model converter (``openvino.convert_model``) turns the input step's ONNX model
into OpenVINO's own graph, with its conversion-time transformations (constant folding,
shape-subgraph cleanup). Inputs that ``inputs`` (or the recipe's [inputs.NAME]) declares a
shape for get it in the IR: a size fixes the dim, a range [min, max] or [min, opt, max]
bounds it; other dims stay as the ONNX model has them (dynamic dims stay dynamic). Then, by
``precision``:

* "fp32": saved as it is.
* "fp16": weights stored as float16 (``save_model(compress_to_fp16=True)``): half the file;
  the CPU plugin decompresses them when it compiles the model, and computes in its default
  inference precision (f32, or bf16 / fp16 on CPUs that have them natively).
* "int8": NNCF's post-training quantization (``nncf.quantize``, target device ANY, preset
  "performance": symmetric activations, or "mixed": asymmetric) inserts FakeQuantize ops
  with ranges observed on ``samples`` samples of ``calibration`` (the forms the calibrate
  step takes: .npz, a folder of .npy, ``file.py:callable``; see optbuild.model.samples),
  then fast bias correction. ``model_type = "transformer"`` (nncf.ModelType.TRANSFORMER)
  keeps the element-wise ops, normalizations and reductions of transformers float, quantizes
  the MatMuls, smooths their activation outliers into the weights first (SmoothQuant, with
  ``smooth_quant_alpha``) and makes "mixed" the default preset. ``ignored_scope`` (op
  names, op types, name patterns: nncf.IgnoredScope) keeps ops float; each entry must
  match an op of the converted model, checked before NNCF runs. ``overflow_fix`` is NNCF's
  7-bit weights against the saturating uint8 x int8 sums of x86 CPUs without VNNI.

The performance ``hint`` ("latency" or "throughput") is not part of the graph: it is stored
in the IR's rt_info (optbuild/hint) and in engine.json, and applied when a runner compiles
the model (optbuild.backends.openvino). engine.json also names the backend, the OpenVINO
version, the precision and the inputs and outputs (name, dtype, shape: null for a dynamic
dim, [min, max] for a bounded one); "fp32" IRs pin the inference precision f32 there.

Before it is kept, the IR must compile for the CPU, even with ``check = 0``. It is then
compared with its input model, run by onnxruntime as written, on ``check`` inputs: seeded
random ones (declared inputs, else symbolic dims 1, 2, 3 in turn) for fp32 and fp16, the
first calibration samples for int8 (random inputs would fall outside the calibrated
ranges). The IR runs at inference precision f32 there, whatever the CPU, so that the
verdict does not depend on the host. An output fails when its max error relative to its
largest magnitude exceeds ``tolerance`` (and its max abs error exceeds ``atol``), or, for
float outputs, when the cosine similarity of all its values over the comparisons (concatenated)
is below ``min_cosine``.

Key: the params, the input model's content, the calibration data (or the callable's file
and the project-local modules it imports) and the versions of openvino (and nncf and numpy
for int8); no host field. Conversion and FP16 compression are graph rewrites (constant
folding runs OpenVINO's reference implementations, not the CPU plugin's kernels): the same
IR on any host. NNCF quantizes for target device ANY, not for this CPU, and collects its
statistics at f32 inference precision; its ranges and bias corrections are float32 results
of the CPU plugin's kernels, which differ between instruction sets in the last bits
(measured with OpenVINO 2026.4 / NNCF 3.4 on one CPU, AVX2 against ONEDNN_MAX_CPU_ISA=SSE41:
201 bytes of a 5-conv net's 160 kB model.bin differed, biases and ranges by at most 2e-6
relative), which does not matter for a range, as with the calibrate step. The files are
reproducible: model.xml holds node names OpenVINO numbers from a per-process counter, and
each step runs in a fresh worker process, so a rebuild writes the same bytes.

OpenVINO and NNCF are imported inside ``run``, with their usage telemetry blocked (see
optbuild.backends.openvino.loader); importing this module imports neither.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import re
import time
import typing
from pathlib import Path
from typing import Any

from optbuild.backends.base import module_missing
from optbuild.backends.manifest import write_manifest
from optbuild.backends.openvino import LABEL, nncf_missing, openvino_missing
from optbuild.backends.openvino.loader import PINNED_PRECISION, RT_INFO_HINT, RT_INFO_PRECISION
from optbuild.common.errors import StepError
from optbuild.model.inputdecl import InputDecls
from optbuild.steps import fields
from optbuild.steps.base import ONNX_TOOLS, StepContext
from optbuild.steps.engine_ov_params import (
    MIN_COSINE,
    OV_TYPES,
    TOLERANCE,
    IgnoredScope,
    OpenVINOEngineParams,
)

if typing.TYPE_CHECKING:
    from optbuild.backends.base import TensorSpec
    from optbuild.common.fingerprint import Fingerprint


class OpenVINOEngine(fields.DataSourceStep[OpenVINOEngineParams]):
    """An OpenVINO IR (fp32, fp16 weights, or NNCF INT8) from an ONNX model, checked."""

    version = "1"
    Params = OpenVINOEngineParams
    preload = ONNX_TOOLS
    primary_output = "model.xml"
    host_fields = ()  # see the module docstring
    builds_engine = True
    data_param, args_param = "calibration", "calibration_args"

    # --- what the key covers -------------------------------------------------------------
    def tool_names(self) -> tuple[str, ...]:
        return ("openvino", "nncf", "numpy") if self.params.precision == "int8" else ("openvino",)

    def runs_on(self) -> dict[str, Any]:
        """What engine.json will say of the IR that runs it (optbuild.backends.registry)."""
        return self._manifest_head()

    def unavailable(self, host: Fingerprint) -> str | None:
        needs = [openvino_missing()]
        if self.params.precision == "int8":
            needs.append(nncf_missing())
        if self.params.check:
            needs.append(module_missing("onnxruntime", "onnxruntime", "onnx"))
        missing = [n for n in needs if n]
        return "needs " + " and ".join(missing) if missing else None

    # --- execution -------------------------------------------------------------------------
    def run(self, ctx: StepContext) -> None:
        from optbuild.backends.openvino import loader
        from optbuild.model.inputdecl import check_declarations

        p = self.params
        source, label = ctx.onnx_input(f"the {LABEL} engine"), ctx.inputs["input"].step
        if (missing := openvino_missing()) is not None:
            raise StepError(f"the {LABEL} engine needs {missing}")
        ov = loader.import_openvino()
        started = time.perf_counter()
        model = self._convert(ov, source, label)
        check_declarations(loader.input_specs(model), p.inputs, label)
        self._reshape(ov, model, p.inputs, label)
        ctx.metrics["convert_s"] = round(time.perf_counter() - started, 3)
        specs = loader.input_specs(model)
        samples: list[dict[str, Any]] = []
        extra: dict[str, Any] = {}
        if p.precision == "int8":
            model, samples, extra = self._quantize(ctx, model, specs, label)
        model.set_rt_info(p.hint, RT_INFO_HINT)
        model.set_rt_info(p.precision, RT_INFO_PRECISION)
        out = ctx.out_dir / self.primary_output
        try:
            ov.save_model(model, str(out), compress_to_fp16=p.precision == "fp16")
        except Exception as exc:
            raise StepError(f"OpenVINO could not save the IR of {label}: {loader.message(exc)}") from None
        manifest = {
            **self._manifest_head(),
            "openvino_version": str(ov.get_version()),
            "inputs": loader.describe_ports(model.inputs, "input"),
            "outputs": loader.describe_ports(model.outputs, "output"),
            **extra,
        }
        write_manifest(ctx.out_dir, manifest)
        ops = [op.get_type_name() for op in model.get_ops()]
        ctx.metrics.update(precision=p.precision, hint=p.hint, ops=len(ops),
                           fake_quantize=ops.count("FakeQuantize"), bytes_before=source.stat().st_size,
                           bytes_after=out.stat().st_size + out.with_suffix(".bin").stat().st_size)
        ctx.log(f"{LABEL} {loader.short_version(ov)}: {label} -> {p.precision} IR, {len(ops)} ops, "
                f"{ctx.metrics['bytes_after']} bytes (ONNX {ctx.metrics['bytes_before']})")
        del model
        self._check(ctx, source, out, label, samples)

    def _manifest_head(self) -> dict[str, Any]:
        p = self.params
        head: dict[str, Any] = {"backend": "openvino", "precision": p.precision, "hint": p.hint}
        if p.precision in PINNED_PRECISION:  # not the bf16 / fp16 default of CPUs that have them
            head["inference_precision"] = PINNED_PRECISION[p.precision]
        return head

    def _convert(self, ov: Any, source: Path, label: str) -> Any:
        from openvino.frontend import FrontEndManager

        from optbuild.backends.openvino import loader

        try:
            recognized = FrontEndManager().load_by_framework("onnx").supported(str(source))
        except Exception as exc:
            raise StepError(f"{LABEL} cannot open the model of {label}: {loader.message(exc)}") from None
        if not recognized:
            raise StepError(f"{label} gives {source.name}, which {LABEL}'s ONNX reader does not "
                            "recognize as an ONNX model (corrupt or truncated?)")
        try:
            return ov.convert_model(str(source))
        except Exception as exc:
            reason = (loader.conversion_failure(exc) if type(exc).__name__ == "OpConversionFailure"
                      else loader.message(exc))
            raise StepError(f"{LABEL} cannot convert the model of {label}: {reason}") from None

    @staticmethod
    def _reshape(ov: Any, model: Any, decls: InputDecls | None, label: str) -> None:
        """Give the inputs the shapes ``decls`` declare (sizes fixed, ranges bounded)."""
        from optbuild.backends.openvino import loader

        shapes = {name: ov.PartialShape([ov.Dimension(d) if isinstance(d, int) else ov.Dimension(d[0], d[-1])
                                         for d in decl.shape])
                  for name, decl in (decls or {}).items() if decl.shape is not None}
        if not shapes:
            return
        try:
            model.reshape(shapes)
        except Exception as exc:
            listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
            raise StepError(f"{LABEL} cannot give {label} the declared input shapes ({listed}): "
                            f"{loader.message(exc)}") from None

    def _quantize(self, ctx: StepContext, model: Any, specs: list[TensorSpec],
                  label: str) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
        """NNCF post-training INT8 over the calibration samples: (model, samples, manifest entries)."""
        from optbuild.backends.openvino import loader
        from optbuild.model.samples import load_samples

        p = self.params
        if (missing := nncf_missing()) is not None:
            raise StepError(f"precision 'int8' needs {missing}")
        assert p.calibration is not None  # the params' validator sees to it
        ignored, warnings = ignored_ops(model, p.ignored_scope, label) if p.ignored_scope is not None else ([], [])
        for warning in warnings:
            ctx.log(f"warning: {warning}")
        samples = load_samples(p.calibration, ctx.base_dir, specs, args=p.calibration_args, limit=p.samples)
        nncf = loader.import_nncf()
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            AdvancedSmoothQuantParameters,
            OverflowFix,
        )

        preset = p.resolved_preset()
        options: dict[str, Any] = {
            "preset": {"performance": nncf.QuantizationPreset.PERFORMANCE,
                       "mixed": nncf.QuantizationPreset.MIXED}[preset]}
        if p.model_type == "transformer":
            options["model_type"] = nncf.ModelType.TRANSFORMER
        if p.ignored_scope is not None:
            scope = p.ignored_scope
            options["ignored_scope"] = nncf.IgnoredScope(names=list(scope.names), types=list(scope.types),
                                                         patterns=list(scope.patterns), validate=True)
        advanced: dict[str, Any] = {}
        if p.smooth_quant_alpha is not None:
            advanced["smooth_quant_alphas"] = AdvancedSmoothQuantParameters(matmul=p.smooth_quant_alpha)
        if p.overflow_fix is not None:
            advanced["overflow_fix"] = {"enable": OverflowFix.ENABLE, "first_layer": OverflowFix.FIRST_LAYER,
                                        "disable": OverflowFix.DISABLE}[p.overflow_fix]
        if advanced:
            options["advanced_parameters"] = AdvancedQuantizationParameters(**advanced)
        started = time.perf_counter()
        progress = io.StringIO()  # NNCF's progress bars (rich, on stdout): not for the step's log
        try:
            with contextlib.redirect_stdout(progress):
                quantized = nncf.quantize(model, nncf.Dataset(samples.feeds), subset_size=len(samples),
                                          target_device=nncf.TargetDevice.ANY, **options)
        except nncf.ValidationError as exc:  # the ignored scope, checked above: NNCF saw another graph
            raise StepError(f"ignored_scope: NNCF found no op of {label} for some entries: "
                            f"{loader.message(exc)}") from None
        except Exception as exc:
            raise StepError(f"NNCF could not quantize {label} over {len(samples)} samples of "
                            f"{samples.source} ({type(exc).__name__}): {loader.message(exc)}") from None
        seconds = time.perf_counter() - started
        fake = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ops())
        ctx.metrics.update(quantize_s=round(seconds, 3), calibration_samples=len(samples), ignored_ops=len(ignored))
        settings = [f"preset {preset}"]
        if p.model_type:
            settings.append(f"model type {p.model_type}")
        if p.smooth_quant_alpha is not None:
            settings.append(f"SmoothQuant alpha {p.smooth_quant_alpha}")
        if p.overflow_fix is not None:
            settings.append(f"overflow fix {p.overflow_fix}")
        ctx.log(f"NNCF {nncf.__version__}: {fake} FakeQuantize ops from {len(samples)} samples of "
                f"{samples.source} ({', '.join(settings)}) in {seconds:.1f} s")
        if ignored:
            shown = ", ".join(ignored[:6]) + (f" and {len(ignored) - 6} more" if len(ignored) > 6 else "")
            ctx.log(f"ignored_scope keeps {len(ignored)} ops float: {shown}")
        if not fake:
            ctx.log(f"warning: NNCF quantized nothing in {label}: it has no operation NNCF quantizes "
                    "(convolutions, MatMul...)" + (" outside ignored_scope" if ignored else ""))
        extra: dict[str, Any] = {"nncf_version": str(nncf.__version__), "preset": preset,
                                 "calibration_samples": len(samples)}
        for name in ("model_type", "smooth_quant_alpha", "overflow_fix"):
            if getattr(p, name) is not None:
                extra[name] = getattr(p, name)
        if ignored:
            extra["ignored_ops"] = ignored
        return quantized, samples.feeds, extra

    def _check(self, ctx: StepContext, source: Path, out: Path, label: str,
               samples: list[dict[str, Any]]) -> None:
        from optbuild.backends.openvino.runner import OpenVINORunner
        from optbuild.common.errors import first_line
        from optbuild.model.compare import compare_outputs
        from optbuild.model.samples import describe_tried, feeds
        from optbuild.steps.rewrite_check import blame, entered_onnx, infer_outputs, shapes

        p = self.params
        with OpenVINORunner(out, hint=p.hint, inference_precision="f32") as runner, contextlib.ExitStack() as stack:
            ctx.metrics["load_ms"] = round(runner.load_ms, 1)
            if not p.check:
                ctx.metrics["checks"] = 0
                ctx.log("numeric check disabled (check = 0); the IR compiles for the CPU")
                return
            reference = entered_onnx(stack, source, ctx.host, f"the input model of {label}, so the "
                                     f"{LABEL} IR cannot be checked (check = 0 skips it)")
            specs = reference.input_specs()
            names = reference.output_names()
            missing = [n for n in names if n not in runner.output_names()]
            if missing:
                raise StepError(f"the {LABEL} IR of {label} lacks outputs {missing} of its input model "
                                f"(it has {runner.output_names()})")
            tolerance = p.tolerance if p.tolerance is not None else TOLERANCE[p.precision]
            min_cosine = p.min_cosine if p.min_cosine is not None else MIN_COSINE[p.precision]
            count = min(p.check, len(samples)) if p.precision == "int8" else p.check
            what = "calibration samples" if p.precision == "int8" else "seeded inputs"
            worst_abs = worst_rel = 0.0
            seen: dict[str, tuple[list[Any], list[Any]]] = {name: ([], []) for name in names}
            for i in range(count):
                feed = samples[i] if p.precision == "int8" else feeds(specs, p.inputs, i)
                tried = (f"fed calibration sample {i}" if p.precision == "int8"
                         else describe_tried(specs, p.inputs, [i]))
                try:
                    expected = infer_outputs(reference, feed, names)
                except Exception as exc:
                    raise StepError(f"the input model of {label} does not run on the inputs the check made "
                                    f"({shapes(feed)}): {first_line(exc)}. {tried}") from None
                try:
                    got = infer_outputs(runner, feed, names)
                except Exception as exc:
                    raise blame(exc, source, feed, label, f"the {LABEL} IR", tried, ctx.host) from None
                result = compare_outputs(names, expected, got)
                failure = result.failure(tolerance, p.atol) if tolerance is not None else result.problem
                if failure:
                    raise StepError(f"the {p.precision} {LABEL} IR disagrees with {label} (check {i}, "
                                    f"inputs {shapes(feed)}): {failure}")
                for name, ref, cand in zip(names, expected, got):
                    seen[name][0].append(ref)
                    seen[name][1].append(cand)
                worst_abs, worst_rel = max(worst_abs, result.max_abs), max(worst_rel, result.max_rel)
        cosines = {name: cos for name, (refs, cands) in seen.items() if (cos := _float_cosine(refs, cands)) is not None}
        for name, cos in cosines.items():
            if min_cosine is not None and not cos >= min_cosine:
                raise StepError(f"the {p.precision} {LABEL} IR disagrees with {label}: output {name!r} has cosine "
                                f"similarity {cos:.5f} over {count} {what}, below min_cosine {min_cosine}")
        worst_cos = min(cosines.values(), default=1.0)
        ctx.metrics.update(checks=count, max_abs_error=worst_abs, max_rel_error=worst_rel, cosine=worst_cos)
        ctx.log(f"{LABEL} IR vs input on {count} {what}: max abs error {worst_abs:.3g}, relative "
                f"{worst_rel:.3g}, cosine {worst_cos:.6f}")


def ignored_ops(model: Any, scope: IgnoredScope, label: str) -> tuple[list[str], list[str]]:
    """The names of the ops of ``model`` (an openvino.Model) that ``scope`` matches, as NNCF
    matches them (names exactly, types by OpenVINO op type, patterns from the start of the
    name), and warnings (a name that only hits the bias Add of a Gemm). StepError naming
    each entry that matches no op, with close op names or types."""
    ops = [(op.get_friendly_name(), op.get_type_name()) for op in model.get_ops()
           if op.get_type_name() not in ("Parameter", "Result", "Constant")]
    all_names = [name for name, _ in ops]
    all_types = sorted({kind for _, kind in ops})
    kinds = dict(ops)
    matched: dict[str, None] = {}
    unmatched: list[str] = []
    warnings: list[str] = []
    for name in scope.names:
        if name in all_names:
            matched[name] = None
            if kinds[name] == "Add" and (mm := f"{name}/WithoutBiases") in kinds and mm not in scope.names:
                warnings.append(f"ignored_scope name {name!r} is the bias Add of the Gemm {name!r} of {label}, "
                                f"which NNCF does not quantize anyway; its MatMul is {mm!r}")
            continue
        near = [n for n in all_names if n.startswith(name)][:3] or difflib.get_close_matches(name, all_names, 3)
        unmatched.append(f"name {name!r}" + (f" (close: {', '.join(map(repr, near))})" if near else ""))
    for kind in scope.types:
        hits = [name for name, k in ops if k == kind]
        matched.update(dict.fromkeys(hits))
        if not hits:
            near = ([OV_TYPES[kind]] if OV_TYPES.get(kind) in all_types
                    else difflib.get_close_matches(kind, all_types, 3, cutoff=0.5))
            unmatched.append(f"type {kind!r}" + (f" (close: {', '.join(map(repr, near))})" if near else ""))
    for pattern in scope.patterns:
        hits = [name for name in all_names if re.match(pattern, name)]
        matched.update(dict.fromkeys(hits))
        if not hits:
            unmatched.append(f"pattern {pattern!r}")
    if unmatched:
        raise StepError(f"ignored_scope: {'; '.join(unmatched)} match{'es' if len(unmatched) == 1 else ''} no op "
                        f"of {label} as OpenVINO converted it (OpenVINO op names are mostly the ONNX node names, "
                        f"but a Gemm 'g' with a bias becomes the MatMul 'g/WithoutBiases'; its op types here: "
                        f"{', '.join(all_types)})")
    return list(matched), warnings


def _float_cosine(references: list[Any], candidates: list[Any]) -> float | None:
    """Cosine similarity of all the values of one output over the comparisons, concatenated;
    None for non-float or empty outputs (metrics.cosine covers the rest)."""
    import numpy as np

    from optbuild.model.metrics import cosine

    if not references or not all(np.issubdtype(np.asarray(a).dtype, np.floating) for a in references + candidates):
        return None
    a = np.concatenate([np.asarray(r, np.float64).ravel() for r in references])
    b = np.concatenate([np.asarray(c, np.float64).ravel() for c in candidates])
    return cosine(a, b) if a.size else None
