"""Triton model configurations: what a model's files say of its tensors, and the
``config.pbtxt`` made from it, checked against Triton's own schema (optbuild.steps.triton_schema).

A model is read without its runtime, so that a deploy host needs none to lay out a
repository: an ONNX graph with onnx, an OpenVINO IR's xml as plain XML, and a TensorRT engine
through the ``engine.json`` its engine step wrote beside it (names, shapes and profiles; the
data types come from the ONNX model it was built from, as TensorRT networks are strongly typed).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.common.errors import StepError
from optbuild.steps.triton_schema import model_config_class

# Triton's DataType names by the names each format gives an element type.
_ONNX_TYPES = {"FLOAT": "TYPE_FP32", "FLOAT16": "TYPE_FP16", "BFLOAT16": "TYPE_BF16", "DOUBLE": "TYPE_FP64",
               "BOOL": "TYPE_BOOL", "STRING": "TYPE_STRING",
               **{f"{s}INT{b}": f"TYPE_{s}INT{b}" for s in ("", "U") for b in (8, 16, 32, 64)}}
_OV_TYPES = {"f32": "TYPE_FP32", "fp32": "TYPE_FP32", "f16": "TYPE_FP16", "fp16": "TYPE_FP16",
             "bf16": "TYPE_BF16", "f64": "TYPE_FP64", "fp64": "TYPE_FP64", "boolean": "TYPE_BOOL",
             "bool": "TYPE_BOOL", "string": "TYPE_STRING",
             **{f"{s}{b}": f"TYPE_{'U' if s == 'u' else ''}INT{b}" for s in ("i", "u") for b in (8, 16, 32, 64)}}
# What Triton runs each runtime's model with: (platform or backend, the file name it loads).
RUNTIMES = {"onnxruntime": ("platform", "onnxruntime_onnx", "model.onnx"),
            "tensorrt": ("platform", "tensorrt_plan", "model.plan"),
            "openvino": ("backend", "openvino", "model.xml")}
# Fields a deploy step derives from the model; a recipe's ``config`` may not set them.
DERIVED = ("name", "platform", "backend", "max_batch_size", "input", "output")


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # Triton's: "TYPE_FP32"...
    dims: tuple[int, ...]  # -1: dynamic


@dataclass
class Signature:
    """A model's inputs and outputs; ``batch_limit``: the largest first dim its engine takes
    (a TensorRT engine's profiles), None when the model does not bound it."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    batch_limit: int | None = None
    notes: list[str] = field(default_factory=list)


def onnx_signature(path: Path) -> Signature:
    """The graph inputs (initializers excluded) and outputs of an ONNX model."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    constants = {t.name for t in model.graph.initializer}

    def tensor(value: Any) -> Tensor:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise StepError(f"{path.name}: {value.name!r} is a {kind}, not a tensor: Triton takes tensors only")
        elem = onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type)
        if elem not in _ONNX_TYPES:
            raise StepError(f"{path.name}: tensor {value.name!r} has element type {elem}, which Triton has no "
                            f"data type for (it has {', '.join(sorted(_ONNX_TYPES))})")
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1
                     for d in value.type.tensor_type.shape.dim)
        return Tensor(value.name, _ONNX_TYPES[elem], dims)

    return Signature([tensor(v) for v in model.graph.input if v.name not in constants],
                     [tensor(v) for v in model.graph.output])


def openvino_signature(path: Path) -> Signature:
    """Parameters and Results of an OpenVINO IR, read from its xml (no OpenVINO needed)."""
    try:
        net = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise StepError(f"{path.name} is not an OpenVINO IR: {exc}") from None
    layers = {layer.get("id"): layer for layer in net.iter("layer")}
    edges = {(e.get("to-layer"), e.get("to-port")): (e.get("from-layer"), e.get("from-port"))
             for e in net.iter("edge")}

    def port_tensor(name: str, port: ET.Element, precision: str | None) -> Tensor:
        dims = tuple(int(d.text or "-1") for d in port.findall("dim"))
        data_type = _OV_TYPES.get((precision or port.get("precision") or "").lower())
        if data_type is None:
            raise StepError(f"{path.name}: tensor {name!r} has precision {precision or port.get('precision')!r}, "
                            "which Triton has no data type for")
        return Tensor(name, data_type, tuple(d if d >= 0 else -1 for d in dims))

    inputs, outputs = [], []
    for layer in layers.values():
        if layer.get("type") == "Parameter":
            port = layer.find("output/port")
            data = layer.find("data")
            if port is None:
                raise StepError(f"{path.name}: Parameter {layer.get('name')!r} has no output port")
            name = (port.get("names") or layer.get("name") or "").split(",")[0]
            inputs.append(port_tensor(name, port, data.get("element_type") if data is not None else None))
        elif layer.get("type") == "Result":
            port = layer.find("input/port")
            if port is None:
                raise StepError(f"{path.name}: Result {layer.get('name')!r} has no input port")
            name = layer.get("output_names") or ""
            if not name:  # older IRs: the names of the port that feeds it
                source = edges.get((layer.get("id"), port.get("id")))
                feeding = layers.get(source[0]) if source else None
                ports = feeding.findall("output/port") if feeding is not None else []
                names = [p.get("names") for p in ports if p.get("id") == source[1]] if source else []
                name = names[0] if names and names[0] else layer.get("name", "")
            outputs.append(port_tensor(name.split(",")[0], port, None))
    if not inputs or not outputs:
        raise StepError(f"{path.name}: found {len(inputs)} Parameter and {len(outputs)} Result layers; an "
                        "OpenVINO IR has at least one of each")
    return Signature(inputs, outputs)


def tensorrt_signature(manifest: Path, source: Signature | None, source_name: str | None) -> Signature:
    """A TensorRT engine's bindings from its engine.json (optbuild.steps.engine_trt), their
    data types from ``source``, the ONNX model it was built from; the batch limit from its
    profiles: the largest first dim every input takes in one profile."""
    from optbuild.backends.manifest import ManifestError, read_manifest

    try:
        data = read_manifest(manifest)
        inputs = [(b["name"], tuple(int(d) for d in b["shape"])) for b in data["inputs"]]
        outputs = [(b["name"], tuple(int(d) for d in b["shape"])) for b in data["outputs"]]
        profiles = data.get("profiles") or []
    except ManifestError as exc:
        raise StepError(str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise StepError(f"{manifest}: not an engine.json as the tensorrt engine step writes it ({exc})") from None
    if source is None:
        raise StepError(f"{manifest.name} records no data types of the engine's inputs and outputs: set "
                        f"source = \"{source_name or 'NAME'}\", the step whose ONNX model the engine was "
                        "built from (TensorRT takes the types from the ONNX graph)")
    types = {t.name: t.data_type for t in (*source.inputs, *source.outputs)}
    missing = [name for name, _ in (*inputs, *outputs) if name not in types]
    if missing:
        raise StepError(f"the source model has no tensor {', '.join(map(repr, missing))} of the engine: "
                        "source must name the step the engine was built from")
    limits = [min(p[name]["max"][0] for name, _ in inputs if name in p) for p in profiles
              if all(name in p for name, shape in inputs if shape and shape[0] < 0)]
    return Signature([Tensor(n, types[n], s) for n, s in inputs], [Tensor(n, types[n], s) for n, s in outputs],
                     batch_limit=max(limits) if limits else None)


@dataclass(frozen=True)
class Serving:
    """How Triton serves the model (the deploy step's choices, resolved)."""

    name: str
    runtime: str  # a key of RUNTIMES
    dynamic_batching: bool
    gpu: bool
    instances: int
    accelerator: str | None
    accelerator_parameters: dict[str, str]


def batch_size(signature: Signature, requested: int | None, default: int) -> int:
    """Triton's max_batch_size for ``signature``: 0 unless every input and output has a
    dynamic first dim; then ``requested``, else the engine's limit or ``default``."""
    fixed = [t for t in (*signature.inputs, *signature.outputs) if not t.dims or t.dims[0] != -1]
    if requested == 0 or (requested is None and fixed):
        return 0
    if fixed:
        raise StepError(f"max_batch_size = {requested} needs a dynamic first dim in every input and output, "
                        f"but {', '.join(f'{t.name} {list(t.dims)}' for t in fixed)} "
                        f"{'has' if len(fixed) == 1 else 'have'} none: set max_batch_size = 0 (Triton then "
                        "passes each request's shape as it is) or export the model with a dynamic batch dim")
    limit = signature.batch_limit
    if requested is not None and limit is not None and requested > limit:
        raise StepError(f"max_batch_size = {requested} is larger than the engine's profiles allow ({limit}): "
                        f"lower it, or build the engine with a profile up to {requested}")
    return requested or limit or default


def render(signature: Signature, serving: Serving, max_batch: int) -> str:
    """config.pbtxt's text for the model, before Triton's schema reads it back."""
    kind, value, _ = RUNTIMES[serving.runtime]
    lines = [f"name: {json.dumps(serving.name)}", f"{kind}: {json.dumps(value)}", f"max_batch_size: {max_batch}"]
    for section, tensors in (("input", signature.inputs), ("output", signature.outputs)):
        for t in tensors:
            dims = list(t.dims[1:] if max_batch else t.dims)
            # a tensor that is only the batch dim: Triton wants dims [1], reshaped to none
            reshape = " reshape: { shape: [] }" if not dims else ""
            lines.append(f"{section} {{ name: {json.dumps(t.name)} data_type: {t.data_type} "
                         f"dims: {dims or [1]}{reshape} }}")
    lines.append(f"instance_group {{ kind: {'KIND_GPU' if serving.gpu else 'KIND_CPU'} count: {serving.instances} }}")
    if max_batch and serving.dynamic_batching:
        lines.append("dynamic_batching { }")
    if serving.accelerator:
        where = "gpu_execution_accelerator" if serving.gpu else "cpu_execution_accelerator"
        parameters = "".join(f" parameters {{ key: {json.dumps(k)} value: {json.dumps(v)} }}"
                             for k, v in sorted(serving.accelerator_parameters.items()))
        lines.append(f"optimization {{ execution_accelerators {{ {where}: [ {{ name: "
                     f"{json.dumps(serving.accelerator)}{parameters} }} ] }} }}")
    return "\n".join(lines) + "\n"


def parse(text: str, what: str) -> Any:
    """``text`` as Triton's ModelConfig; StepError naming the line, the column and the field
    Triton's schema rejects."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, model_config_class()())
    except text_format.ParseError as exc:
        message = str(exc).partition(" : ")[2] or str(exc)
        raise StepError(f"{what} is not a valid Triton model configuration (its line {exc.GetLine()}, column "
                        f"{exc.GetColumn()}): {message}") from None


def check(config: Any) -> None:
    """What Triton checks when it loads a configuration, beyond its schema: StepError naming
    the field."""
    problems = []
    if config.max_batch_size < 0:
        problems.append(f"max_batch_size is {config.max_batch_size}; it must be 0 (no batching) or more")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        problems.append("dynamic_batching needs max_batch_size > 0")
    for section in ("input", "output"):
        for index, tensor in enumerate(getattr(config, section)):
            where = f"{section}[{index}] ({tensor.name!r})"
            if not tensor.name:
                problems.append(f"{section}[{index}] has no name")
            if tensor.data_type == 0:
                problems.append(f"{where}: data_type is TYPE_INVALID")
            if not tensor.dims or any(d < -1 or d == 0 for d in tensor.dims):
                problems.append(f"{where}: dims {list(tensor.dims)} must be one or more sizes > 0, or -1")
    for index, group in enumerate(config.instance_group):
        if group.count < 1:
            problems.append(f"instance_group[{index}]: count {group.count} must be at least 1")
    if problems:
        raise StepError("Triton would reject the model configuration: " + "; ".join(problems))


def overlay(config: Any, extra: Any) -> None:
    """Merge the recipe's own configuration ``extra`` into ``config``: a repeated field it
    sets (instance_group...) replaces the derived one instead of adding to it."""
    for descriptor, value in extra.ListFields():
        if isinstance(value, MutableSequence):  # a map merges key by key
            config.ClearField(descriptor.name)
    config.MergeFrom(extra)


def to_text(config: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)
