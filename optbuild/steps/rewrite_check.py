"""The numeric check of a graph rewrite (simplify, opset conversion): the rewritten model
must agree with its input, on the same feeds, in interface, output shapes and values.

A rewrite is trusted only after it agrees with its input model: onnxslim has been seen to
change an output's shape, onnxsim to fail on some graphs, and onnx's version converter to
drop an attribute. numpy and onnxruntime are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optbuild.errors import StepError
from optbuild.steps.base import StepContext

CHECK_SIZES = (1, 2, 3)  # values for symbolic dims, one per check, in turn


def check_rewrite(ctx: StepContext, source: Path, out: Path, label: str, tool: str, *,
                  checks: int, tolerance: float) -> None:
    """Compare ``out`` (what ``tool`` made of ``label``) with ``source`` on ``checks`` seeded
    random inputs, symbolic dims set to 1, 2, 3... in turn; StepError when they differ.
    Sizes on which the input model itself fails are skipped (and logged), not blamed on
    the rewrite; when it fails on all of them, nothing could be checked: an error too."""
    from optbuild.steps.export import compare_outputs

    if checks == 0:
        ctx.metrics["checks"] = 0
        ctx.log("numeric check disabled (check = 0)")
        return
    try:
        original = literal_session(source)
    except Exception as exc:
        raise StepError(f"onnxruntime cannot load the input model of {label}, so the "
                        f"{tool} result cannot be checked (check = 0 skips it): {exc}") from None
    try:
        rewritten = literal_session(out)
    except Exception as exc:
        raise StepError(f"onnxruntime cannot load the model {tool} made of {label}: {exc}") from None
    names = [o.name for o in original.get_outputs()]
    declared = {o.name: o.shape for o in rewritten.get_outputs()}
    declared_before = {o.name: o.shape for o in original.get_outputs()}
    noted: set[str] = set()
    worst_abs = worst_rel = 0.0
    done, failures = 0, []
    for i in range(checks):
        size = CHECK_SIZES[i % len(CHECK_SIZES)]
        feeds = random_feeds(original, seed=i, dynamic_size=size)
        try:
            reference = original.run(None, feeds)
        except Exception as exc:  # e.g. a symbolic dim that only some sizes fit
            failures.append(f"dims = {size}: {str(exc).strip().splitlines()[0]}")
            continue
        try:
            outputs = rewritten.run(None, feeds)
        except Exception as exc:
            raise StepError(f"{tool} broke {label}: the input model runs on random inputs "
                            f"with symbolic dims = {size}, the simplified one fails: "
                            f"{str(exc).strip().splitlines()[0]}") from None
        result = compare_outputs(names, reference, outputs)
        if result.problem or not result.max_rel <= tolerance:
            raise StepError(f"{tool} changed the outputs of {label} (random inputs, seed {i}, "
                            f"symbolic dims = {size}): {result.describe(tolerance)}")
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
        raise StepError(f"the input model of {label} does not run on random inputs, so the "
                        f"{tool} result cannot be checked (check = 0 skips it): {'; '.join(failures)}")
    for failure in failures:
        ctx.log(f"check skipped: the input model itself fails with symbolic {failure}")
    ctx.metrics.update(checks=done, max_abs_error=worst_abs, max_rel_error=worst_rel)
    ctx.log(f"{tool} vs input, {done} random inputs: max abs error {worst_abs:.3g}, "
            f"relative {worst_rel:.3g}")


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


def literal_session(path: Path) -> Any:
    """A CPU onnxruntime session that runs the graph as written: with ORT's own graph
    optimizations on, the reference would be one more rewrite trusting the same (possibly
    wrong) shape annotations as the simplifier, and could agree with its mistakes."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def random_feeds(session: Any, seed: int, dynamic_size: int) -> dict[str, Any]:
    """Seeded inputs of the session's declared shapes; symbolic dims get ``dynamic_size``.
    Integer inputs (token ids, indices) are drawn from [0, 8), floats from N(0, 1)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    kinds = {"float": np.float32, "float16": np.float16, "double": np.float64, "int64": np.int64,
             "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else dynamic_size for d in arg.shape]
        type_name = arg.type.removeprefix("tensor(").removesuffix(")")
        dtype = kinds.get(type_name)
        if dtype is None:
            raise StepError(f"cannot make random values for input {arg.name!r} of type {arg.type}; "
                            "set check = 0 to skip the numeric check")
        if dtype is np.bool_:
            feeds[arg.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[arg.name] = rng.integers(0, 8, size=shape).astype(dtype)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
