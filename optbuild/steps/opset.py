"""kind = "opset": convert a model to another ONNX opset with onnx's version converter.

Many exported models are older than the opset a later step needs (per-channel INT8
quantization needs opset 13). The converter rewrites only the default ("ai.onnx") domain;
custom domains are kept as they are. Like simplify, the result is trusted only after it
passes ``onnx.checker`` (full check), loads in onnxruntime (even with ``check = 0``) and
agrees with its input on seeded random inputs.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from optbuild.common.errors import StepError
from optbuild.common.recipetable import StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs, inputs_field
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext, StepParams
from optbuild.steps.fields import check_field, input_field, tolerance_field
from optbuild.steps.rewrite_check import Atol, atol_field, check_rewrite, input_model, interface

OLDEST = 7  # onnxruntime runs opsets 7 and newer


class OpsetParams(StepParams):
    input: StepRef = input_field("converted: 'step' in this recipe or 'recipe:step'.", "source")
    version: int = Field(ge=OLDEST, examples=[13])
    """The ONNX opset (default domain) to convert to, from 7 up to the newest that the installed
    onnx knows. A model already at this opset is passed on unchanged."""
    check: int = check_field("the result must still pass onnx.checker's full check and load in "
                             "onnxruntime.", most=100)
    tolerance: float = tolerance_field("the converted model", default=1e-4, most=1)
    atol: Atol = atol_field()
    inputs: StepInputs = inputs_field()

    def inputs_read(self) -> InputDecls | None:
        """Only the numeric check reads declarations: none with check = 0."""
        return self.inputs if self.check else None


class Opset(Step[OpsetParams]):
    """Opset conversion by onnx.version_converter, checked against its input on random inputs."""

    Params = OpsetParams
    preload = ONNX_TOOLS
    tools = ("onnx", "onnxruntime")

    def run(self, ctx: StepContext) -> None:
        import onnx

        p = self.params
        model, source, label = input_model(ctx, p.input, "convert")
        newest = onnx.defs.onnx_opset_version()
        if p.version > newest:
            raise StepError(f"version = {p.version}: the installed onnx {onnx.__version__} converts "
                            f"up to opset {newest}")
        before = default_opset(model)
        out = ctx.out_dir / "model.onnx"
        ctx.metrics.update(opset_before=before, opset_after=p.version)
        if before == p.version:
            ctx.log(f"{label} is already at opset {before}: passed on unchanged")
            out.write_bytes(source.read_bytes())
            return
        converted = self._convert(model, label, before)
        if interface(converted) != interface(model):
            raise StepError(f"the version converter changed the inputs or outputs of {label}: "
                            f"{interface(model)} -> {interface(converted)}")
        onnx.save(converted, str(out))
        ctx.log(f"{label}: opset {before} -> {p.version}")
        check_rewrite(ctx, source, out, label, f"the opset {before} -> {p.version} conversion",
                      checks=p.check, tolerance=p.tolerance, atol=p.atol, decls=p.inputs)

    def _convert(self, model: Any, label: str, before: int | None) -> Any:
        import onnx
        from onnx import version_converter

        try:
            converted = version_converter.convert_version(model, self.params.version)
            onnx.checker.check_model(converted, full_check=True)
        except Exception as exc:
            text = str(exc).strip().splitlines()
            raise StepError(f"onnx's version converter cannot take {label} from opset {before} to "
                            f"{self.params.version}: {text[0] if text else type(exc).__name__} (some "
                            "operators have no adapter between those versions; try a nearer "
                            "version, or re-export the model at the opset you need)") from None
        return converted


def default_opset(model: Any) -> int | None:
    """The model's opset of the default ONNX domain ("" or "ai.onnx"), None if it imports none."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None
