"""The TensorRT engine steps' parameters: optimization profiles as shape ranges per input,
the options the two kinds share and each one's own (TensorRT's hardware and version
compatibility, TensorRT-RTX's targets), checked as written."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from optbuild.backends.tensorrt import profiles as profile_form
from optbuild.backends.tensorrt.host import (
    RTX_DEFAULT_TARGETS,
    RTX_TARGETS,
    canonical_targets,
)
from optbuild.common.recipetable import RecipeTable, StepRef
from optbuild.model.inputdecl import StepInputs
from optbuild.steps.base import StepParams
from optbuild.steps.fields import input_field


class ShapeRange(RecipeTable):
    """min / opt / max shapes of one input in one optimization profile."""

    min: list[int]
    """The smallest shape the engine accepts, one positive size per dimension."""
    opt: list[int]
    """The shape TensorRT tunes its kernels for."""
    max: list[int]
    """The largest shape the engine accepts."""

    @model_validator(mode="after")
    def _consistent(self) -> ShapeRange:
        ranks = (len(self.min), len(self.opt), len(self.max))
        if len(set(ranks)) != 1:
            raise ValueError(f"min, opt and max must have the same rank, got ranks {ranks[0]}, "
                             f"{ranks[1]} and {ranks[2]}")
        if ranks[0] == 0:
            raise ValueError("a shape needs at least one dimension")
        for label, dims in (("min", self.min), ("opt", self.opt), ("max", self.max)):
            if any(d < 1 for d in dims):
                raise ValueError(f"dimensions must be positive, {label} is {dims}")
        for axis, (lo, mid, hi) in enumerate(zip(self.min, self.opt, self.max)):
            if not lo <= mid <= hi:
                raise ValueError(f"need min <= opt <= max in every dimension; dimension {axis} "
                                 f"has min {lo}, opt {mid}, max {hi}")
        return self


# One optimization profile: input name -> its shape range.
Profile = dict[str, ShapeRange]

_TRT_ONLY = ("hardware_compatibility", "version_compatible", "precision_flags", "fingerprint")
_RTX_ONLY = ("targets",)


class EngineParams(StepParams):
    """Parameters both backends share."""

    # The other backend's parameters, rejected by name, and that backend.
    _foreign: ClassVar[tuple[tuple[str, ...], str]] = ((), "")

    input: StepRef = input_field("built into an engine. Precision comes from the graph: a quantize step "
                                 "with mode 'fp16' for FP16, a Q/DQ model (mode 'static', activation_type "
                                 "'int8', symmetric) for INT8.")
    profiles: list[Profile] = Field(default_factory=list, examples=[profile_form.EXAMPLE])
    """Optimization profiles for dynamic inputs: a list of tables, each mapping input name -> {
    min = [...], opt = [...], max = [...] } (shapes of the same rank, min <= opt <= max in every
    dimension; a dimension the model fixes must be that size in all three; dimensions the ONNX
    model gives one name, within or across inputs, must be given equal sizes, as TensorRT takes
    them as one, checked before building). Every dynamic input must appear in every profile;
    required when the model has dynamic inputs whose shapes 'inputs' does not declare (checked
    when it is parsed). Empty: one profile from the declared shapes, or none when the model's
    inputs are all static. At run time each input batch must fit one profile."""
    inputs: StepInputs = Field(None, examples=[{"x": {"shape": [[1, 4, 8], 3, 224, 224]}}])
    """What the model's inputs take (see 'Model inputs'); replaces the recipe's [inputs.NAME]
    entry of the same input. Without profiles, one profile is made from the declared shapes:
    min, opt and max of each dim's range (dims the model gives one name must be declared
    alike)."""
    optimization_level: int = Field(3, ge=0, le=5, examples=[5])
    """TensorRT's builder optimization level: 0 (fastest build) to 5 (slowest build, most
    tactics tried)."""
    workspace: int | None = Field(None, examples=["2 GiB"])
    """Limit of the builder's workspace memory pool: bytes, or a size string such as "1 GiB" or
    "512MB". Not set: TensorRT's default (the device's memory)."""

    @field_validator("profiles", mode="before")
    @classmethod
    def _profiles_form(cls, value: Any) -> Any:
        if (problem := profile_form.form_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("profiles")
    @classmethod
    def _profiles_name_inputs(cls, value: list[Profile]) -> list[Profile]:
        for index, profile in enumerate(value):
            if not profile:
                raise ValueError(f"profile {index} names no input")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_keys(cls, data: Any) -> Any:
        foreign, owner = cls._foreign
        if isinstance(data, dict) and (keys := [k for k in foreign if k in data]):
            raise ValueError(f"{', '.join(map(repr, keys))} only apply to backend {owner!r}")
        return data

    @field_validator("workspace", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if isinstance(value, str):
            from optbuild.common.units import parse_size

            value = parse_size(value)
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            raise ValueError("workspace must be a positive size")
        return value


class TensorRTParams(EngineParams):
    _foreign = (_RTX_ONLY, "tensorrt-rtx")

    backend: Literal["tensorrt"] = Field(examples=["tensorrt"])
    """Selects this engine: TensorRT, built on and for this host's NVIDIA GPU."""
    hardware_compatibility: Literal["none", "ampere+", "same-compute-capability"] = Field(
        "none", examples=["ampere+"])
    """Which GPUs the engine may run on besides the build GPU's kind: 'none' (that kind only),
    'ampere+' (any Ampere or newer GPU; needs one to build) or 'same-compute-capability' (GPUs
    of the build GPU's compute capability)."""
    version_compatible: bool = Field(False, examples=[True])
    """Build an engine that later TensorRT versions of the same major version can load."""
    precision_flags: list[Literal["fp16", "bf16", "int8", "fp8", "int4", "fp4"]] = Field(
        default_factory=list, examples=[["fp16"]])
    """TensorRT 10 only: weakly typed builder precision flags (fp16, bf16, int8, fp8, int4,
    fp4). TensorRT 11 builds strongly typed networks only and rejects them: put the precision in
    the ONNX graph instead. Empty: strongly typed."""
    fingerprint: Literal["exact", "compute-capability", "hardware-compatibility"] = Field(
        "compute-capability", examples=["exact"])
    """What of the build GPU enters the key: 'exact' (its model and compute capability),
    'compute-capability', or 'hardware-compatibility' (nothing beyond the hardware_compatibility
    level; needs it other than 'none')."""

    @field_validator("precision_flags")
    @classmethod
    def _canonical_flags(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @model_validator(mode="after")
    def _policy(self) -> TensorRTParams:
        if self.fingerprint == "hardware-compatibility" and self.hardware_compatibility == "none":
            raise ValueError("fingerprint = 'hardware-compatibility' needs hardware_compatibility "
                             "'ampere+' or 'same-compute-capability' (with 'none' the engine "
                             "is tied to the build GPU)")
        return self


class TensorRTRTXParams(EngineParams):
    _foreign = (_TRT_ONLY, "tensorrt")

    backend: Literal["tensorrt-rtx"] = Field(examples=["tensorrt-rtx"])
    """Selects this engine: TensorRT for RTX, compiled ahead of time without a GPU."""
    targets: list[str] = Field(
        default_factory=list,
        description="Compute capabilities to build for, written \"sm86\", \"sm_86\" or \"8.6\" "
                    "(known to TensorRT-RTX: " + ", ".join(RTX_TARGETS) + "; checked against the "
                    "installed TensorRT-RTX when the step runs). They enter the key instead of the "
                    "build host. Empty: TensorRT-RTX's default set (" + ", ".join(RTX_DEFAULT_TARGETS)
                    + "), portable across its Ampere-and-later RTX GPUs.",
        examples=[["sm86", "sm89"]])

    @field_validator("targets")
    @classmethod
    def _canonical_targets(cls, value: list[str]) -> list[str]:
        return canonical_targets(value)
