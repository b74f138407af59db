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
from typing import Any, Literal

from pydantic import Field

from optbuild.errors import StepError
from optbuild.steps.base import Step, StepContext, StepParams, StepRef
from optbuild.steps.inputdecl import InputDecls, inputs_field
from optbuild.steps.rewrite_check import check_rewrite, interface


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
    inputs: InputDecls | None = inputs_field()


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
        check_rewrite(ctx, source, out, label, self.params.backend,
                      checks=self.params.check, tolerance=self.params.tolerance, decls=self.params.inputs)

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
