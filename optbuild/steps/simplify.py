"""kind = "simplify": graph simplification by onnxsim (or onnxslim), numerically checked.

A rewrite is trusted only after it agrees with its input on seeded random inputs:
onnxslim has been seen to change an output's shape, onnxsim to fail on some graphs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from optbuild.errors import StepError
from optbuild.steps.base import Step, StepContext, StepParams, StepRef


class SimplifyParams(StepParams):
    input: StepRef
    backend: Literal["onnxsim", "onnxslim"] = "onnxsim"
    check: int = Field(3, ge=0, description="random-input comparisons with the input model")
    tolerance: float = Field(1e-4, gt=0, description="max error relative to the input's outputs")


class Simplify(Step):
    kind = "simplify"
    Params = SimplifyParams

    def tool_names(self) -> tuple[str, ...]:
        return ("onnx", "onnxruntime", self.params.backend)

    def run(self, ctx: StepContext) -> None:
        import onnx

        source = ctx.inputs["input"].primary
        model = onnx.load(str(source))
        before = len(model.graph.node)
        try:
            if self.params.backend == "onnxsim":
                import onnxsim

                simplified, _ = onnxsim.simplify(model, check_n=0)
            else:
                import onnxslim

                simplified = onnxslim.slim(model)
        except Exception as exc:
            raise StepError(f"{self.params.backend} failed on {ctx.inputs['input'].step}: "
                            f"{type(exc).__name__}: {exc}") from exc
        out = ctx.out_dir / "model.onnx"
        onnx.save(simplified, str(out))
        ctx.metrics.update(nodes_before=before, nodes_after=len(simplified.graph.node))
        ctx.log(f"{self.params.backend}: {before} -> {len(simplified.graph.node)} nodes")
        self._check(ctx, source, out)

    def _check(self, ctx: StepContext, source, out) -> None:  # noqa: ANN001
        from optbuild.steps import onnxcheck

        worst = 0.0
        for seed in range(self.params.check):
            feeds = onnxcheck.random_feeds(source, seed)
            _, rel = onnxcheck.max_errors(onnxcheck.run(source, feeds), onnxcheck.run(out, feeds))
            worst = max(worst, rel)
        ctx.metrics["max_rel_error"] = worst
        if not worst <= self.params.tolerance:
            raise StepError(f"{self.params.backend} changed the model's outputs: max relative error "
                            f"{worst:.3g} > tolerance {self.params.tolerance:g} (or output shapes differ)")
