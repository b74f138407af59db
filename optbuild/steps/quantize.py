"""kind = "quantize": INT8 (dynamic or static QDQ) or float16 versions of an ONNX model.

``mode = "dynamic"``
    onnxruntime.quantization.quantize_dynamic: weights to int8/uint8 ahead of time,
    activations quantized at run time. No calibration.
``mode = "static"``
    onnxruntime.quantization.quantize_static (QDQ format by default) with activation ranges
    from the table of a calibrate step (``calibration = "calibrate"``). The model is not run
    again: the table is handed to onnxruntime as a pre-computed calibration
    (``TensorsData`` via ``calibration_cache_path``), so changing only this step's params
    re-runs this step, never the calibration. Quantize the model that was calibrated: the
    table is matched to the graph by tensor name.
``mode = "fp16"``
    float32 tensors and weights to float16 (onnxconverter-common's float16 converter), with
    ``keep_io_types``: true keeps every float input and output float32, a list keeps the
    named ones (Cast nodes convert at the border).

Options apply to the modes named beside them; an option set for another mode is an error.
The result is loaded and run once on onnxruntime (CPU) before it is kept, so a model that
onnxruntime cannot execute fails here, named, not in a later step. Accuracy is verify's job.

CPU notes (onnxruntime's own guidance): on x86 without VNNI (e.g. AVX2-only CPUs) uint8
activations times int8 weights can saturate; ``reduce_range = true`` (7-bit weights) avoids
it. Dynamic int8 weights suffer the same way there; ``weight_type = "uint8"`` or
``reduce_range = true`` fixes it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from optbuild.errors import StepError
from optbuild.steps.base import Step, StepContext, StepParams, StepRef
from optbuild.steps.calibdata import non_default, ort_distribution
from optbuild.steps.inputdecl import InputDecls, inputs_field

_STATIC_ONLY = ("calibration", "format", "activation_type", "symmetric_activations")
_INT8_ONLY = ("weight_type", "per_channel", "reduce_range", "symmetric_weights", "op_types_to_quantize",
              "nodes_to_quantize", "nodes_to_exclude", "extra_options")
_FP16_ONLY = ("keep_io_types", "op_block_list", "node_block_list", "min_positive_val", "max_finite_val")

# onnxruntime.quantization extra_options that may pass through (see quantize_static's docstring).
# The symmetric options have their own params; calibration options belong to calibrate.
EXTRA_OPTIONS = {
    "extra.Sigmoid.nnapi": bool, "EnableSubgraph": bool, "ForceQuantizeNoInputCheck": bool,
    "MatMulConstBOnly": bool, "AddQDQPairToWeight": bool, "OpTypesToExcludeOutputQuantization": list,
    "DedicatedQDQPair": bool, "QDQOpTypePerChannelSupportToAxis": dict, "UseQDQContribOps": bool,
    "MinimumRealRange": float, "QDQKeepRemovableActivations": bool,
    "QDQDisableWeightAdjustForInt32Bias": bool, "ActivationRestrictedAsymmetric": bool,
    "QuantizeBias": bool,  # false: float biases, as TensorRT wants
}
_OWN_PARAM = {"ActivationSymmetric": "symmetric_activations", "WeightSymmetric": "symmetric_weights"}


class QuantizeParams(StepParams):
    input: StepRef = Field(
        description="The step whose ONNX model is quantized. For mode 'static', the model that "
                    "the calibration step calibrated (ranges are matched by tensor name).",
        examples=["simplify"])
    mode: Literal["dynamic", "static", "fp16"] = Field(
        description="'dynamic': int8/uint8 weights, activations quantized at run time, no "
                    "calibration. 'static': QDQ (or QOperator) INT8 with activation ranges from "
                    "a calibrate step. 'fp16': float32 tensors and weights to float16. Options of "
                    "another mode are rejected.",
        examples=["static"])
    # --- static ---
    calibration: StepRef | None = Field(
        None,
        description="static only, required there: the calibrate step whose calibration.json gives "
                    "the activation ranges (the model is not run again).",
        examples=["calibrate"])
    format: Literal["qdq", "qoperator"] = Field(
        "qdq",
        description="static only: 'qdq' (QuantizeLinear/DequantizeLinear pairs around float ops: "
                    "what TensorRT takes) or 'qoperator' (`QLinear*` integer operators).",
        examples=["qoperator"])
    activation_type: Literal["uint8", "int8"] = Field(
        "uint8",
        description="static only: the integer type of quantized activations. 'uint8' suits "
                    "onnxruntime's CPU kernels; TensorRT wants 'int8' with symmetric_activations "
                    "= true (zero point 0).",
        examples=["int8"])
    symmetric_activations: bool = Field(
        False,
        description="static only: activation ranges symmetric around 0 (with int8, zero point "
                    "0). false: asymmetric, from the table's [min, max].",
        examples=[True])
    # --- dynamic and static ---
    weight_type: Literal["int8", "uint8"] = Field(
        "int8",
        description="dynamic and static: the integer type of quantized weights. On x86 CPUs "
                    "without VNNI, dynamic int8 weights can saturate: use 'uint8' or reduce_range.",
        examples=["uint8"])
    per_channel: bool = Field(
        False,
        description="dynamic and static: one scale per output channel of each weight instead of "
                    "one per tensor (usually more accurate for convolutions).",
        examples=[True])
    reduce_range: bool = Field(
        False,
        description="dynamic and static: 7-bit weights, so that uint8 x int8 products cannot "
                    "saturate on x86 CPUs without VNNI (AVX2-only); costs a little accuracy.",
        examples=[True])
    symmetric_weights: bool | None = Field(
        None,
        description="dynamic and static: weight ranges symmetric around 0. Not set: onnxruntime's "
                    "default (symmetric for int8 weights, asymmetric for uint8).",
        examples=[True])
    op_types_to_quantize: list[str] = Field(
        [],
        description="dynamic and static: quantize only nodes of these ONNX op types. Empty: every "
                    "op type onnxruntime can quantize.",
        examples=[["MatMul", "Gemm"]])
    nodes_to_quantize: list[str] = Field(
        [],
        description="dynamic and static: quantize only the nodes of these names (ONNX node names, "
                    "as a viewer such as Netron shows them; checked against the model). Empty: "
                    "every node of the chosen op types.",
        examples=[["/layer1/conv/Conv"]])
    nodes_to_exclude: list[str] = Field(
        [],
        description="dynamic and static: node names kept in float (checked against the model, "
                    "with a 'did you mean'), e.g. a small classifier head where errors show most.",
        examples=[["/head/Gemm"]])
    extra_options: dict[str, Any] = Field(
        {},
        description="dynamic and static: more onnxruntime.quantization extra_options, name -> "
                    "value. Known names only, with their value type checked: "
                    + ", ".join(sorted(EXTRA_OPTIONS)) + ". The symmetric options have their own "
                    "parameters; calibration options belong to the calibrate step.",
        examples=[{"QuantizeBias": False}])
    # --- fp16 ---
    keep_io_types: bool | list[str] = Field(
        False,
        description="fp16 only: true keeps every float graph input and output float32; a list "
                    "keeps the named ones (Cast nodes convert at the border); false converts them "
                    "to float16 too.",
        examples=[True, ["logits"]])
    op_block_list: list[str] | None = Field(
        None,
        description="fp16 only: ONNX op types kept in float32. Not set: onnxconverter-common's "
                    "default block list; [] blocks nothing.",
        examples=[["Softmax", "LayerNormalization"]])
    node_block_list: list[str] = Field(
        [],
        description="fp16 only: node names kept in float32.",
        examples=[["/head/Gemm"]])
    min_positive_val: float = Field(
        1e-7, gt=0,
        description="fp16 only: weight values of smaller magnitude (but not 0) are raised to this, "
                    "so they do not underflow to 0 in float16.",
        examples=[1e-6])
    max_finite_val: float = Field(
        1e4, gt=0,
        description="fp16 only: weight values of larger magnitude are clamped to this (float16's "
                    "largest finite value is 65504).",
        examples=[65504.0])
    # --- all ---
    check: bool = Field(
        True,
        description="Load the result and run it once on onnxruntime (CPU) with seeded random "
                    "inputs, so a model onnxruntime cannot execute fails here. Accuracy is checked "
                    "by a verify step, not here.",
        examples=[False])
    inputs: InputDecls | None = inputs_field()

    @field_validator("extra_options")
    @classmethod
    def _known_extra_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, item in value.items():
            if name in _OWN_PARAM:
                raise ValueError(f"use the parameter {_OWN_PARAM[name]!r} instead of extra option {name!r}")
            if name.startswith(("Calib", "SmoothQuant")):
                raise ValueError(f"extra option {name!r} is a calibration setting: set it on the "
                                 "calibrate step (quantize does not run the model)")
            kind = EXTRA_OPTIONS.get(name)
            if kind is None:
                raise ValueError(f"unknown extra option {name!r} (known: {', '.join(sorted(EXTRA_OPTIONS))})")
            ok = isinstance(item, (int, float)) and not isinstance(item, bool) if kind is float else isinstance(item, kind)
            if not ok:
                raise ValueError(f"extra option {name!r} must be a {kind.__name__}, got {item!r}")
        return value

    @field_validator("keep_io_types")
    @classmethod
    def _names(cls, value: bool | list[str]) -> bool | list[str]:
        if isinstance(value, list):
            if not value:
                raise ValueError("an empty list keeps nothing: write keep_io_types = false")
            return sorted(set(value))
        return value

    @model_validator(mode="after")
    def _mode_options(self) -> QuantizeParams:
        allowed = {"static": _STATIC_ONLY + _INT8_ONLY, "dynamic": _INT8_ONLY, "fp16": _FP16_ONLY}[self.mode]
        foreign = [n for n in non_default(self, (*_STATIC_ONLY, *_INT8_ONLY, *_FP16_ONLY)) if n not in allowed]
        if foreign:
            raise ValueError(f"{', '.join(map(repr, foreign))} do not apply to mode {self.mode!r}")
        if self.mode == "static" and self.calibration is None:
            raise ValueError("mode 'static' needs calibration = '<calibrate step>' (its activation ranges)")
        if self.nodes_to_quantize and set(self.nodes_to_quantize) & set(self.nodes_to_exclude):
            raise ValueError(f"nodes both quantized and excluded: "
                             f"{sorted(set(self.nodes_to_quantize) & set(self.nodes_to_exclude))}")
        return self


class Quantize(Step):
    """INT8 (dynamic, or static QDQ from a calibration table) or float16 versions of an ONNX model."""

    kind = "quantize"
    Params = QuantizeParams

    def tool_names(self) -> tuple[str, ...]:
        if self.params.mode == "fp16":
            return ("onnx", ort_distribution(), "onnxconverter-common")
        return ("onnx", ort_distribution(), "numpy")

    def run(self, ctx: StepContext) -> None:
        import onnx

        source = ctx.inputs["input"].primary
        if source is None or source.suffix != ".onnx":
            raise StepError(f"quantize needs an ONNX model; {ctx.inputs['input'].step} gives "
                            f"{source.name if source else 'no file'}")
        out = ctx.out_dir / "model.onnx"
        before = onnx.load(str(source), load_external_data=False)
        if self.params.mode == "fp16":
            self._fp16(ctx, before, out)
        else:
            self._int8(ctx, source, out)
        after = onnx.load(str(out), load_external_data=False)
        ops = [n.op_type for n in after.graph.node]
        ctx.metrics.update(
            mode=self.params.mode, nodes_before=len(before.graph.node), nodes_after=len(ops),
            bytes_before=source.stat().st_size, bytes_after=out.stat().st_size,
            quantize_linear=ops.count("QuantizeLinear") + ops.count("DynamicQuantizeLinear"),
            dequantize_linear=ops.count("DequantizeLinear"),
            integer_ops=sum(o.endswith("Integer") or o.startswith("QLinear") for o in ops),
        )
        ctx.log(f"{self.params.mode}: {len(before.graph.node)} -> {len(ops)} nodes, "
                f"{source.stat().st_size} -> {out.stat().st_size} bytes")
        if self.params.check:
            self._check(source, out, ctx.inputs["input"].step)

    # --- INT8 ------------------------------------------------------------------------------
    def _int8(self, ctx: StepContext, source: Path, out: Path) -> None:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

        p = self.params
        types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
        extra = dict(p.extra_options)
        if p.symmetric_weights is not None:
            extra["WeightSymmetric"] = p.symmetric_weights
        common = {"op_types_to_quantize": p.op_types_to_quantize or None, "per_channel": p.per_channel,
                      "reduce_range": p.reduce_range, "weight_type": types[p.weight_type],
                      "nodes_to_quantize": p.nodes_to_quantize or None,
                      "nodes_to_exclude": p.nodes_to_exclude or None}
        self._check_node_names(source)
        source = ctx.private_copy(source)  # onnxruntime writes beside the model it is given
        if p.mode == "dynamic":
            try:
                quantize_dynamic(str(source), str(out), extra_options=extra, **common)
            except Exception as exc:
                raise StepError(f"quantize_dynamic failed on {ctx.inputs['input'].step}: "
                                f"{type(exc).__name__}: {exc}") from exc
            return
        import inspect

        if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
            from importlib.metadata import version

            raise StepError(f"static quantization from a calibration table needs an onnxruntime whose "
                            f"quantize_static takes calibration_cache_path (installed: "
                            f"{version(ort_distribution())})")
        extra["ActivationSymmetric"] = p.symmetric_activations
        calib_step = ctx.inputs["calibration"].step
        method, tensors = self._table(ctx, source)
        with tempfile.TemporaryDirectory(prefix="optbuild-quant-") as tmp:
            cache = Path(tmp) / "ranges.json"
            _write_ort_cache(cache, method, tensors)
            try:
                quantize_static(
                    str(source), str(out), None,
                    quant_format=QuantFormat.QDQ if p.format == "qdq" else QuantFormat.QOperator,
                    activation_type=types[p.activation_type], calibrate_method=method,
                    calibration_cache_path=str(cache), extra_options=extra, **common)
            except Exception as exc:
                raise StepError(f"quantize_static failed on {ctx.inputs['input'].step} with the table of "
                                f"{calib_step}: {type(exc).__name__}: {exc}") from exc

    def _check_node_names(self, source: Path) -> None:
        """Node names in nodes_to_quantize / nodes_to_exclude must exist (a typo quantizes all)."""
        p = self.params
        if not (p.nodes_to_quantize or p.nodes_to_exclude):
            return
        import onnx

        names = {n.name for n in onnx.load(str(source), load_external_data=False).graph.node}
        for field in ("nodes_to_quantize", "nodes_to_exclude"):
            unknown = [n for n in getattr(p, field) if n not in names]
            if unknown:
                import difflib

                hints = [h for u in unknown for h in difflib.get_close_matches(u, names, n=1)]
                hint = f"; did you mean {hints[0]!r}?" if hints else ""
                raise StepError(f"{field}: the model has no node named {', '.join(map(repr, unknown))}{hint}")

    def _table(self, ctx: StepContext, source: Path) -> tuple[Any, dict[str, list[float]]]:
        """(calibration method, name -> [min, max]) of the calibration table, matched to the model."""
        import onnx
        from onnxruntime.quantization import CalibrationMethod

        from optbuild.digest import hash_file
        from optbuild.steps.calibrate import read_table

        artifact = ctx.inputs["calibration"]
        if artifact.primary is None:
            raise StepError(f"{artifact.step} has no calibration table")
        table = read_table(artifact.primary, artifact.step)
        model = onnx.load(str(source), load_external_data=False)
        names = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
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

    # --- float16 -----------------------------------------------------------------------------
    def _fp16(self, ctx: StepContext, model: Any, out: Path) -> None:
        import onnx

        try:
            from onnxconverter_common import float16
        except ImportError:
            raise StepError("mode 'fp16' needs onnxconverter-common (pip install onnxconverter-common)") from None
        p = self.params
        keep = p.keep_io_types
        if isinstance(keep, list):
            floats = {v.name for v in (*model.graph.input, *model.graph.output)
                      if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
            io_names = [v.name for v in (*model.graph.input, *model.graph.output)]
            unknown = [n for n in keep if n not in io_names]
            if unknown:
                raise StepError(f"keep_io_types: the model has no input or output {unknown} "
                                f"(it has {io_names})")
            if not_float := [n for n in keep if n not in floats]:
                raise StepError(f"keep_io_types: {not_float} are not float32 tensors")
        kwargs = {"min_positive_val": p.min_positive_val, "max_finite_val": p.max_finite_val,
                      "keep_io_types": keep is True, "node_block_list": p.node_block_list or None}
        if p.op_block_list is not None:
            kwargs["op_block_list"] = p.op_block_list
        try:
            converted = float16.convert_float_to_float16(model, **kwargs)
        except Exception as exc:
            raise StepError(f"float16 conversion of {ctx.inputs['input'].step} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        if isinstance(keep, list):
            _keep_float32(converted, keep)
        try:
            onnx.checker.check_model(converted)
        except onnx.checker.ValidationError as exc:
            raise StepError(f"the float16 model fails onnx.checker: {exc}") from None
        onnx.save(converted, str(out))

    # --- the result runs ---------------------------------------------------------------------
    def _check(self, source: Path, out: Path, label: str) -> None:
        """The result loads and runs once on onnxruntime (CPU), on check 0's feeds."""
        from optbuild.steps import calibdata
        from optbuild.steps.inputdecl import check_declarations, describe_tried, feeds
        from optbuild.steps.rewrite_check import blame

        what = f"the {self.params.mode} model"
        try:
            sess = calibdata.session(out)
        except Exception as exc:
            raise StepError(f"{what} does not load in onnxruntime (CPU): {type(exc).__name__}: {exc}") from None
        specs = calibdata.input_specs(sess)
        check_declarations(specs, self.params.inputs, label)
        feed = feeds(specs, self.params.inputs, 0)
        try:
            sess.run(None, feed)
        except Exception as exc:
            error = str(blame(exc, source, feed, label, what, describe_tried(specs, self.params.inputs, [0])))
            if "ConvInteger" in str(exc) or "NOT_IMPLEMENTED" in str(exc):
                error += ("\nhint: onnxruntime's CPU kernels lack this quantized op for these types; try "
                          "weight_type = \"uint8\", or leave the op out (op_types_to_quantize / nodes_to_exclude)")
            raise StepError(error) from None


