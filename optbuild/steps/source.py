"""kind = "onnx": an existing ONNX file as the start of a pipeline."""

from __future__ import annotations

import shutil

from optbuild.errors import StepError
from optbuild.steps.base import InputPath, Step, StepContext, StepParams


class OnnxSourceParams(StepParams):
    path: InputPath


class OnnxSource(Step):
    """Checks the file with onnx.checker, so a corrupt model fails here, named, not later."""

    kind = "onnx"
    Params = OnnxSourceParams
    tools = ("onnx",)

    def run(self, ctx: StepContext) -> None:
        import onnx

        path = ctx.path(self.params.path)
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf raises its own DecodeError types
            raise StepError(f"{path} is not a readable ONNX model: {exc}") from None
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
            raise StepError(f"{path} keeps weights in external data files; "
                            "models with external data are not supported as sources yet")
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise StepError(f"{path} fails onnx.checker: {exc}") from None
        shutil.copyfile(path, ctx.out_dir / "model.onnx")
        ctx.metrics["nodes"] = len(model.graph.node)
