"""kind = "onnx": an existing ONNX file as the start of a pipeline.

The file is parsed and checked with onnx.checker here, so a corrupt or invalid model fails
at its source, named, instead of somewhere downstream. The bytes are passed on unchanged.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from optbuild.common.errors import StepError
from optbuild.common.recipetable import InputPath
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext, StepParams


class OnnxSourceParams(StepParams):
    path: InputPath = Field(examples=["models/resnet18.onnx"])
    """The ONNX model file, relative to the recipe file. It must be one self-contained file (no
    external data) that passes onnx.checker; its bytes enter the key and are passed on
    unchanged."""


def all_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto of an onnx.ModelProto: initializers, sparse initializers and tensor
    attributes (Constant values...), in subgraphs and local functions too."""

    def from_attributes(attributes: Any) -> Iterator[Any]:
        for attr in attributes:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
            for sparse in attr.sparse_tensors:
                yield sparse.values
            if attr.HasField("g"):
                yield from from_graph(attr.g)
            for graph in attr.graphs:
                yield from from_graph(graph)

    def from_graph(graph: Any) -> Iterator[Any]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
        for node in graph.node:
            yield from from_attributes(node.attribute)

    yield from from_graph(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from from_attributes(node.attribute)


def uses_external_data(model: Any) -> bool:
    import onnx

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(model))


class OnnxSource(Step[OnnxSourceParams]):
    """An existing ONNX file as a pipeline's source, checked with onnx.checker."""

    Params = OnnxSourceParams
    preload = ONNX_TOOLS
    tools = ("onnx",)

    def precision(self) -> str:
        return "source"  # as the file holds it

    def run(self, ctx: StepContext) -> None:
        import onnx

        path = ctx.path(self.params.path)
        if not path.is_file():
            raise StepError(f"{path}: no such ONNX file")
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError, or onnx's own errors
            raise StepError(f"{path} is not a readable ONNX model (corrupt or not ONNX): "
                            f"{type(exc).__name__}: {exc}") from None
        if uses_external_data(model):
            raise StepError(f"{path} keeps tensors in external data files; ONNX models with "
                            "external data are not supported as sources (save it as one file)")
        try:
            onnx.checker.check_model(model)
        except Exception as exc:  # ValidationError, or a C++ error from a malformed proto
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StepError(f"{path} fails onnx.checker: {first}") from None
        shutil.copyfile(path, ctx.out_dir / "model.onnx")
        opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
        ctx.metrics.update(nodes=len(model.graph.node), opset=opsets.get("ai.onnx"),
                           inputs=[i.name for i in model.graph.input
                                   if i.name not in {t.name for t in model.graph.initializer}],
                           outputs=[o.name for o in model.graph.output])
        ctx.log(f"{path.name}: {len(model.graph.node)} nodes, opsets {opsets}")
