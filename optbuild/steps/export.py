"""kind = "export": a PyTorch module to ONNX with torch.onnx.export.

``model = "models/cnn.py:build"`` names a callable that returns ``(module, example_inputs)``.
The key covers the callable's file and every project-local module it imports (read, not
run: optbuild.common.pyimports), the weights and any extra files, so editing a model class in an
imported module rebuilds the export.

The exported model is checked before it is accepted: onnx.checker, then onnxruntime (CPU)
against PyTorch on the example inputs and, when there are dynamic axes, once more with
every dynamic input axis one larger, so a size baked into the graph fails here. With
``output_names`` set, the export must have exactly those outputs: both exporters keep tensors
forward() returns beyond the names under names of their own ('input.400', 'onnx::Shape_736'),
which would flow into every later step and deploy, so that fails, naming them and the fix.

Exporter choice, measured with torch 2.13.0 (CPU), onnxscript 0.7.2 and the example models:
- "torchscript" (``dynamo=False``, the default here): deprecated upstream (it warns) but
  shipped and working in 2.13. It honours the requested opset exactly (7..20), takes
  0.5-0.8 s per example model, and writes the same bytes every time with no file paths in
  them. Its weakness: it traces, so a Python int read from a tensor's shape
  (``x.reshape(int(x.shape[0]), -1)``) becomes a constant and a dynamic axis silently stops
  being dynamic; the second-size check above turns that into a StepError.
- "dynamo" (``dynamo=True``: torch.export + onnxscript; upstream's default): tracks such
  shapes symbolically, but emits opset 18 or newer only. Asked for 17 it runs onnx's version
  converter, which failed on both example models (ReduceMean "axes" adapter) and silently
  kept opset 18, so opset < 18 is rejected for it up front. It takes 4-7 s per example
  model, and writes absolute source paths into node metadata (stack traces): they are
  stripped, so the output does not depend on where the project is checked out.
Torchscript is the default for opset 17 (what TensorRT-era deploys ask for) and speed;
``exporter = "dynamo"`` is one parameter away, and the choice is part of the key. If a later
torch drops the TorchScript exporter, the export fails with a message that says to switch.

The TorchScript exporter runs with PyTorch's fast path of nn.MultiheadAttention off: in eval
mode without gradients that path calls ``aten::_native_multi_head_attention``, which no opset
translates (torchvision's ViT failed so). The failures real models met that a parameter or
a wrapper fixes are said in the message: an operator this exporter cannot translate, a
decorated forward() (transformers) that gets an argument twice because this exporter passes
every parameter positionally, and dynamo's torch.export taking a dynamic axis of size 1 in
the example for a constant.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optbuild.common import usermodule
from optbuild.common.callables import Call
from optbuild.common.errors import StepError, first_line, root_cause
from optbuild.common.pyimports import local_imports
from optbuild.steps.base import TORCH_TOOLS, Step, StepContext
from optbuild.steps.export_check import check_export, input_axes
from optbuild.steps.export_params import DYNAMO_MIN_OPSET, TORCHSCRIPT_MAX_OPSET, ExportParams
from optbuild.steps.export_torch import (
    UNSUPPORTED,
    described,
    mha_fastpath_off,
    shape_text,
    shortened,
    strip_stack_traces,
    where_in,
)


class Export(Step[ExportParams]):
    """A PyTorch module to ONNX (TorchScript or dynamo exporter), checked against PyTorch."""

    # 2: stack traces stripped from dynamo exports; second-size dynamic check; 3: the
    # TorchScript exporter runs with nn.MultiheadAttention's fast path off (builds that failed
    # on it, and were remembered as failed, build again); 4: outputs output_names does not name
    # are refused (exports that kept them are checked again)
    version = "4"
    Params = ExportParams
    preload = TORCH_TOOLS
    tools = ("torch", "onnx")

    def tool_names(self) -> tuple[str, ...]:
        if self.params.exporter == "dynamo":  # the translation and its optimizer live there
            return (*self.tools, "onnxscript", "onnx-ir")
        return self.tools

    def key_files(self) -> list[Path]:
        """The callable's file, the local modules it imports, the weights, the extra files."""
        p = self.params
        entry = (self.base_dir / p.model.rpartition(":")[0]).resolve()
        files = [entry]
        if entry.is_file():
            files += local_imports(entry, self.project_root)
        if p.weights is not None:
            files.append((self.base_dir / p.weights).resolve())
        files += [(self.base_dir / extra).resolve() for extra in p.extra_files]
        return list(dict.fromkeys(files))

    def key_folders(self, files: Sequence[Path]) -> list[Path]:
        """The folders of the model's Python files, where its imports resolve (the weights and
        extra files are named)."""
        return sorted({path.parent for path in files if path.suffix == ".py"})

    def calls(self) -> list[Call]:
        return [Call("model", self.params.model, keywords=())]  # model(): no arguments

    # --- run (worker process) --------------------------------------------------------
    def run(self, ctx: StepContext) -> None:
        import numpy  # noqa: F401  (loaded before the model's directory goes on sys.path)
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import torch

        p = self.params
        path = ctx.path(p.model.rpartition(":")[0])
        out = ctx.out_dir / "model.onnx"
        ctx.progress("building the module")
        with self.load_module(ctx) as (module, inputs):
            self._check_axes(inputs)
            with torch.no_grad():
                ctx.progress("running the module on its example inputs")
                try:
                    expected = module(*inputs)
                except Exception as exc:
                    raise StepError(f"{p.model}: the module fails on its own example inputs: "
                                    f"{type(exc).__name__}: {first_line(exc)}{where_in(exc, path.parent)}") from None
                started = time.perf_counter()
                ctx.progress(f"exporting ({p.exporter})")
                self._export(ctx, module, inputs, out)
                ctx.metrics["export_s"] = round(time.perf_counter() - started, 3)
                self._finish(ctx, out)
                ctx.progress("checking the export on onnxruntime against PyTorch")
                check_export(ctx, self.params, out, module, inputs, expected)

    @contextmanager
    def load_module(self, ctx: StepContext) -> Iterator[tuple[Any, tuple]]:
        """The PyTorch module (weights loaded, in eval mode) and its example inputs, exactly
        as the export sees them; also what `optbuild bench` runs as the eager baseline. Use it
        inside the ``with``: the module's sibling files stay importable until it closes."""
        p = self.params
        file, _, attr = p.model.rpartition(":")
        path = ctx.path(file)
        if not path.is_file():
            raise StepError(f"{p.model}: {path} does not exist")
        def failed(exc: usermodule.ImportFailed) -> StepError:
            return StepError(f"{p.model}: importing {path} failed: {type(exc.cause).__name__}: "
                             f"{first_line(exc.cause)}{where_in(exc.cause, path.parent.resolve())}"
                             f"{root_cause(exc.cause)}")

        with usermodule.imported_or(path, failed) as namespace:
            module, inputs = self._build(namespace, attr, path)
            if p.weights is not None or p.weights_from is not None:
                self._load_weights(ctx, module)
            module.eval()
            yield module, inputs

    def _build(self, namespace: Any, attr: str, path: Path) -> tuple[Any, tuple]:
        import torch

        ref = self.params.model
        target = namespace
        for part in attr.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise StepError(f"{ref}: {path} has no attribute {attr!r}") from None
        if not callable(target):
            raise StepError(f"{ref}: {attr!r} in {path} is {described(target)}, not a callable")
        try:
            result = target()
        except (Exception, SystemExit) as exc:
            raise StepError(f"{ref} raised {type(exc).__name__}: {first_line(exc)}"
                            f"{where_in(exc, path.parent)}{root_cause(exc)}") from None
        shape = "(torch.nn.Module, tuple of example input tensors)"
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise StepError(f"{ref} must return {shape}, got {described(result)}")
        module, inputs = result
        if not isinstance(module, torch.nn.Module):
            raise StepError(f"{ref} must return {shape}; its first item is {described(module)}")
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not (isinstance(inputs, (tuple, list)) and inputs
                and all(isinstance(t, torch.Tensor) for t in inputs)):
            raise StepError(f"{ref} must return {shape}; its second item is {described(inputs)}")
        if len(self.params.input_names) > len(inputs):
            raise StepError(f"input_names has {len(self.params.input_names)} names but {ref} "
                            f"returns {len(inputs)} example input(s)")
        return module, tuple(inputs)

    def _load_weights(self, ctx: StepContext, module: Any) -> None:
        from collections.abc import Mapping

        import torch

        p = self.params
        if p.weights_from is not None:
            upstream = ctx.inputs["weights_from"]
            if upstream.primary is None or not upstream.primary.is_file():
                raise StepError(f"weights_from: {upstream.step} gives no file to load")
            path = upstream.primary
        else:
            assert p.weights is not None  # called when weights or weights_from is set
            path = ctx.path(p.weights)
        if not path.is_file():
            raise StepError(f"weights {path}: no such file")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StepError(f"weights {path} cannot be loaded with weights_only=True (a state_dict "
                            f"of tensors is expected): {type(exc).__name__}: {first_line(exc)}") from None
        if not isinstance(state, Mapping):
            raise StepError(f"weights {path} holds a {type(state).__name__}, not a state_dict")
        try:
            module.load_state_dict(state)
        except Exception as exc:
            raise StepError(f"weights {path} do not fit the module of {self.params.model}: "
                            f"{shortened(' '.join(str(exc).split()))}") from None
        ctx.log(f"loaded {len(state)} tensors from {path.name}")

    def _check_axes(self, inputs: tuple) -> None:
        for tensor, name, axes in zip(inputs, self.params.input_names, input_axes(self.params, len(inputs))):
            for axis in axes or {}:
                if axis >= tensor.dim():
                    raise StepError(f"dynamic_axes: input {name!r} has {tensor.dim()} dimensions, "
                                    f"so it has no axis {axis}")

    def _export(self, ctx: StepContext, module: Any, inputs: tuple, out: Path) -> None:
        import torch

        p = self.params
        common: dict[str, Any] = {"input_names": list(p.input_names) or None,
                  "output_names": list(p.output_names) or None, "opset_version": p.opset}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if p.exporter == "torchscript":
                    axes = {name: dict(mapping) for name, mapping in p.dynamic_axes.items()}
                    with mha_fastpath_off():
                        torch.onnx.export(module, inputs, str(out), dynamo=False, dynamic_axes=axes or None,
                                          do_constant_folding=True, **common)
                else:
                    shapes = input_axes(self.params, len(inputs))
                    torch.onnx.export(module, inputs, str(out), dynamo=True, external_data=False,
                                      verbose=False, optimize=True,
                                      dynamic_shapes=tuple(shapes) if any(shapes) else None, **common)
            except Exception as exc:  # its traceback goes to the log with the StepError's
                raise StepError(f"torch.onnx.export ({p.exporter}) failed for {p.model}: "
                                f"{type(exc).__name__}: {shortened(first_line(exc))}{self._export_hint(exc)}") from None
        for message in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught
                                     if not issubclass(w.category, (DeprecationWarning, FutureWarning))):
            ctx.log(f"export warning: {shortened(message)}")

    def _export_hint(self, exc: Exception) -> str:
        """What to change for a failure of torch.onnx.export that real models met."""
        p = self.params
        if p.exporter != "torchscript":
            return ""
        text = str(exc)
        if isinstance(exc, TypeError) and ("multiple values for argument" in text or ", not Tensor" in text):
            return ("; the TorchScript exporter passes every parameter of forward() positionally, "
                    "defaults included, so a decorated forward() (transformers models) gets one twice "
                    "and a flag becomes a tensor: return from the callable a wrapper module whose "
                    "forward() calls the model with keywords, e.g. self.model(input_ids=input_ids, "
                    "attention_mask=attention_mask, return_dict=False), or use exporter = 'dynamo'")
        if match := UNSUPPORTED.search(text):
            higher = f", or a higher opset (up to {TORCHSCRIPT_MAX_OPSET})" if p.opset < TORCHSCRIPT_MAX_OPSET else ""
            return (f"; the dynamo exporter translates more operators: exporter = 'dynamo' with opset >= "
                    f"{DYNAMO_MIN_OPSET}{higher}, or replace {match.group(1)} in the model")
        if isinstance(exc, (AttributeError, ImportError, NotImplementedError)):
            return " (this torch may no longer ship the TorchScript exporter: try exporter = 'dynamo')"
        return ""

    def _finish(self, ctx: StepContext, out: Path) -> None:
        """Self-contained, reproducible, the opset asked for, and valid for onnx.checker."""
        import onnx

        from optbuild.steps.source import uses_external_data

        p = self.params
        if not out.is_file():
            raise StepError(f"torch.onnx.export ({p.exporter}) wrote no model for {p.model}")
        model = onnx.load(str(out), load_external_data=False)
        stray = sorted(f.name for f in out.parent.iterdir() if f.name != out.name)
        if stray or uses_external_data(model):
            raise StepError(f"the export of {p.model} keeps tensors in external data files {stray} "
                            "(over 2 GiB?): not supported")
        if p.exporter == "dynamo" and (strip_stack_traces(model) | self._name_output_axes(ctx, model)):
            onnx.save(model, str(out))
        self._refuse_unnamed_outputs(model)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if opset != p.opset:
            raise StepError(f"{p.exporter} exported opset {opset} for {p.model}, not the requested {p.opset}")
        try:
            onnx.checker.check_model(str(out))
        except Exception as exc:
            raise StepError(f"the export of {p.model} fails onnx.checker: {first_line(exc)}") from None
        ctx.metrics.update(exporter=p.exporter, opset=opset, nodes=len(model.graph.node),
                           bytes=out.stat().st_size)

    def _refuse_unnamed_outputs(self, model: Any) -> None:
        """With output_names set, the export has exactly those outputs. Both exporters name the
        first outputs and keep the rest under names of their own ('input.400', 'onnx::Shape_736'),
        and dynamo drops names beyond the outputs: extras would flow into every later step and
        into deploy unnoticed (a detector in eval mode returns its feature maps too)."""
        p = self.params
        outputs = list(model.graph.output)
        if not p.output_names or len(outputs) == len(p.output_names):
            return
        if len(outputs) < len(p.output_names):
            raise StepError(f"output_names names {len(p.output_names)} outputs but {p.model}'s forward() "
                            f"returns {len(outputs)} tensors: {p.output_names[len(outputs):]} name nothing; "
                            f"remove them from output_names")
        extras = outputs[len(p.output_names):]
        listed = ", ".join(f"{o.name!r} {shape_text(o)}" for o in extras[:8]) + (", ..." if len(extras) > 8 else "")
        raise StepError(
            f"{p.model}'s forward() returns {len(outputs)} tensors but output_names names "
            f"{len(p.output_names)} {p.output_names}: the export would also have {len(extras)} output(s) "
            f"you did not ask for, {listed}, and pass them to every later step and to deploy. Name every "
            f"output in output_names (in the order forward() returns them), or make forward() return only "
            f"what you want: return from the callable a wrapper module whose forward() returns, e.g., "
            f"self.model(x)[0] (a detector in eval mode often returns its feature maps besides its "
            f"predictions; some have an export switch, as ultralytics' model.model[-1].export = True)")

    def _name_output_axes(self, ctx: StepContext, model: Any) -> bool:
        """dynamo names output dims itself: give them the names of dynamic_axes."""
        changed = False
        for output in model.graph.output:
            dims = output.type.tensor_type.shape.dim
            for axis, symbol in self.params.dynamic_axes.get(output.name, {}).items():
                if axis >= len(dims):
                    raise StepError(f"dynamic_axes: output {output.name!r} has {len(dims)} dimensions, "
                                    f"so it has no axis {axis}")
                if dims[axis].HasField("dim_value"):
                    ctx.log(f"output {output.name!r} axis {axis} came out static ({dims[axis].dim_value})")
                elif dims[axis].dim_param != symbol:
                    dims[axis].dim_param = symbol
                    changed = True
        return changed
