"""The numeric check of a graph rewrite (simplify, opset conversion): the rewritten model
must agree with its input, on the same feeds, in interface, output shapes and values.

A rewrite is trusted only after it agrees with its input model: onnxslim has been seen to
change an output's shape, onnxsim to fail on some graphs, and onnx's version converter to
drop an attribute. Both models run through the backend that runs plain ONNX models
(optbuild.backends.registry), as written: ``reference_runner``. numpy and the runtime are
imported inside the functions.
"""

from __future__ import annotations

import contextlib
import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from optbuild.backends import registry
from optbuild.common.errors import StepError, first_line
from optbuild.common.recipetable import KEYED_WHEN_SET
from optbuild.model.inputdecl import InputDecls, check_declarations
from optbuild.model.samples import describe_tried, feeds
from optbuild.steps.base import StepContext

if typing.TYPE_CHECKING:
    from optbuild.backends.base import Runner
    from optbuild.common.fingerprint import Fingerprint

# The ``atol`` parameter of the checked steps: keyed only when set (it came after caches did).
Atol = Annotated[float | None, KEYED_WHEN_SET]


def atol_field() -> Any:
    """The ``atol`` parameter: the absolute floor of a step's numeric check (see
    optbuild.model.compare.Comparison.failure)."""
    return Field(
        None, ge=0,
        description="Errors up to this absolute size pass whatever their relative size: an output "
                    "passes when its max abs error is within atol or its max relative error within "
                    "tolerance, so an output whose values are all tiny (a sigmoid far from 0.5, at "
                    "1e-5) does not turn float rounding into a failure. Not set: 8 epsilons of the "
                    "output's element type (float32 9.5e-07, float16 0.0078; integers: 0). 0: the "
                    "relative tolerance alone.",
        examples=[1e-6, 0])


def check_rewrite(ctx: StepContext, source: Path, out: Path, label: str, tool: str, *,
                  checks: int, tolerance: float, atol: float | None = None,
                  decls: InputDecls | None = None) -> None:
    """Compare ``out`` (what ``tool`` made of ``label``) with ``source`` on ``checks`` seeded
    feeds (see inputdecl: the recipe's declarations, else the model's own, symbolic dims 1,
    2, 3... in turn); StepError when they differ (beyond ``tolerance`` relative and ``atol``
    absolute: see optbuild.model.compare.Comparison.failure). ``out`` must load in onnxruntime even
    when ``checks`` is 0: a model nothing can open must not be cached. Feeds on which the input
    model itself fails are skipped (and logged), not blamed on the rewrite; when it fails on
    all of them, nothing could be checked: an error that says what was fed and how to
    declare more."""
    with contextlib.ExitStack() as stack:
        rewritten = entered_onnx(stack, out, ctx.host, f"the model {tool} made of {label}")
        if checks == 0:
            ctx.metrics["checks"] = 0
            ctx.log(f"numeric check disabled (check = 0); the result loads in {registry.onnx_backend().label}")
            return
        original = entered_onnx(stack, source, ctx.host, f"the input model of {label}, so the {tool} "
                                     "result cannot be checked (check = 0 skips it)")
        _compare(ctx, original, rewritten, label, tool, checks=checks, tolerance=tolerance, atol=atol,
                 decls=decls)


def _compare(ctx: StepContext, original: Runner, rewritten: Runner, label: str, tool: str, *, checks: int,
             tolerance: float, atol: float | None, decls: InputDecls | None) -> None:
    """check_rewrite's comparisons, on the loaded models."""
    from optbuild.model.compare import compare_outputs

    specs = original.input_specs()
    check_declarations(specs, decls, label)
    names = original.output_names()
    declared = {s.name: list(s.shape) for s in rewritten.output_specs()}
    declared_before = {s.name: list(s.shape) for s in original.output_specs()}
    noted: set[str] = set()
    worst_abs = worst_rel = 0.0
    done, failures = 0, []
    for i in range(checks):
        feed = feeds(specs, decls, i)
        try:
            reference = infer_outputs(original, feed, names)
        except Exception as exc:  # e.g. a symbolic dim that only some sizes fit
            failures.append(f"{shapes(feed)}: {first_line(exc)}")
            continue
        try:
            outputs = infer_outputs(rewritten, feed, names)
        except Exception as exc:
            raise StepError(f"{tool} broke {label}: the input model runs on {shapes(feed)} (check {i}), "
                            f"the result fails: {first_line(exc)}") from None
        result = compare_outputs(names, reference, outputs)
        failure = result.failure(tolerance, atol)
        if failure:
            raise StepError(f"{tool} changed the outputs of {label} (check {i}, seeded inputs "
                            f"{shapes(feed)}): {failure}")
        for name, array in zip(names, outputs):
            shape = declared[name]
            if len(shape) == array.ndim and all(not isinstance(d, int) or d == n
                                                for d, n in zip(shape, array.shape)):
                continue
            if shape != declared_before.get(name):
                raise StepError(f"{tool} made {label} declare output {name!r} as {shape}, "
                                f"but it produces {list(array.shape)}")
            if name not in noted:  # the input model already says so: not the rewrite's doing
                noted.add(name)
                ctx.log(f"warning: {label} declares output {name!r} as {shape}, but it "
                        f"produces {list(array.shape)} (so did its input model)")
        worst_abs, worst_rel = max(worst_abs, result.max_abs), max(worst_rel, result.max_rel)
        done += 1
    if done == 0:
        raise StepError(f"the input model of {label} does not run on the inputs the check made, so the "
                        f"{tool} result cannot be checked: {'; '.join(failures)}. "
                        f"{describe_tried(specs, decls, list(range(checks)))}")
    for failure in failures:
        ctx.log(f"check skipped: the input model itself fails on {failure}")
    ctx.metrics.update(checks=done, max_abs_error=worst_abs, max_rel_error=worst_rel)
    ctx.log(f"{tool} vs input, {done} seeded inputs: max abs error {worst_abs:.3g}, "
            f"relative {worst_rel:.3g}")


