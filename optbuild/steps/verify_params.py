"""Verify's parameters (docs/steps.md#verify): what is compared, on which samples, and the
thresholds and parts it is judged by; apart from the step so that its judgement (verify_judge)
reads them without importing the step.
"""

from __future__ import annotations

import itertools
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from optbuild.common.recipetable import KEYED_WHEN_SET, CallableRef, RecipeTable, StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs
from optbuild.model.samples import DataArg, non_default
from optbuild.steps.base import StepParams
from optbuild.steps.fields import (
    DataSource,
    data_args_field,
    data_field,
    dynamic_size_field,
    samples_field,
    seed_field,
)


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
