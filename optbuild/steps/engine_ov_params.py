"""The OpenVINO engine step's parameters: precision and its check's default thresholds,
NNCF's INT8 settings (calibration data, preset, model type, the scope it leaves float),
each refused where the precision does not use it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from optbuild.common.recipetable import RecipeTable, StepRef
from optbuild.model.inputdecl import StepInputs
from optbuild.model.samples import DataArg, is_callable_source, non_default
from optbuild.steps import fields
from optbuild.steps.base import StepParams
from optbuild.steps.rewrite_check import Atol, atol_field

# Default thresholds of the check, by precision (None: not checked).
TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "int8": None}
MIN_COSINE = {"fp32": None, "fp16": None, "int8": 0.99}
_INT8_ONLY = ("calibration", "calibration_args", "samples", "preset", "model_type", "ignored_scope",
              "smooth_quant_alpha", "overflow_fix")
# OpenVINO's op types for ONNX ones that differ, for ignored_scope's messages.
OV_TYPES = {"Gemm": "MatMul", "LayerNormalization": "MVN", "Conv": "Convolution",
            "ConvTranspose": "ConvolutionBackpropData", "Mul": "Multiply", "Sub": "Subtract", "Div": "Divide",
            "Pow": "Power", "Attention": "ScaledDotProductAttention", "BatchNormalization": "BatchNormInference"}


class IgnoredScope(RecipeTable):
    """Ops NNCF leaves float (nncf.IgnoredScope); every entry must match an op."""

    names: list[str] = Field([], examples=[["/head/Gemm/WithoutBiases"]])
    """OpenVINO op names, exactly. Converted from ONNX, an op mostly keeps the ONNX node's
    name, but a Gemm 'g' with a bias becomes the MatMul 'g/WithoutBiases' and an Add 'g', an
    op that gives a model output takes the output's name, and decomposed ops get new names
    ('MVN_10')."""
    types: list[str] = Field([], examples=[["ScaledDotProductAttention"]])
    """OpenVINO op types (not ONNX's): 'MatMul', 'Convolution', 'MVN' (layer normalization),
    'Softmax', 'ScaledDotProductAttention'..."""
    patterns: list[str] = Field([], examples=[["/head/", ".*/attn/out/"]])
    """Regular expressions (Python's), matched from the start of the op names."""

    @field_validator("patterns")
    @classmethod
    def _regular_expressions(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _not_empty(self) -> IgnoredScope:
        if not (self.names or self.types or self.patterns):
            raise ValueError("ignored_scope names no op: give names, types or patterns")
        return self


class OpenVINOEngineParams(StepParams):
    backend: Literal["openvino"] = Field(examples=["openvino"])
    """Selects this engine: an OpenVINO IR (model.xml + model.bin) for OpenVINO's CPU plugin."""
    input: StepRef = fields.input_field("converted (e.g. a simplify step; for int8 give the float model: "
                                        "NNCF quantizes it).")
    precision: Literal["fp32", "fp16", "int8"] = Field("fp32", examples=["int8"])
    """'fp32': the converted model as it is; 'fp16': weights stored as float16 (half the file;
    computed at the CPU's default inference precision); 'int8': NNCF post-training quantization
    over `calibration` (FakeQuantize ops the CPU plugin runs as INT8 kernels)."""
    calibration: fields.DataSource | None = fields.data_field(
        "int8 only, and required there: calibration samples", default=None)
    calibration_args: dict[str, DataArg] = fields.data_args_field("calibration_args", source="calibration")
    samples: int = fields.samples_field(
        "int8 only: use at most this many calibration samples (NNCF's subset_size; fewer when the data "
        "holds fewer). A data callable may be infinite.", default=300)
    preset: Literal["performance", "mixed"] | None = Field(None, examples=["mixed"])
    """int8 only: NNCF's quantization preset. 'performance': symmetric weights and activations;
    'mixed': symmetric weights, asymmetric activations (better for activations that are not
    centred on 0, e.g. after GELU or in transformers). Not set: 'mixed' with model_type
    'transformer' (NNCF's default there), else 'performance'."""
    model_type: Literal["transformer"] | None = Field(None, examples=["transformer"])
    """int8 only: 'transformer' (nncf.ModelType.TRANSFORMER) for transformer models: NNCF keeps
    their Add, Multiply, MVN (layer norm), reductions and other element-wise ops float,
    quantizes the MatMuls (both inputs symmetric where neither is a weight), first migrates
    activation outliers into the MatMul weights (SmoothQuant, see smooth_quant_alpha), and the
    preset defaults to 'mixed'. Not set: a generic model (CNNs)."""
    ignored_scope: IgnoredScope | None = Field(
        None,
        examples=[{"patterns": ["/head/"]}, {"names": ["/head/Gemm/WithoutBiases"], "types": ["Softmax"]}])
    """int8 only: ops NNCF leaves float (nncf.IgnoredScope), a table of lists: `names` (OpenVINO
    op names: mostly the ONNX node names, but a Gemm 'g' with a bias becomes the MatMul
    'g/WithoutBiases'), `types` (OpenVINO op types: 'MatMul', 'MVN', 'Softmax'...) and
    `patterns` (regular expressions matched from the start of op names). Each entry must match
    an op of the converted model, or the step fails naming it (with close op names)."""
    smooth_quant_alpha: float | None = Field(None, examples=[0.5, -1])
    """int8 with model_type 'transformer' only: SmoothQuant's migration strength for MatMuls, in
    [0, 1] (how much of the activations' outlier range moves into the weights: 0.5 balances
    them), or -1 to skip SmoothQuant. Not set: NNCF's default, 0.95."""
    overflow_fix: Literal["enable", "first_layer", "disable"] | None = Field(None, examples=["enable"])
    """int8 only: NNCF's overflow fix, 7-bit weights (7-bit range, 8-bit storage) for the layers
    it names: 'enable' all, 'first_layer' the first one, 'disable' none. x86 CPUs without VNNI
    (AVX2 only, or older) add uint8 x int8 products in 16-bit sums that saturate with 8-bit
    weights (as the quantize step's reduce_range); VNNI, AMX and ARM CPUs need no fix. Not set:
    NNCF's default, 'first_layer'."""
    hint: Literal["latency", "throughput"] = Field("latency", examples=["throughput"])
    """OpenVINO's performance hint, applied when the model is compiled: 'latency' (one stream,
    all cores on one request) or 'throughput' (several streams for parallel requests). Stored in
    the IR's rt_info and in engine.json; it does not change the graph."""
    inputs: StepInputs = Field(None, examples=[{"x": {"shape": [1, 3, 224, 224]}}])
    """What the model's inputs take (see 'Model inputs'); replaces the recipe's [inputs.NAME]
    entry of the same input. A declared shape becomes the IR's input shape: a size fixes the dim
    (static shapes compile to faster CPU kernels), a range [min, max] or [min, opt, max] bounds
    it. The check's seeded inputs follow the declarations."""
    check: int = Field(3, ge=0, examples=[0])
    """How many comparisons with the input model (run by onnxruntime) to make: seeded random
    inputs for fp32 and fp16, the first calibration samples for int8. 0 skips them: the IR must
    still compile for the CPU."""
    tolerance: float | None = fields.tolerance_field(
        "the IR", default=None, example=1e-4,
        unset=" Not set: 1e-3 for fp32, 1e-2 for fp16, not checked for int8 (min_cosine is).")
    min_cosine: float | None = Field(None, ge=-1, le=1, examples=[0.995])
    """Smallest accepted cosine similarity between a float output of the IR and the input
    model's, over all comparisons (values concatenated). Not set: 0.99 for int8, not checked for
    fp32 and fp16 (tolerance is)."""
    atol: Atol = atol_field()

    @model_validator(mode="after")
    def _int8_settings(self) -> OpenVINOEngineParams:
        if self.precision == "int8":
            if self.calibration is None:
                raise ValueError("precision 'int8' needs calibration data: calibration = 'file.npz', "
                                 "a folder of .npy files, or 'file.py:callable'")
        else:
            foreign = non_default(self, _INT8_ONLY)
            if foreign:
                raise ValueError(f"{', '.join(map(repr, foreign))} only apply to precision 'int8', "
                                 f"not {self.precision!r}")
        if self.calibration_args and (self.calibration is None or not is_callable_source(self.calibration)):
            raise ValueError("'calibration_args' only apply to a 'file.py:callable' calibration source")
        alpha = self.smooth_quant_alpha
        if alpha is not None:
            if not (alpha == -1 or 0 <= alpha <= 1):
                raise ValueError(f"smooth_quant_alpha is {alpha}: give a number in [0, 1], or -1 to skip "
                                 "SmoothQuant")
            if self.model_type != "transformer":
                raise ValueError("'smooth_quant_alpha' only applies with model_type 'transformer' (NNCF "
                                 "runs SmoothQuant on transformers only)")
        return self

    def resolved_preset(self) -> str:
        """The preset NNCF quantizes with: the one set, else NNCF's default for the model type."""
        return self.preset or ("mixed" if self.model_type == "transformer" else "performance")
