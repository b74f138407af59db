"""kind = "simplify": graph simplification by onnxsim (or onnxslim), numerically checked.

A rewrite is trusted only after it agrees with its input model: the same input and output
names, types and declared input shapes, and on ``check`` seeded random inputs (symbolic
dims set to 1, 2, 3, ... in turn) the same output shapes and values within ``tolerance``.
onnxslim has been seen to change an output's shape, onnxsim to fail on some graphs.

Only the chosen backend's version enters the key (``tool_names``). onnxsim 0.8 imports
torch when it loads (~3.7 s); it is imported here, inside run, and nowhere else.
"""

from __future__ import annotations

import importlib
import inspect
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from optbuild.errors import StepError
from optbuild.steps.base import Step, StepContext, StepParams, StepRef

CHECK_SIZES = (1, 2, 3)  # values for symbolic dims, one per check, in turn


class SimplifyParams(StepParams):
    input: StepRef = Field(
        description="The step whose ONNX model is simplified: 'step' in this recipe or "
                    "'recipe:step'.",
        examples=["export"])
    backend: Literal["onnxsim", "onnxslim"] = Field(
        "onnxsim",
        description="The simplifier: 'onnxsim' (onnx-simplifier; imports torch, slow to start) or "
                    "'onnxslim'. Only the chosen one's version enters the key.",
        examples=["onnxslim"])
    check: int = Field(
        3, ge=0, le=100,
        description="How many seeded random-input comparisons with the input model to run (0 to "
                    "100); symbolic dims are set to 1, 2, 3, 1... in turn. 0 skips the numeric check "
                    "(names, types and input shapes are still compared).",
        examples=[0])
    tolerance: float = Field(
        1e-4, gt=0, le=1,
        description="Largest accepted error of the simplified model against its input, relative "
                    "to the largest magnitude of each of the input model's outputs (0 < tolerance <= 1).",
        examples=[1e-3])


