"""The torch side of the export step, apart from it: what the exporters do that the step
works around (nn.MultiheadAttention's fast path, stack traces in metadata), a module's output
tensors in the exporters' order, and the words of its messages (shapes, where an error arose
in the user's file, long texts shortened)."""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
# The TorchScript exporter's UnsupportedOperatorError, and the operator it names.
UNSUPPORTED = re.compile(r"operator '([^']+)' to ONNX opset version \d+ is not supported")


@contextmanager
def mha_fastpath_off() -> Iterator[None]:
    """nn.MultiheadAttention on its plain path while tracing: its fast path (eval mode, no
    gradients) is one operator that the TorchScript exporter cannot translate at any opset."""
    import torch

    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def output_tensors(value: Any) -> list[Any]:
    """The tensors of a module's output, flattened in the order the exporters use."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in output_tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in output_tensors(item)]
    return []


def strip_stack_traces(model: Any) -> bool:
    """Drop the dynamo exporter's per-node stack traces (absolute paths of this checkout)."""
    changed = False

    def graph_nodes(graph: Any) -> Iterator[Any]:
        for node in graph.node:
            yield node
            for attr in node.attribute:
                if attr.HasField("g"):
                    yield from graph_nodes(attr.g)
                for sub in attr.graphs:
                    yield from graph_nodes(sub)

    nodes = [*graph_nodes(model.graph), *(n for f in model.functions for n in f.node)]
    for node in nodes:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
            changed = True
    return changed


def shape_text(info: Any) -> str:
    """'[1, 64, 'batch']' of a graph input or output, '[?]' where the export declares no shape."""
    if not info.type.tensor_type.HasField("shape"):
        return "[?]"
    dims = info.type.tensor_type.shape.dim
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else repr(d.dim_param or "?")
                           for d in dims) + "]"


def where_in(exc: BaseException, directory: Path) -> str:
    """' (at file:line)' of the innermost frame in the user's files, else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(directory)]
    frame = (ours or frames)[-1]
    return f" (at {frame.filename}:{frame.lineno})"


def shortened(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def described(value: Any) -> str:
    """'a str', 'an int', 'a tuple of 3: (Linear, Tensor, str)'."""
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, (tuple, list)):
        items = ", ".join(type(v).__name__ for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"{article} {name} of {len(value)}: ({items})"
    return f"{article} {name}"
