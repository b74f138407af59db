"""kind = "quantize": INT8 (dynamic or static QDQ) or float16 versions of an ONNX model.

``mode = "dynamic"``
    onnxruntime.quantization.quantize_dynamic: weights to int8/uint8 ahead of time,
    activations quantized at run time. No calibration. Nodes inside If/Loop/Scan subgraphs
    are quantized too (onnxruntime's ``EnableSubgraph``, turned on when the model has any).
``mode = "static"``
    onnxruntime.quantization.quantize_static (QDQ format by default) with activation ranges
    from the table of a calibrate step (``calibration = "calibrate"``). The model is not run
    again: the table is handed to onnxruntime as a pre-computed calibration
    (``TensorsData`` via ``calibration_cache_path``), so changing only this step's params
    re-runs this step, never the calibration. Quantize the model that was calibrated: the
    table is matched to the graph by tensor name. onnxruntime does not quantize subgraphs
    in this mode. Nodes that read a float weight holding an infinity (the -inf fill of
    ``masked_fill(mask == 0, -inf)``, an additive mask) and the nodes that read what they make
    (the Softmax) stay float (log, metric ``infinite_fill_nodes``): quantized, the masked scores
    would saturate to a finite value and the Softmax give the masked places weight.
``mode = "fp16"``
    float32 tensors and weights to float16 (onnxconverter-common's float16 converter), with
    ``keep_io_types``: true (the default) keeps every float input and output float32, so the
    model's interface does not change; a list keeps the named ones (Cast nodes convert at the
    border). ``op_block_list`` adds to the converter's default block list. The model's
    value_info is dropped first (onnx shape inference re-derives it): the converter retypes
    only the first of duplicated entries, and a stale float32 entry left beside its float16
    tensor makes the result unloadable.

    The converter retypes tensors, not the nodes that make them: a Cast to float32 (a
    YOLO head's ``/model.22/Cast``, an STFT's inside an If) keeps ``to = FLOAT`` while its
    output is declared float16, and onnxruntime refuses the model, naming one such node per
    load. Such nodes are found in the converted graph all at once, the rest by loading it in
    onnxruntime (CPU): each node named in a type error is kept in float32 (as
    ``node_block_list`` would) and the model converted again, at most
    ``FP16_AUTO_BLOCKS`` (32) times. The log and the metric ``fp16_blocked_nodes`` name them.
    A graph output that nodes also read (a feature map returned and read on) would reach its
    readers as the converter's float32 border Cast: with ``keep_io_types = true`` such an output
    is made by an Identity from the float16 tensor its readers read (metric
    ``fp16_outputs_read_inside``).

Before INT8 quantization, weights held by Constant nodes (paddle2onnx exports) become
initializers in a private copy: onnxruntime quantizes initializers only ("Expected <w> to
be an initializer"). An INT8 result without a single quantized node is an error unless
``allow_unchanged = true``: it would pass every later check while being the float model.

``exclude_until = { min_cosine = 0.99 }`` makes INT8 good enough by itself: the result is
compared with the input model on seeded samples, per output and per part of an output that
joins quantities of different scales (optbuild.model.int8report), and nodes are kept float
and the model quantized again, starting where it departs (the nodes this step's warnings
name, then backwards from the outputs under the floor: optbuild.steps.quantize_search),
until the floor is met, ``max_excluded`` nodes are kept float or ``max_seconds`` are spent
(then the step fails, with the table). A node whose exclusion does not help is passed over,
uncounted. Where a tensor stays quantized with its node float (onnxruntime quantizes what a
quantized node reads), the nodes that read it are kept float with it, together. The nodes
found are a result (log, metrics, quant_report.json), not part of the key.

Options apply to the modes named beside them; an option set for another mode is an error.
Every result passes onnx.checker (full_check) and opens in onnxruntime (CPU); with
``check = true`` (the default) it also runs once, so a model that onnxruntime cannot
execute fails here, named, not in a later step. Accuracy is verify's job.

CPU notes (onnxruntime's own guidance): on x86 without VNNI (e.g. AVX2-only CPUs) uint8
activations times int8 weights can saturate; ``reduce_range = true`` (7-bit weights) avoids
it, and is the default there for int8 weights (the host's VNNI then enters the key);
``weight_type = "uint8"`` avoids it too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.onnxruntime import distribution as ort_distribution
from optbuild.common.errors import StepError
from optbuild.model.onnxgraph import (
    all_nodes,
    constants_to_initializers,
    default_opset,
    sort_topologically,
)
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext
from optbuild.steps.quantize_check import check_result, subgraphs_quantized, unchanged
from optbuild.steps.quantize_fp16 import to_float16
from optbuild.steps.quantize_int8 import (
    infinite_fill_nodes,
    integer_op,
    quantized_op,
    quantizer_hint,
    warn_outlier_weights,
    warn_shared_scales,
    write_ort_cache,
)
from optbuild.steps.quantize_params import QuantizeParams
from optbuild.steps.quantize_search import exclude_until

if TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint
    from optbuild.model.int8report import LayerError

class Quantize(Step[QuantizeParams]):
    """INT8 (dynamic, or static QDQ from a calibration table) or float16 versions of an ONNX model."""

    # 2: Constant weights become initializers, subgraphs quantized in dynamic mode,
    #    reduce_range's default follows the host, fp16 from re-inferred value_info.
    # 3: fp16 keeps float32 inputs and outputs by default, op_block_list adds to the
    #    converter's defaults, nodes the converter types wrong are kept float32.
    # 4: quant_report.json judges tensors that join different scales by parts (its
    #    first_departure can name another tensor); exclude_until.
    version = "4"
    Params = QuantizeParams
    preload = ONNX_TOOLS

    def precision(self) -> str:
        mode = self.params.mode
        return f"{mode} INT8" if mode in ("static", "dynamic") else mode

    def __init__(self, params: QuantizeParams, base_dir: Path, project_root: Path):
        super().__init__(params, base_dir, project_root)
        # 5: exclude_until keeps a departing tensor's quantized readers float, and
        #    quant_report.json judges class scores whole: only a step that searches or reports
        #    makes anything new, so only its entries (and remembered failures) are disowned.
        if params.report or params.exclude_until is not None:
            self.version = "5"
        # 6: static keeps the nodes around an infinite fill float (their results, and failures
        #    remembered, change); fp16 makes an output read inside the graph loadable.
        if params.mode in ("static", "fp16"):
            self.version = "6"
        # 7: exclude_until starts where the model departs and passes over nodes that do not
        #    help: it keeps other nodes float (and fails or succeeds on other models).
        if params.exclude_until is not None:
            self.version = "7"

    def tool_names(self) -> tuple[str, ...]:
        if self.params.mode == "fp16":
            return ("onnx", ort_distribution(), "onnxconverter-common")
        return ("onnx", ort_distribution(), "numpy")

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        """The host enters the key only where it picks reduce_range's default."""
        return {HOST_FIELD: x86_without_vnni(host)} if self._reduce_range_follows_host() else {}

    def _reduce_range_follows_host(self) -> bool:
        p = self.params
        return p.mode != "fp16" and p.reduce_range is None and p.weight_type == "int8"

    def run(self, ctx: StepContext) -> None:
        import onnx

        p = self.params
        label = ctx.inputs["input"].step
        source = ctx.onnx_input("quantize")
        out = ctx.out_dir / "model.onnx"
        before = onnx.load(str(source), load_external_data=False)
        ops_before = [n.op_type for n in all_nodes(before.graph)]
        errors, search = None, None
        if p.mode == "fp16":
            to_float16(ctx, before, out, keep_io_types=p.keep_io_types, op_block_list=p.op_block_list,
                       node_block_list=p.node_block_list, min_positive_val=p.min_positive_val,
                       max_finite_val=p.max_finite_val)
        else:
            quantize, suspects = self._int8(ctx, source, before, out)
            quantize(p.nodes_to_exclude)
            if p.exclude_until is not None:
                check_result(ctx, self.params, source, out, label)  # a model that cannot run is named before the search
                errors, search = exclude_until(ctx, p.exclude_until, p.nodes_to_exclude, source, before, out,
                                               quantize, self._samples(ctx, source), suspects)
        ops = [n.op_type for n in all_nodes(onnx.load(str(out), load_external_data=False).graph)]
        ctx.metrics.update(
            mode=p.mode, nodes_before=len(ops_before), nodes_after=len(ops),
            bytes_before=source.stat().st_size, bytes_after=out.stat().st_size,
            quantize_linear=ops.count("QuantizeLinear") + ops.count("DynamicQuantizeLinear"),
            dequantize_linear=ops.count("DequantizeLinear"),
            integer_ops=sum(map(integer_op, ops)),
        )
        ctx.log(f"{p.mode}: {len(ops_before)} -> {len(ops)} nodes (subgraphs included), "
                f"{source.stat().st_size} -> {out.stat().st_size} bytes")
        quantized = sum(map(quantized_op, ops)) > sum(map(quantized_op, ops_before))
        if p.mode != "fp16" and not quantized and not p.allow_unchanged:
            raise StepError(unchanged(self.params, before, label))
        check_result(ctx, self.params, source, out, label)
        if p.report or search is not None:
            self._report(ctx, source, out, errors, search)

    def _samples(self, ctx: StepContext, source: Path) -> list[dict[str, Any]]:
        """REPORT_SAMPLES seeded feeds of the input model, as ``inputs`` declares them."""
        from optbuild.model.samples import feeds
        from optbuild.steps.rewrite_check import reference_runner

        with reference_runner(source, ctx.host) as runner:
            specs = runner.input_specs()
        return [feeds(specs, self.params.inputs, i) for i in range(REPORT_SAMPLES)]

    def _report(self, ctx: StepContext, source: Path, out: Path, errors: list[LayerError] | None = None,
                search: dict[str, Any] | None = None) -> None:
        """quant_report.json: each shared float tensor's error, in node order, where the INT8
        model first departs from the float one (see the ``report`` parameter), and with
        ``exclude_until`` the search (``search``) and its last ``errors``."""
        import json

        from optbuild.model import int8report

        if errors is None:
            errors = int8report.layer_errors(source, out, self._samples(ctx, source))
        first = int8report.first_departure(errors)
        (ctx.out_dir / REPORT_FILE).write_text(json.dumps({
            "samples": REPORT_SAMPLES, "departs_below_cosine": int8report.DEPARTS,
            "first_departure": first.as_json() if first else None,
            **({"exclude_until": search} if search is not None else {}),
            "tensors": [e.as_json() for e in errors]}, indent=1, allow_nan=False) + "\n")
        ctx.metrics["report_first_departure"] = first.tensor if first else None
        where = (f"first departs at {first.tensor!r} ({first.op} node {first.node!r}, cosine {first.worst:.5f})"
                 if first else f"no tensor under cosine {int8report.DEPARTS}")
        ctx.log(f"{REPORT_FILE}: {len(errors)} tensors compared with the float model on {REPORT_SAMPLES} "
                f"seeded samples; {where}; the worst:\n{int8report.table(errors)}")

    # --- INT8 ------------------------------------------------------------------------------
    def _int8(self, ctx: StepContext, source: Path, model: Any,
              out: Path) -> tuple[Callable[[list[str]], None], list[list[str]]]:
        """Prepare the model once; returns what quantizes it to ``out`` keeping the nodes it
        is given float (exclude_until calls it again with more), and the groups of nodes the
        warnings name (where exclude_until looks first)."""
        import onnx
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

        p = self.params
        label = ctx.inputs["input"].step
        self._check_per_channel_opset(model, label)
        self._check_node_names(model)
        types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
        extra = dict(p.extra_options)
        if p.symmetric_weights is not None:
            extra["WeightSymmetric"] = p.symmetric_weights
        nested = subgraphs_quantized(self.params, model)
        if nested and "EnableSubgraph" not in extra:
            extra["EnableSubgraph"] = True
            ctx.log("the model has If/Loop/Scan subgraphs: quantizing inside them too (EnableSubgraph)")
        common = {"op_types_to_quantize": p.op_types_to_quantize or None, "per_channel": p.per_channel,
                  "reduce_range": self._reduce_range(ctx), "weight_type": types[p.weight_type],
                  "nodes_to_quantize": p.nodes_to_quantize or None}
        table = self._table(ctx, source, model) if p.mode == "static" else None
        suspects = warn_shared_scales(ctx, self.params, model, table[1]) if table is not None else []
        source = ctx.private_copy(source)  # onnxruntime writes beside the model it is given
        moved = constants_to_initializers(model.graph, nested)
        ctx.metrics["constants_to_initializers"] = moved
        if moved:
            ctx.log(f"{moved} Constant node tensors made initializers (onnxruntime quantizes "
                    f"initializer weights only)")
        masking = infinite_fill_nodes(model.graph) if table is not None else []
        if moved or masking:
            source.unlink()  # a hard link to the upstream file: write a new file, never through it
            onnx.save(model, str(source))
        suspects += warn_outlier_weights(ctx, self.params, model, common["reduce_range"])
        if table is None:
            def dynamic(exclude: list[str]) -> None:
                try:
                    quantize_dynamic(str(source), str(out), extra_options=extra, nodes_to_exclude=exclude or None,
                                     **common)
                except Exception as exc:
                    raise StepError(f"quantize_dynamic failed on {label}: {type(exc).__name__}: {exc}"
                                    f"{quantizer_hint(exc, model)}") from exc
                if nested:
                    result = onnx.load(str(out), load_external_data=False)
                    if sort_topologically(result.graph):
                        onnx.save(result, str(out))
            return dynamic, suspects
        import inspect

        if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
            from importlib.metadata import version

            raise StepError(f"static quantization from a calibration table needs an onnxruntime whose "
                            f"quantize_static takes calibration_cache_path (installed: "
                            f"{version(ort_distribution())})")
        extra["ActivationSymmetric"] = p.symmetric_activations
        method, tensors = table
        if masking:
            ctx.log(f"kept float: {', '.join(masking)}, which read or make a tensor filled with infinity "
                    f"(masked_fill(mask == 0, -inf)): quantized, the -inf would saturate to the range's "
                    f"finite end and a Softmax would give the masked places weight")
        ctx.metrics["infinite_fill_nodes"] = masking

        def static(exclude: list[str]) -> None:
            exclude = list(dict.fromkeys([*exclude, *masking]))
            with tempfile.TemporaryDirectory(prefix="optbuild-quant-") as tmp:
                cache = Path(tmp) / "ranges.json"
                write_ort_cache(cache, method, tensors)
                try:
                    quantize_static(
                        str(source), str(out), None,
                        quant_format=QuantFormat.QDQ if p.format == "qdq" else QuantFormat.QOperator,
                        activation_type=types[p.activation_type], calibrate_method=method,
                        calibration_cache_path=str(cache), extra_options=extra,
                        nodes_to_exclude=exclude or None, **common)
                except Exception as exc:
                    raise StepError(f"quantize_static failed on {label} with the table of "
                                    f"{ctx.inputs['calibration'].step}: {type(exc).__name__}: {exc}"
                                    f"{quantizer_hint(exc, model)}") from exc
        return static, suspects

    def _reduce_range(self, ctx: StepContext) -> bool:
        """reduce_range, or its host-dependent default (see the parameter's description)."""
        chosen = self.params.reduce_range
        if chosen is None:
            chosen = self._reduce_range_follows_host() and x86_without_vnni(ctx.host)
            if chosen:
                ctx.log("reduce_range not set: true, as this x86 CPU has no VNNI (uint8 x int8 "
                        "products can saturate there); set it to choose")
        ctx.metrics["reduce_range"] = chosen
        return chosen

    def _check_per_channel_opset(self, model: Any, label: str) -> None:
        """Static per-channel weights get a DequantizeLinear with an axis (opset 13), in QDQ
        and, for MatMul, in QOperator format; onnxruntime writes it at any opset, and the
        model then fails to load with a cryptic message. Dynamic mode needs no axis."""
        p = self.params
        opset = default_opset(model)
        if not (p.per_channel and p.mode == "static") or opset >= 13:
            return
        raise StepError(
            f"per_channel = true in static mode needs opset 13 or later (DequantizeLinear's axis); "
            f"{label} is opset {opset}, where the result would not load (\"Unrecognized attribute: "
            f"axis for operator DequantizeLinear\"). Convert it with an opset step, then calibrate "
            f"and quantize that step's model:\n\n"
            f"[steps.opset13]\nkind = \"opset\"\ninput = \"{p.input}\"\nversion = 13\n\n"
            f"and input = \"opset13\" on this step and its calibrate step")

    def _check_node_names(self, model: Any) -> None:
        """Node names in nodes_to_quantize / nodes_to_exclude must exist (a typo quantizes all)."""
        p = self.params
        if not (p.nodes_to_quantize or p.nodes_to_exclude):
            return
        names = {n.name for n in all_nodes(model.graph)}
        for field in ("nodes_to_quantize", "nodes_to_exclude"):
            unknown = [n for n in getattr(p, field) if n not in names]
            if unknown:
                import difflib

                hints = [h for u in unknown for h in difflib.get_close_matches(u, names, n=1)]
                hint = f"; did you mean {hints[0]!r}?" if hints else ""
                raise StepError(f"{field}: the model has no node named {', '.join(map(repr, unknown))}{hint}")

    def _table(self, ctx: StepContext, source: Path, model: Any) -> tuple[Any, dict[str, list[float]]]:
        """(calibration method, name -> [min, max]) of the calibration table, matched to the
        model (``source``: the upstream file, whose digest the table may record)."""
        from onnxruntime.quantization import CalibrationMethod

        from optbuild.common.digest import hash_file
        from optbuild.steps.calibrate import read_table

        artifact = ctx.inputs["calibration"]
        if artifact.primary is None:
            raise StepError(f"{artifact.step} has no calibration table")
        table = read_table(artifact.primary, artifact.step)
        names = {i.name for i in model.graph.input} | {o for n in all_nodes(model.graph) for o in n.output}
        tensors = table["tensors"]
        known = [t for t in tensors if t in names]
        if not known:
            raise StepError(f"the calibration table of {artifact.step} names no tensor of "
                            f"{ctx.inputs['input'].step}: it was made for another model (calibrate the "
                            f"model you quantize)")
        if table.get("model", {}).get("digest") not in (None, hash_file(source)[0]):
            ctx.log(f"warning: {artifact.step} calibrated another file than {ctx.inputs['input'].step}; "
                    f"{len(known)} of {len(tensors)} tensor names match")
        ctx.metrics.update(calibration_method=table["method"], calibrated_tensors=len(known))
        method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                  "percentile": CalibrationMethod.Percentile}[table["method"]]
        return method, {t: tensors[t] for t in known}



REPORT_FILE = "quant_report.json"
REPORT_SAMPLES = 4  # seeded samples the report (and exclude_until) runs both models on


# --- the host's CPU and reduce_range ---------------------------------------------------------
HOST_FIELD = "cpu.x86_without_vnni"  # the key's host entry where reduce_range follows the host
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_VNNI = ("avx512_vnni", "avx_vnni")


def x86_without_vnni(host: Fingerprint) -> bool:
    """onnxruntime's x86 u8s8 kernels without VNNI (VPMADDUBSW) saturate 16-bit sums."""
    flags = set(str(host.get("cpu.flags") or "").split(","))
    return str(host.get("cpu.arch") or "").lower() in _X86 and not flags.intersection(_VNNI)
