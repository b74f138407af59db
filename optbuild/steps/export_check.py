"""The export's check against PyTorch (kind = "export"): onnxruntime vs the module on the
example inputs, then with every dynamic input axis at another size, so a size the exporter
baked into the graph fails the build instead of a later step or a deploy."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.common.errors import StepError, first_line
from optbuild.model.compare import compare_outputs
from optbuild.steps.base import StepContext
from optbuild.steps.export_params import ExportParams
from optbuild.steps.export_torch import output_tensors

if TYPE_CHECKING:
    from optbuild.backends.base import Runner


def input_axes(p: ExportParams, count: int) -> list[dict[int, str] | None]:
    """Per example input (by position): its dynamic axes, if named and given any."""
    names = p.input_names
    return [p.dynamic_axes.get(names[i]) if i < len(names) else None for i in range(count)]


def check_export(ctx: StepContext, p: ExportParams, out: Path, module: Any, inputs: tuple,
                 expected: Any) -> None:
    """The export on the backend that runs ONNX models (onnxruntime) vs PyTorch on the
    example inputs, then with every dynamic axis grown."""
    from optbuild.steps.rewrite_check import entered_onnx

    with ExitStack() as stack:
        runner = entered_onnx(stack, out, ctx.host, f"the export of {p.model}", literal=False)
        _compare(ctx, p, runner, module, inputs, expected)


def _compare(ctx: StepContext, p: ExportParams, runner: Runner, module: Any, inputs: tuple, expected: Any) -> None:
    from optbuild.steps.rewrite_check import infer_outputs

    names = runner.output_names()
    reference = [t.detach().cpu().numpy() for t in output_tensors(expected)]
    try:
        outputs = infer_outputs(runner, _feeds(p, runner, inputs), names)
    except StepError:
        raise
    except Exception as exc:
        raise StepError(f"{runner.label} fails to run the export of {p.model}: {first_line(exc)}") from None
    result = compare_outputs(names, reference, outputs)
    ctx.metrics.update(max_abs_error=result.max_abs, max_rel_error=result.max_rel)
    ctx.log(f"{runner.label} vs PyTorch: max abs error {result.max_abs:.3g}, relative {result.max_rel:.3g}")
    if result.problem or not result.max_rel <= p.tolerance:
        raise StepError(f"the export of {p.model} disagrees with PyTorch on the example inputs: "
                        f"{result.describe(p.tolerance)}")
    grown, sizes = _grown(p, inputs)
    if grown is None:
        return
    try:
        expected = module(*grown)
    except Exception as exc:
        ctx.log(f"dynamic axes not re-checked: PyTorch itself fails at {sizes}: {first_line(exc)}")
        return
    reference = [t.detach().cpu().numpy() for t in output_tensors(expected)]
    hint = _dynamic_hint(p, inputs)
    try:
        outputs = infer_outputs(runner, _feeds(p, runner, grown), names)
    except StepError:
        raise
    except Exception as exc:
        raise StepError(f"the export of {p.model} does not run with dynamic axes at {sizes}: "
                        f"{first_line(exc)}{hint}") from None
    result = compare_outputs(names, reference, outputs)
    ctx.metrics.update(dynamic_check=sizes, dynamic_max_rel_error=result.max_rel)
    if result.problem or not result.max_rel <= p.tolerance:
        raise StepError(f"the export of {p.model} does not follow its dynamic axes: at {sizes}, "
                        f"{result.describe(p.tolerance)}{hint}")


def _dynamic_hint(p: ExportParams, inputs: tuple) -> str:
    """Why an export may not follow its dynamic axes, by exporter."""
    if p.exporter == "torchscript":
        return ("; the trace baked a size into the graph (a Python int taken from a tensor "
                "shape?): compute it with tensor ops, or use exporter = 'dynamo'")
    ones = [f"{name}[{axis}]" for tensor, name, axes
            in zip(inputs, p.input_names, input_axes(p, len(inputs)))
            for axis in sorted(axes or {}) if tensor.shape[axis] == 1]
    if not ones:
        return ""
    return (f"; torch.export takes a dynamic axis of size 1 in the example for the constant 1 "
            f"({', '.join(ones)} is 1): return example inputs of size 2 or more on every dynamic "
            "axis (e.g. a batch of 2)")


def _feeds(p: ExportParams, runner: Runner, inputs: tuple) -> dict[str, Any]:
    graph_inputs = [spec.name for spec in runner.input_specs()]
    arrays = [t.detach().cpu().numpy() for t in inputs]
    if len(graph_inputs) == len(arrays):
        return dict(zip(graph_inputs, arrays))
    named = dict(zip(p.input_names, arrays))
    if set(graph_inputs) <= set(named):  # the exporter dropped unused inputs
        return {name: named[name] for name in graph_inputs}
    raise StepError(f"the export of {p.model} has {len(graph_inputs)} inputs "
                    f"{graph_inputs} for {len(arrays)} example inputs; name them all in input_names")


def _grown(p: ExportParams, inputs: tuple) -> tuple[tuple | None, str]:
    """The example inputs with every dynamic axis at another size (``_other_size``), its
    slices repeated in turn."""
    import torch

    grown, sizes = list(inputs), []
    for i, (name, axes) in enumerate(zip(p.input_names, input_axes(p, len(inputs)))):
        for axis in sorted(axes or {}):
            tensor = grown[i]
            if tensor.shape[axis] == 0:
                continue
            size = _other_size(p, name, axis, tensor.shape[axis])
            grown[i] = tensor.index_select(axis, torch.arange(size) % tensor.shape[axis])
            sizes.append(f"{name}[{axis}] = {size}")
    return (tuple(grown), ", ".join(sizes)) if sizes else (None, "")


def _other_size(p: ExportParams, name: str, axis: int, current: int) -> int:
    """A size of ``name``'s dynamic ``axis`` other than the example's: the declared max,
    else the declared min, else one larger (a guess the model may not take)."""
    decl = (p.inputs or {}).get(name)
    if decl is not None and decl.shape is not None and axis < len(decl.shape):
        dim = decl.shape[axis]
        declared = dim if isinstance(dim, list) else [dim]
        for size in (declared[-1], declared[0]):
            if size > 0 and size != current:
                return size
    return current + 1