def infer_outputs(runner: Runner, feed: dict[str, Any], names: list[str]) -> list[Any]:
    """The outputs ``names`` of ``runner`` run once on ``feed``, in that order (the order
    compare_outputs pairs them in)."""
    ran = runner.infer(feed)
    return [ran[name] for name in names]


def shapes(feed: dict[str, Any]) -> str:
    """"x [1, 3, 32, 32], sr [] = 8000": what one feed holds, for a message."""
    return ", ".join(f"{name} {list(a.shape)}" + (f" = {a.item()}" if a.size == 1 else "")
                     for name, a in feed.items())


def interface(model: Any) -> dict[str, Any]:
    """(name, element type, rank) of the graph inputs and outputs, and the inputs' declared
    dims (initializers listed as inputs are not part of the interface)."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]

    def signature(values: Any) -> list[tuple]:
        return [(v.name, v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim)) for v in values]

    return {"inputs": signature(inputs), "outputs": signature(model.graph.output),
            "input_shapes": {v.name: [d.dim_param or d.dim_value or "?" for d in v.type.tensor_type.shape.dim]
                             for v in inputs}}


def reference_runner(path: Path, host: Fingerprint) -> Runner:
    """A runner (not yet entered) of the ONNX model ``path`` as written, from the backend that
    runs plain ONNX models: with the runtime's own graph optimizations on, the reference would
    be one more rewrite trusting the same (possibly wrong) shape annotations as the step it
    checks, and could agree with its mistakes."""
    return registry.open_onnx(path, host, literal=True)


def entered_onnx(stack: contextlib.ExitStack, path: Path, host: Fingerprint, what: str, *,
                 literal: bool = True) -> Runner:
    """``registry.open_onnx(path)`` entered on ``stack`` (``literal``: as ``reference_runner``);
    StepError "<runtime> cannot load ``what``: <why>" when the model does not load."""
    try:
        return stack.enter_context(registry.open_onnx(path, host, literal=literal))
    except Exception as exc:
        raise StepError(f"{registry.onnx_backend().label} cannot load {what}: {first_line(exc)}") from None


def blame(exc: BaseException, source: Path, feed: dict[str, Any], label: str, what: str,
          described: str, host: Fingerprint) -> StepError:
    """The error for ``what`` (a step's product) failing on ``feed``: its own fault when its
    input model ``source`` runs on the same feed; else the input model's, with ``described``
    (what was fed, how to declare other inputs), since the feeds were a guess."""
    try:
        with reference_runner(source, host) as runner:
            runner.infer(feed)
    except Exception as source_exc:
        return StepError(f"the input model of {label} does not run on the inputs the check made "
                         f"({shapes(feed)}): {first_line(source_exc)}. So {what} could not be checked; "
                         f"it is not at fault. {described}")
    return StepError(f"{what} fails on inputs its input model runs on ({shapes(feed)}): "
                     f"{type(exc).__name__}: {first_line(exc)}")


def input_model(ctx: StepContext, ref: str, what: str) -> tuple[Any, Path, str]:
    """(model, its file, its step) of the ONNX model of ``ref``, the step's input, for a
    step that rewrites it; ``what`` the rewrite ("simplify") for the error messages."""
    import onnx

    artifact = ctx.inputs.get("input")
    if artifact is None or artifact.primary is None or not artifact.primary.is_file():
        raise StepError(f"input {ref!r} provides no ONNX model to {what}")
    source, label = artifact.primary, artifact.step
    try:
        return onnx.load(str(source)), source, label
    except Exception as exc:
        raise StepError(f"cannot read the model of {label} ({source}): {exc}") from None
