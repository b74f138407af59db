"""Helpers for the step tests: contexts, artifacts, tiny ONNX models, and the example models
exported once per test session (torch exports cost seconds; several test files reuse them)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

from optbuild.common.fingerprint import Fingerprint
from optbuild.steps.base import Artifact, StepContext

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
MODELS = RECIPES / "models"
INPUT_NAME = {"cnn": "image", "transformer": "tokens"}


def context(out_dir: Path, base: Path, root: Path | None = None,
            inputs: dict[str, Artifact] | None = None, step_id: str = "r:step") -> StepContext:
    out_dir.mkdir(parents=True, exist_ok=True)
    return StepContext(step_id=step_id, base_dir=base, project_root=root or base, out_dir=out_dir,
                       inputs=inputs or {}, host=Fingerprint())


def artifact(model: Path, step: str = "r:export") -> Artifact:
    return Artifact(step=step, dir=model.parent, files={model.name: model}, primary=model)


def recipe_step(recipe: str, step: str) -> dict[str, Any]:
    """The parameters of ``[steps.<step>]`` of recipes/<recipe>.toml, as written there or
    in its template (without ``kind``)."""
    from optbuild.project import template
    from optbuild.project.tomlsource import load_toml

    problems: list = []
    table = template.instantiate(load_toml(RECIPES / f"{recipe}.toml"), problems)[0]["steps"][step]
    assert not problems, problems
    return {k: v for k, v in table.items() if k != "kind"}


def build_example(name: str) -> tuple[Any, tuple]:
    """Run recipes/models/<name>.py's build() as the export step would (its directory on
    sys.path), returning (module in eval mode, example inputs)."""
    sys.path.insert(0, str(MODELS))
    try:
        module, inputs = runpy.run_path(str(MODELS / f"{name}.py"))["build"]()
    finally:
        sys.path.remove(str(MODELS))
        sys.modules.pop("blocks", None)
    return module.eval(), inputs


_EXPORTED: dict[tuple[str, str], StepContext] = {}


def exported_example(name: str, tmp_path_factory: Any, exporter: str = "torchscript") -> StepContext:
    """The context of a finished export of example ``name`` with its recipe's parameters
    (cached for the session: the model file is at ctx.out_dir / "model.onnx")."""
    from optbuild.steps.export import Export, ExportParams

    key = (name, exporter)
    if key not in _EXPORTED:
        params = recipe_step(name, "export")
        if exporter != "torchscript":
            params.update(exporter=exporter, opset=18)
        step = Export(ExportParams.model_validate(params), RECIPES, REPO)
        ctx = context(tmp_path_factory.mktemp(f"export-{name}-{exporter}"), RECIPES, REPO,
                      step_id=f"{name}:export")
        step.run(ctx)
        _EXPORTED[key] = ctx
    return _EXPORTED[key]


def tiny_onnx(path: Path, dims: list = ["batch", 4], opset: int = 17) -> Path:  # noqa: B006
    """y = Relu(x) with a dynamic first dim."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def run_step(step_cls, params: dict, inputs: dict[str, Path], base: Path, name: str = "step"):
    """Validate ``params`` and run the step in this process; returns (step, ctx)."""
    step = step_cls(step_cls.Params.model_validate(params), base, base)
    out = base / "out" / name
    out.mkdir(parents=True)
    artifacts = {field: Artifact(step=f"t:{field}-of-{name}", dir=p.parent, files={p.name: p}, primary=p)
                 for field, p in inputs.items()}
    ctx = StepContext(step_id=f"t:{name}", base_dir=base, project_root=base, out_dir=out,
                      inputs=artifacts, host=Fingerprint())
    step.run(ctx)
    return step, ctx


def calibrate(tmp_path: Path, model: Path, name: str = "calibrate", **params) -> dict:
    """Run a calibrate step over ``model``; its calibration table."""
    from optbuild.steps.calibrate import Calibrate

    _, ctx = run_step(Calibrate, {"input": "model", **params}, {"input": model}, tmp_path, name)
    return json.loads((ctx.out_dir / "calibration.json").read_text())
