"""Why a TensorRT or TensorRT-RTX build fails, said in the recipe's terms.

Pure functions over the builder's log lines and the ONNX model's facts, so that they run, and
are tested, on any host:

* Driver noise. TensorRT-RTX builds without a GPU, yet on a host with none it logs CUDA
  runtime errors ("cudaError 35: CUDA driver version is insufficient for CUDA runtime
  version") beside the real error, even between the lines of one message. There they are no
  cause: ``split_driver_noise`` sets them apart. On a host with a GPU the same lines mean a
  driver problem, and stay.
* Dims of one name. TensorRT takes the dims an ONNX model gives one name (``dim_param``,
  paddle2onnx's "?" included) as one size, and its builder rejects a profile that gives them
  different ones without naming an input or a profile ("Dimensions with name batch must be
  equal"). ``dim_name_conflicts`` finds them in a profile before the build; the ONNX file is
  read for the names, since TensorRT's network shows those dims as -1.
* Known messages. ``hints`` turns them into what to change in the recipe: a node with Float
  and Half operands (an fp16 conversion that stopped half way) into the fp16 quantize step's
  ``node_block_list``; int32 biases of a Q/DQ model into the static quantize step's
  ``extra_options = { QuantizeBias = false }``.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

if typing.TYPE_CHECKING:
    import onnx

# What TensorRT and TensorRT-RTX log when CUDA finds no usable GPU (cudaError 35: no driver
# loaded, 100: no device): on a host without a GPU it says nothing of the model.
_DRIVER_NOISE = re.compile(
    r"CUDA driver version is insufficient for CUDA runtime version|no CUDA-capable device is detected"
    r"|CUDA initialization failure|\bcuInit\b|cudaError (?:35|100)\b|Unable to determine GPU memory usage",
    re.IGNORECASE)
_INVALID_NODE = re.compile(r"Invalid Node - (.+?)\s*$")
# TensorRT's operand type checks: "IConvolutionLayer `input` and `kernel` must be of same
# type. `input` type is Float but `kernel` is of type Half." and "IMatrixMultiplyLayer must
# have same input types. `A` is of type Float and `B` is of type Half."
_MIXED_TYPES = re.compile(
    r"(?:\((?P<layer>[^():]+): )?I\w+Layer\b[^.]*?must (?:be of same type|have same input types)\.\s*"
    r"(?P<detail>[^.]*\bFloat\b[^.]*\bHalf\b[^.]*|[^.]*\bHalf\b[^.]*\bFloat\b[^.]*)\.")
_BIAS_CONSUMERS = ("Conv", "ConvTranspose", "Gemm")  # input 2 is the bias


@dataclass(frozen=True)
class ModelFacts:
    """What the diagnoses need of an ONNX model."""

    # Graph input -> each dim's name (None: a fixed size, or no name).
    dim_names: dict[str, list[str | None]]
    # (DequantizeLinear node of an int32 initializer, the Conv / Gemm whose bias it gives).
    int32_biases: list[tuple[str, str]]
    # Node name -> the main graph's control-flow node (If, Loop, Scan) whose subgraph holds
    # it; None for a node of the main graph.
    enclosing: dict[str, str | None]


def model_facts(model: onnx.ModelProto) -> ModelFacts:
    """The facts of an ONNX model."""
    import onnx

    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    dim_names = {
        value.name: [d.dim_param or None for d in value.type.tensor_type.shape.dim]
        for value in graph.input if value.name not in initializers}
    biases: list[tuple[str, str]] = []
    enclosing: dict[str, str | None] = {}

    def walk(g: onnx.GraphProto, int32: set[str], top: str | None) -> None:
        int32 = int32 | {t.name for t in g.initializer if t.data_type == onnx.TensorProto.INT32}
        dequantized = {node.output[0]: node.name for node in g.node
                       if node.op_type == "DequantizeLinear" and node.input[0] in int32}
        for node in g.node:
            enclosing[node.name] = top
            if node.op_type in _BIAS_CONSUMERS and len(node.input) > 2 and node.input[2] in dequantized:
                biases.append((dequantized[node.input[2]], node.name))
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                    walk(sub, int32, top or node.name)

    walk(graph, set(), None)
    return ModelFacts(dim_names, biases, enclosing)


def read_model_facts(path: Path) -> ModelFacts | None:
    """The facts of the ONNX file ``path``; None when onnx is not installed or cannot read it
    (the diagnoses are then left out, the build's own errors stand)."""
    try:
        import onnx

        return model_facts(onnx.load(str(path), load_external_data=False))
    except Exception:
        return None


# --- driver noise ----------------------------------------------------------------------------
def split_driver_noise(messages: Iterable[str], gpu_less: bool) -> tuple[list[str], list[str]]:
    """(lines, noise): the messages' lines, each once, in order; on a ``gpu_less`` host the
    CUDA driver lines go to ``noise`` instead (on a host with a GPU nothing is noise)."""
    lines: list[str] = []
    noise: list[str] = []
    for message in messages:
        for line in message.splitlines():
            line = line.strip()
            target = noise if gpu_less and _DRIVER_NOISE.search(line) else lines
            if line and line not in target:
                target.append(line)
    return lines, noise


def noise_note(noise: Sequence[str]) -> str:
    """One line for the driver noise ``split_driver_noise`` set apart."""
    count = f"{len(noise)} CUDA driver message{'s' if len(noise) > 1 else ''}"
    return (f"{count} left out, expected on a host without a GPU (TensorRT-RTX builds without "
            f"one): {noise[0]}")


# --- dims of one name ------------------------------------------------------------------------
def dim_name_conflicts(profile: Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]],
                       dim_names: Mapping[str, Sequence[str | None]]) -> list[tuple[str, list[str]]]:
    """(name, one description per dim) for each dim name whose dims get different min / opt /
    max in ``profile`` (input -> (min, opt, max) shapes); inputs the profile lacks are left out."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for name, dims in dim_names.items():
        if name in profile:
            for axis, dim_name in enumerate(dims):
                if dim_name is not None:
                    groups.setdefault(dim_name, []).append((name, axis))
    conflicts = []
    for dim_name, placed in groups.items():
        bounds = [tuple(shape[axis] for shape in profile[name]) for name, axis in placed]
        if len(set(bounds)) > 1:
            conflicts.append((dim_name, [f"{name!r} dim {axis} (min {lo}, opt {mid}, max {hi})"
                                         for (name, axis), (lo, mid, hi) in zip(placed, bounds)]))
    return conflicts


# --- hints for known messages --------------------------------------------------------------------
def hints(lines: Sequence[str], facts: ModelFacts | None) -> list[str]:
    """What to change in the recipe for the known messages among ``lines``, one line each."""
    found = []
    invalid = None  # the ONNX node the parser last named
    seen = set()
    for line in lines:
        if (match := _INVALID_NODE.search(line)) is not None:
            invalid = match.group(1)
        if (match := _MIXED_TYPES.search(line)) is None:
            continue
        named = [n for n in (match.group("layer"), invalid) if n]
        node = next((n for n in named if facts is not None and n in facts.enclosing), named[0] if named else None)
        if node is None or node in seen:
            continue
        seen.add(node)
        found.append(_mixed_types_hint(node, match.group("detail").replace("`", ""), facts))
    if facts is not None and facts.int32_biases and any(
            "type Int32" in line or any(dq in line for dq, _ in facts.int32_biases) for line in lines):
        found.append(_int32_bias_hint(facts.int32_biases))
    return found


def _mixed_types_hint(node: str, detail: str, facts: ModelFacts | None) -> str:
    top = facts.enclosing.get(node) if facts is not None else None
    said = (f"hint: node {node!r} mixes float32 and float16 operands ({detail}): the fp16 conversion "
            "converted only part of it. ")
    if top is None:
        return (said + f"Keep it in float32: node_block_list = [\"{node}\"] in the quantize step "
                       "(mode = \"fp16\") that made this model.")
    return (said + f"It sits in a subgraph of {top!r}, where blocking nodes one by one moves the "
                   f"mismatch to the next: keep all of {top!r} in float32 with node_block_list = "
                   f"[\"{top}\"] in the quantize step (mode = \"fp16\") that made this model.")


def _int32_bias_hint(biases: Sequence[tuple[str, str]]) -> str:
    dq, consumer = biases[0]
    more = f", and {len(biases) - 1} more" if len(biases) > 1 else ""
    return (f"hint: this Q/DQ model quantizes biases to int32 (DequantizeLinear {dq!r} gives the bias of "
            f"{consumer!r}{more}), which TensorRT does not take. In the quantize step (mode = \"static\") "
            "that made it, set extra_options = { QuantizeBias = false } (biases stay float), with "
            "activation_type = \"int8\" and symmetric_activations = true: symmetric int8, as TensorRT wants.")
