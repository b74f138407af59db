"""The export step's parameters: the module, its weights, its inputs' and outputs' names and
axes, the exporter and its opset, checked together."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from optbuild.common.recipetable import KEYED_WHEN_SET, CallableRef, InputPath, StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs, narrowed
from optbuild.steps.base import StepParams

TORCHSCRIPT_MAX_OPSET = 20  # torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET in 2.13
DYNAMO_MIN_OPSET = 18  # the dynamo exporter's own opset; lower ones need a fragile conversion


class ExportParams(StepParams):
    model: CallableRef = Field(examples=["models/cnn.py:build"])
    """The PyTorch model, as 'file.py:callable' relative to the recipe file. Called with no
    arguments, it returns (module, example_inputs): a torch.nn.Module and a tensor or tuple of
    tensors, one per model input, in forward()'s order. The file and every project-local module
    it imports enter the key (read, never run, to make the key)."""
    weights: InputPath | None = Field(None, examples=["weights/cnn.pt"])
    """A state_dict file (.pt / .pth, loaded with torch.load(weights_only=True)) loaded into the
    module before export, relative to the recipe file. Not set: the module keeps the weights the
    callable gave it."""
    weights_from: Annotated[StepRef | None, KEYED_WHEN_SET] = Field(None, examples=["init_weights"])
    """The step whose main output is the state_dict to load, instead of a file: a checkpoint an
    earlier step wrote (an initialization, a fine-tuning). Loaded as weights is; its content
    enters the key as any upstream output does. Excludes weights."""
    opset: int = Field(17, ge=7, le=23, examples=[18])
    """ONNX opset to export. 7 to 20 with exporter 'torchscript', 18 to 23 with 'dynamo'; the
    exported model must declare exactly this opset."""
    input_names: list[str] = Field([], examples=[["image"]])
    """Names of the graph inputs, in the order of the example inputs. Empty: the exporter's own
    names. Needed to name inputs in dynamic_axes."""
    output_names: list[str] = Field([], examples=[["logits"]])
    """Names of the graph outputs, in the order forward() returns them. Empty: the exporter's
    own names. Set, it names every output: a forward() that returns more tensors (a detector's
    feature maps in eval mode) or fewer fails, naming the extras; return only what you want
    from a wrapper module, or name them all."""
    dynamic_axes: dict[str, dict[int, str]] = Field(
        {}, examples=[{"image": {0: "batch"}, "logits": {0: "batch"}}])
    """Axes whose size may vary at run time: input or output name -> {axis: symbolic name}. Axes
    count from 0 (TOML's string keys "0" are accepted); names must be listed in input_names /
    output_names. Empty: every shape is fixed to the example inputs'. The export is re-checked
    with every dynamic input axis at another size: a size 'inputs' declares for it (a range's
    max, else its min), else one larger."""
    exporter: Literal["torchscript", "dynamo"] = Field("torchscript", examples=["dynamo"])
    """'torchscript' (torch.onnx.export with dynamo=False: traces; opset 7-20) or 'dynamo'
    (torch.export + onnxscript: tracks symbolic shapes; opset >= 18)."""
    extra_files: list[InputPath] = Field([], examples=[["models/config.json"]])
    """Other files the callable reads (configs, vocabularies...), relative to the recipe file:
    their bytes enter the key."""
    tolerance: float = Field(1e-3, gt=0, le=1, examples=[1e-4])
    """Largest accepted error of onnxruntime against PyTorch on the example inputs, relative to
    the largest magnitude of each PyTorch output (0 < tolerance <= 1)."""
    inputs: StepInputs = Field(None, examples=[{"tokens": {"shape": [1, [16, 128]]}}])
    """What the exported model's inputs take (see 'Model inputs'), by input_names; replaces the
    recipe's [inputs.NAME] entry of the same input. The dynamic-axes re-check grows each dynamic
    axis to a size declared for it."""

    def inputs_read(self) -> InputDecls | None:
        """Only the shapes of inputs with dynamic axes: the re-check grows those axes to a
        declared size; nothing else of a declaration reaches the export."""
        dynamic = {name for name in self.input_names if self.dynamic_axes.get(name)}
        return narrowed(self.inputs, ("shape",), dynamic)

    @field_validator("input_names", "output_names")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        if any(not name.strip() for name in names):
            raise ValueError("names must not be empty")
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"duplicate names {duplicates}")
        return names

    @field_validator("dynamic_axes")
    @classmethod
    def _axes(cls, axes: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
        for name, mapping in axes.items():
            if not mapping:
                raise ValueError(f"{name!r}: no axes given")
            for axis, symbol in mapping.items():
                if axis < 0:
                    raise ValueError(f"{name!r}: axis {axis} is negative (count from 0)")
                if not symbol.strip():
                    raise ValueError(f"{name!r}: axis {axis} needs a symbolic name, e.g. 'batch'")
        return axes

    @model_validator(mode="after")
    def _consistent(self) -> ExportParams:
        if self.weights is not None and self.weights_from is not None:
            raise ValueError("set weights (a file) or weights_from (a step), not both")
        if both := sorted(set(self.input_names) & set(self.output_names)):
            raise ValueError(f"names {both} are both inputs and outputs")
        names = set(self.input_names) | set(self.output_names)
        if unknown := sorted(set(self.dynamic_axes) - names):
            if names:
                raise ValueError(f"dynamic_axes names {unknown} are not in input_names or output_names")
            raise ValueError(f"dynamic_axes names {unknown} need input_names / output_names to refer to")
        if self.exporter == "torchscript" and self.opset > TORCHSCRIPT_MAX_OPSET:
            raise ValueError(f"the torchscript exporter supports opset <= {TORCHSCRIPT_MAX_OPSET}; "
                             f"use exporter = 'dynamo' for opset {self.opset}")
        if self.exporter == "dynamo" and self.opset < DYNAMO_MIN_OPSET:
            raise ValueError(f"the dynamo exporter emits opset >= {DYNAMO_MIN_OPSET} (its conversion "
                             f"to {self.opset} is unreliable); use exporter = 'torchscript' or opset >= 18")
        return self