class Simplify(Step):
    """Graph simplification by onnxsim or onnxslim, checked against its input on random inputs."""

    kind = "simplify"
    Params = SimplifyParams
    tools = ("onnx", "onnxruntime")  # + the chosen backend: see tool_names

    def tool_names(self) -> tuple[str, ...]:
        return (*self.tools, self.params.backend)

    def run(self, ctx: StepContext) -> None:
        import onnx

        from optbuild.steps.source import uses_external_data

        artifact = ctx.inputs.get("input")
        if artifact is None or artifact.primary is None or not artifact.primary.is_file():
            raise StepError(f"input {self.params.input!r} provides no ONNX model to simplify")
        source, label = artifact.primary, artifact.step
        try:
            model = onnx.load(str(source))
        except Exception as exc:
            raise StepError(f"cannot read the model of {label} ({source}): {exc}") from None
        before, declared = len(model.graph.node), interface(model)  # before a backend can touch it
        started = time.perf_counter()
        backend = self._import_backend()
        imported = time.perf_counter()
        simplified = self._simplify(backend, model, label)
        elapsed = time.perf_counter() - imported
        if uses_external_data(simplified) or simplified.ByteSize() > 2**31 - 1:
            raise StepError(f"the simplified {label} does not fit one ONNX file (over 2 GiB): not supported")
        try:
            onnx.checker.check_model(simplified)
        except Exception as exc:
            raise StepError(f"{self.params.backend} produced a model that fails onnx.checker "
                            f"({label}): {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}") from None
        self._same_interface(declared, simplified, label)
        out = ctx.out_dir / "model.onnx"
        onnx.save(simplified, str(out))
        after = len(simplified.graph.node)
        ctx.metrics.update(backend=self.params.backend, nodes_before=before, nodes_after=after,
                           import_s=round(imported - started, 3), simplify_s=round(elapsed, 3))
        ctx.log(f"{self.params.backend}: {before} -> {after} nodes in {elapsed:.2f} s "
                f"(+{imported - started:.2f} s to import it)")
        self._check(ctx, source, out, label)

    def _import_backend(self) -> Any:
        name = self.params.backend
        try:
            return importlib.import_module(name)  # onnxsim: ~3.7 s, it loads torch
        except ImportError as exc:
            raise StepError(f"simplify backend {name!r} is not installed here "
                            f"(pip install {name}): {exc}") from None

    def _simplify(self, module: Any, model: Any, label: str) -> Any:
        backend = self.params.backend
        try:
            if backend == "onnxsim":
                options: dict[str, Any] = {"check_n": 0}  # the check below covers dynamic shapes
                if "certify" in inspect.signature(module.simplify).parameters:
                    # otherwise it runs when z3-solver happens to be installed and records its
                    # verdict in the model: output bytes that no key knows about
                    options["certify"] = False
                simplified, ok = module.simplify(model, **options)
                if not ok:
                    raise RuntimeError("onnxsim reports that its result differs from its input")
            else:
                simplified = module.slim(model)
        except Exception as exc:
            text = str(exc).strip()
            raise StepError(f"{backend} failed on {label}: {type(exc).__name__}: "
                            f"{text.splitlines()[0] if text else ''}") from None
        if simplified is None or not hasattr(simplified, "graph"):
            raise StepError(f"{backend} returned no model for {label}")
        return simplified

    def _same_interface(self, before: dict[str, Any], simplified: Any, label: str) -> None:
        """Names, element types and ranks of inputs and outputs, and the declared input
        shapes, may not change."""
        after, backend = interface(simplified), self.params.backend
        for what in ("inputs", "outputs"):
            if before[what] != after[what]:
                raise StepError(f"{backend} changed the {what} of {label}: (name, type, rank) "
                                f"{before[what]} -> {after[what]}")
        if before["input_shapes"] != after["input_shapes"]:
            raise StepError(f"{backend} changed the declared input shapes of {label}: "
                            f"{before['input_shapes']} -> {after['input_shapes']}")

    def _check(self, ctx: StepContext, source: Path, out: Path, label: str) -> None:
        from optbuild.steps.export import compare_outputs

        p = self.params
        if p.check == 0:
            ctx.metrics["checks"] = 0
            ctx.log("numeric check disabled (check = 0)")
            return
        try:
            original = literal_session(source)
        except Exception as exc:
            raise StepError(f"onnxruntime cannot load the input model of {label}, so the "
                            f"{p.backend} result cannot be checked (check = 0 skips it): {exc}") from None
        try:
            rewritten = literal_session(out)
        except Exception as exc:
            raise StepError(f"onnxruntime cannot load the model {p.backend} made of {label}: {exc}") from None
        names = [o.name for o in original.get_outputs()]
        declared = {o.name: o.shape for o in rewritten.get_outputs()}
        declared_before = {o.name: o.shape for o in original.get_outputs()}
        noted: set[str] = set()
        worst_abs = worst_rel = 0.0
        done, failures = 0, []
        for i in range(p.check):
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
                raise StepError(f"{p.backend} broke {label}: the input model runs on random inputs "
                                f"with symbolic dims = {size}, the simplified one fails: "
                                f"{str(exc).strip().splitlines()[0]}") from None
            result = compare_outputs(names, reference, outputs)
            if result.problem or not result.max_rel <= p.tolerance:
                raise StepError(f"{p.backend} changed the outputs of {label} (random inputs, seed {i}, "
                                f"symbolic dims = {size}): {result.describe(p.tolerance)}")
            for name, array in zip(names, outputs):
                shape = declared[name]
                if len(shape) == array.ndim and all(not isinstance(d, int) or d == n
                                                    for d, n in zip(shape, array.shape)):
                    continue
                if shape != declared_before.get(name):
                    raise StepError(f"{p.backend} made {label} declare output {name!r} as {shape}, "
                                    f"but it produces {list(array.shape)}")
                if name not in noted:  # the input model already says so: not the rewrite's doing
                    noted.add(name)
                    ctx.log(f"warning: {label} declares output {name!r} as {shape}, but it "
                            f"produces {list(array.shape)} (so did its input model)")
            worst_abs, worst_rel = max(worst_abs, result.max_abs), max(worst_rel, result.max_rel)
            done += 1
        if done == 0:
            raise StepError(f"the input model of {label} does not run on random inputs, so the "
                            f"{p.backend} result cannot be checked (check = 0 skips it): {'; '.join(failures)}")
        for failure in failures:
            ctx.log(f"check skipped: the input model itself fails with symbolic {failure}")
        ctx.metrics.update(checks=done, max_abs_error=worst_abs, max_rel_error=worst_rel)
        ctx.log(f"{p.backend} vs input, {done} random inputs: max abs error {worst_abs:.3g}, "
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