def _write_ort_cache(path: Path, method: Any, tensors: dict[str, list[float]]) -> None:
    """The table as onnxruntime's calibration cache (TensorsData as JSON)."""
    import numpy as np
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    data = {name: TensorData(lowest=np.array(lo, dtype=np.float32), highest=np.array(hi, dtype=np.float32))
            for name, (lo, hi) in tensors.items()}
    save_tensors_data(TensorsData(method, data), path)


def _keep_float32(model: Any, names: list[str]) -> None:
    """Turn the named float16 graph inputs/outputs back to float32 with Cast nodes at the border."""
    from onnx import TensorProto, helper

    graph = model.graph
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name: v for v in graph.output}
    new_nodes = []
    for name in names:
        if name in inputs and inputs[name].type.tensor_type.elem_type == TensorProto.FLOAT16:
            inner = f"{name}/float16"
            _rename_uses(graph, name, inner)
            inputs[name].type.tensor_type.elem_type = TensorProto.FLOAT
            new_nodes.append(helper.make_node("Cast", [name], [inner], name=f"{name}/to_float16",
                                              to=TensorProto.FLOAT16))
    if new_nodes:
        nodes = [*new_nodes, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    for name in names:
        if name in outputs and outputs[name].type.tensor_type.elem_type == TensorProto.FLOAT16:
            inner = f"{name}/float16"
            for node in graph.node:
                node.output[:] = [inner if o == name else o for o in node.output]
            _rename_uses(graph, name, inner)
            for info in graph.value_info:
                if info.name == name:
                    info.name = inner
            outputs[name].type.tensor_type.elem_type = TensorProto.FLOAT
            graph.node.append(helper.make_node("Cast", [inner], [name], name=f"{name}/to_float32",
                                               to=TensorProto.FLOAT))


def _rename_uses(graph: Any, old: str, new: str) -> None:
    """Every node input named ``old`` (also inside subgraphs) reads ``new`` instead."""
    from onnx import AttributeProto

    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                _rename_uses(attr.g, old, new)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _rename_uses(sub, old, new)
