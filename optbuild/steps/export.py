"""kind = "export": a PyTorch module to ONNX with torch.onnx.export.

The key covers the callable's file and every project-local module it imports (read, not
run), the weights and any extra files, so editing a model class rebuilds the export.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from optbuild.errors import StepError
from optbuild.pyimports import local_imports
from optbuild.steps.base import CallableRef, InputPath, Step, StepContext, StepParams


class ExportParams(StepParams):
    model: CallableRef  # "models/cnn.py:build" -> (module, example_inputs)
    weights: InputPath | None = None  # a state_dict (.pt / .pth), loaded with weights_only
    opset: int = Field(17, ge=7, le=23)
    input_names: list[str] = []
    output_names: list[str] = []
    dynamic_axes: dict[str, dict[int, str]] = {}  # name -> {axis: symbolic name}
    # "torchscript": torch's proven exporter, fast and self-contained (deprecated upstream,
    # still shipped in torch 2.13); "dynamo": torch.export-based, the future default.
    exporter: Literal["torchscript", "dynamo"] = "torchscript"
    extra_files: list[InputPath] = []  # other files the callable reads
    tolerance: float = Field(1e-3, gt=0)  # max error relative to the PyTorch outputs

    @model_validator(mode="after")
    def _axes_name_io(self) -> ExportParams:
        names = set(self.input_names) | set(self.output_names)
        unknown = sorted(set(self.dynamic_axes) - names)
        if unknown and names:
            raise ValueError(f"dynamic_axes names {unknown} are not in input_names or output_names")
        if unknown:
            raise ValueError("dynamic_axes needs input_names / output_names to refer to")
        return self


class Export(Step):
    kind = "export"
    Params = ExportParams
    tools = ("torch", "onnx")

    def key_files(self) -> list[Path]:
        files = super().key_files()
        entry = (self.base_dir / self.params.model.rpartition(":")[0]).resolve()
        if entry.is_file():
            files.extend(p for p in local_imports(entry, self.project_root) if p not in files)
        return files

    def _load_callable(self, ctx: StepContext):  # noqa: ANN202
        file, _, name = self.params.model.rpartition(":")
        path = ctx.path(file)
        sys.path.insert(0, str(path.parent))  # let it import its local siblings
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise StepError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise StepError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
        target = module
        for part in name.split("."):
            target = getattr(target, part, None)
            if target is None:
                raise StepError(f"{path} has no attribute {name!r}")
        return target

    def run(self, ctx: StepContext) -> None:
        import torch

        from optbuild.steps import onnxcheck

        p = self.params
        build = self._load_callable(ctx)
        try:
            result = build()
        except Exception as exc:
            raise StepError(f"{p.model} raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
            raise StepError(f"{p.model} must return (torch.nn.Module, example_inputs), "
                            f"got {type(result).__name__}")
        module, inputs = result
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        if p.weights:
            state = torch.load(ctx.path(p.weights), map_location="cpu", weights_only=True)
            try:
                module.load_state_dict(state)
            except RuntimeError as exc:
                raise StepError(f"weights {p.weights} do not fit the module: {exc}") from None
        module.eval()
        out = ctx.out_dir / "model.onnx"
        kwargs = {"input_names": p.input_names or None, "output_names": p.output_names or None,
                  "dynamic_axes": p.dynamic_axes or None, "opset_version": p.opset}
        if p.exporter == "dynamo":
            kwargs.update(dynamo=True, external_data=False)
        else:
            kwargs.update(dynamo=False)
        with torch.no_grad():
            expected = module(*inputs)
            try:
                torch.onnx.export(module, inputs, str(out), **kwargs)
            except Exception as exc:
                raise StepError(f"torch.onnx.export failed ({p.exporter}): {type(exc).__name__}: {exc}") from exc
        self._check(ctx, out, inputs, expected, onnxcheck)

    def _check(self, ctx: StepContext, path: Path, inputs: tuple, expected, onnxcheck) -> None:  # noqa: ANN001
        import onnx
        import torch

        try:
            onnx.checker.check_model(str(path))
        except onnx.checker.ValidationError as exc:
            raise StepError(f"the exported model fails onnx.checker: {exc}") from None
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        reference = [t.detach().numpy() for t in expected if isinstance(t, torch.Tensor)]
        sess = onnxcheck.session(path)
        names = [i.name for i in sess.get_inputs()]
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        outputs = sess.run(None, {n: t.numpy() for n, t in zip(names, tensors)})
        abs_err, rel_err = onnxcheck.max_errors(reference, outputs)
        ctx.metrics.update(max_abs_error=abs_err, max_rel_error=rel_err,
                           nodes=len(onnx.load(str(path)).graph.node), exporter=self.params.exporter)
        ctx.log(f"onnxruntime vs PyTorch: max abs error {abs_err:.3g}, relative {rel_err:.3g}")
        if not rel_err <= self.params.tolerance:
            raise StepError(f"exported model disagrees with PyTorch: max relative error {rel_err:.3g} "
                            f"> tolerance {self.params.tolerance:g}")
