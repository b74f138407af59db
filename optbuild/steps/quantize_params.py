"""The quantize step's parameters: one model of the three modes' options, each option
refused in a mode it does not apply to, onnxruntime's extra options checked by name and type."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from optbuild.common.recipetable import StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs, inputs_field
from optbuild.model.samples import non_default
from optbuild.steps.base import StepParams
from optbuild.steps.fields import input_field
from optbuild.steps.quantize_search import ExcludeUntil

_STATIC_ONLY = ("calibration", "format", "activation_type", "symmetric_activations")
_INT8_ONLY = ("weight_type", "per_channel", "reduce_range", "symmetric_weights", "op_types_to_quantize",
              "nodes_to_quantize", "nodes_to_exclude", "extra_options", "allow_unchanged", "report",
              "exclude_until")
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
    input: StepRef = input_field("quantized. For mode 'static', the model that the calibration step "
                                 "calibrated (ranges are matched by tensor name).")
    mode: Literal["dynamic", "static", "fp16"] = Field(examples=["static"])
    """'dynamic': int8/uint8 weights, activations quantized at run time, no calibration.
    'static': QDQ (or QOperator) INT8 with activation ranges from a calibrate step. 'fp16':
    float32 tensors and weights to float16. Options of another mode are rejected."""
    # --- static ---
    calibration: StepRef | None = Field(None, examples=["calibrate"])
    """static only, required there: the calibrate step whose calibration.json gives the
    activation ranges (the model is not run again)."""
    format: Literal["qdq", "qoperator"] = Field("qdq", examples=["qoperator"])
    """static only: 'qdq' (QuantizeLinear/DequantizeLinear pairs around float ops: what TensorRT
    takes) or 'qoperator' (`QLinear*` integer operators)."""
    activation_type: Literal["uint8", "int8"] = Field("uint8", examples=["int8"])
    """static only: the integer type of quantized activations. 'uint8' suits onnxruntime's CPU
    kernels; TensorRT wants 'int8' with symmetric_activations = true (zero point 0)."""
    symmetric_activations: bool = Field(False, examples=[True])
    """static only: activation ranges symmetric around 0 (with int8, zero point 0). false:
    asymmetric, from the table's [min, max]."""
    # --- dynamic and static ---
    weight_type: Literal["int8", "uint8"] = Field("int8", examples=["uint8"])
    """dynamic and static: the integer type of quantized weights. On x86 CPUs without VNNI, int8
    weights can saturate: reduce_range (its default there) or 'uint8' avoids it."""
    per_channel: bool = Field(False, examples=[True])
    """dynamic and static: one scale per output channel of each weight instead of one per tensor
    (usually more accurate for convolutions)."""
    reduce_range: bool | None = Field(None, examples=[True])
    """dynamic and static: 7-bit weights, so that uint8 x int8 products cannot saturate on x86
    CPUs without VNNI (AVX2-only); costs a little accuracy. Not set: true with int8 weights on
    an x86 CPU without VNNI (avx512_vnni or avx_vnni), else false; that host fact then enters
    the key (a VNNI and a non-VNNI host build different models). Set it to get the same model on
    every host."""
    symmetric_weights: bool | None = Field(None, examples=[True])
    """dynamic and static: weight ranges symmetric around 0. Not set: onnxruntime's default
    (symmetric for int8 weights, asymmetric for uint8)."""
    op_types_to_quantize: list[str] = Field([], examples=[["MatMul", "Gemm"]])
    """dynamic and static: quantize only nodes of these ONNX op types. Empty: every op type
    onnxruntime can quantize."""
    nodes_to_quantize: list[str] = Field([], examples=[["/layer1/conv/Conv"]])
    """dynamic and static: quantize only the nodes of these names (ONNX node names, as a viewer
    such as Netron shows them; checked against the model). Empty: every node of the chosen op
    types."""
    nodes_to_exclude: list[str] = Field([], examples=[["/head/Gemm"]])
    """dynamic and static: node names kept in float (checked against the model, with a 'did you
    mean'), e.g. a small classifier head where errors show most."""
    extra_options: dict[str, Any] = Field(
        {},
        description="dynamic and static: more onnxruntime.quantization extra_options, name -> "
                    "value. Known names only, with their value type checked: "
                    + ", ".join(sorted(EXTRA_OPTIONS)) + ". The symmetric options have their own "
                    "parameters; calibration options belong to the calibrate step.",
        examples=[{"QuantizeBias": False}])
    allow_unchanged: bool = Field(False, examples=[True])
    """dynamic and static: accept a result in which onnxruntime quantized no node (no
    QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, *Integer or QLinear* node,
    subgraphs included). false: that is an error saying why it likely happened (ops inside
    If/Loop subgraphs in static mode, op_types_to_quantize or excluded nodes leaving
    nothing)."""
    report: bool = Field(False, examples=[True])
    """dynamic and static: also write quant_report.json, the error of every float tensor the
    INT8 model shares with the input model (cosine, relative error, and for a tensor that joins
    quantities of different scales, its worst part's cosine, class scores being judged whole as
    verify judges them; node order, and the first tensor under cosine 0.99: where it departs),
    run on REPORT_SAMPLES (4) seeded samples as
    `inputs` declares them, with the 10 worst in the log. Off by default: it runs both models
    with every tensor kept, which costs time and memory on large models."""
    exclude_until: ExcludeUntil | None = Field(None, examples=[{"min_cosine": 0.99}])
    """dynamic and static: after quantizing, compare the INT8 model's outputs with the input
    model's and, while the worst (an output, or a part of one of different scale, such as a
    detector's scores beside its boxes) is under min_cosine, keep nodes float and quantize
    again, starting where the model departs: the nodes this step's warnings name (a Concat
    joining ranges far apart, a weight with outliers) on the way to that output, then, from
    the output backwards, the nodes that make its tensors under min_cosine (per the per-layer
    report, see `report`). Where a tensor is still quantized with its node float (a quantized
    node quantizes what it reads: a ViT's class token stayed lost so), the nodes that read it
    are kept float with it, together. A node (or group) that does not bring the worst output
    closer to min_cosine is passed over (the model goes back to before it) and not counted.
    The search stops at max_excluded nodes kept float (default 8) or after max_seconds
    (default 300) and then fails with the table, the nodes kept and passed over, and, where
    most tensors depart (an error built up over the whole network, as in a mobile net), what
    works instead: per_channel, more calibration data, fewer op types, dynamic or fp16. The
    nodes it excluded are a result, not a parameter: the log, the metric `auto_excluded` and
    quant_report.json (always written with this option) name them, with the cosine before
    and after; copy them into nodes_to_exclude to skip the search. Not set: no search."""
    # --- fp16 ---
    keep_io_types: bool | list[str] = Field(True, examples=[False, ["logits"]])
    """fp16 only: true keeps every float graph input and output float32, so callers feed and
    read the same types as before; a list keeps the named ones (Cast nodes convert at the
    border); false converts them to float16 too (the model's interface changes)."""
    op_block_list: list[str] = Field([], examples=[["Softmax", "LayerNormalization"]])
    """fp16 only: more ONNX op types kept in float32, added to onnxconverter-common's default
    block list (which always applies: Resize, Upsample, TopK, NonMaxSuppression, RoiAlign,
    Range, CumSum, Min, Max, RandomUniformLike and the ai.onnx.ml ops)."""
    node_block_list: list[str] = Field([], examples=[["/head/Gemm"]])
    """fp16 only: node names kept in float32. Nodes the converter leaves typed wrong (a Cast
    to float32 whose output it made float16) are added by the step itself, and logged."""
    min_positive_val: float = Field(1e-7, gt=0, examples=[1e-6])
    """fp16 only: weight values of smaller magnitude (but not 0) are raised to this, so they do
    not underflow to 0 in float16."""
    max_finite_val: float = Field(1e4, gt=0, examples=[65504.0])
    """fp16 only: weight values of larger magnitude are clamped to this (float16's largest
    finite value is 65504)."""
    # --- all ---
    check: bool = Field(True, examples=[False])
    """Run the result once on onnxruntime (CPU) with seeded random inputs, so a model
    onnxruntime cannot execute fails here. Either way the result must pass onnx.checker
    (full_check) and open in onnxruntime. Accuracy is checked by a verify step, not here."""
    inputs: StepInputs = inputs_field()

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

    def inputs_read(self) -> InputDecls | None:
        """Only the run check and the report's samples feed declarations: none without them."""
        return self.inputs if self.check or self.report or self.exclude_until is not None else None

    @model_validator(mode="after")
    def _mode_options(self) -> QuantizeParams:
        allowed = {"static": _STATIC_ONLY + _INT8_ONLY, "dynamic": _INT8_ONLY, "fp16": _FP16_ONLY}[self.mode]
        foreign = [n for n in non_default(self, (*_STATIC_ONLY, *_INT8_ONLY, *_FP16_ONLY)) if n not in allowed]
        if foreign:
            raise ValueError(f"{', '.join(map(repr, foreign))} {'does' if len(foreign) == 1 else 'do'} not apply "
                             f"to mode {self.mode!r}")
        if self.mode == "static" and self.calibration is None:
            raise ValueError("mode 'static' needs calibration = '<calibrate step>' (its activation ranges)")
        if self.nodes_to_quantize and set(self.nodes_to_quantize) & set(self.nodes_to_exclude):
            raise ValueError(f"nodes both quantized and excluded: "
                             f"{sorted(set(self.nodes_to_quantize) & set(self.nodes_to_exclude))}")
        return self
