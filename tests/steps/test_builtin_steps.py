"""The built-in steps on real models: onnx sources, export errors, import tracking."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugins.projects import REPO

from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint
from optbuild.common.pyimports import local_imports
from optbuild.steps.base import StepContext
from optbuild.steps.export import Export, ExportParams
from optbuild.steps.source import OnnxSource, OnnxSourceParams


def context(tmp_path: Path, base: Path) -> StepContext:
    out = tmp_path / "out"
    out.mkdir()
    return StepContext(step_id="r:s", base_dir=base, project_root=base, out_dir=out, inputs={},
                       host=Fingerprint())


def tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_onnx_source_copies_a_valid_model(tmp_path):
    tiny_onnx(tmp_path / "m.onnx")
    ctx = context(tmp_path, tmp_path)
    OnnxSource(OnnxSourceParams(path="m.onnx"), tmp_path, tmp_path).run(ctx)
    assert (ctx.out_dir / "model.onnx").read_bytes() == (tmp_path / "m.onnx").read_bytes()
    assert ctx.metrics["nodes"] == 1


def test_a_corrupt_onnx_file_fails_with_its_name(tmp_path):
    tiny_onnx(tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    (tmp_path / "m.onnx").write_bytes(data[: len(data) // 2] + b"\xff\xfe garbage")
    with pytest.raises(StepError, match=r"m\.onnx"):
        OnnxSource(OnnxSourceParams(path="m.onnx"), tmp_path, tmp_path).run(context(tmp_path, tmp_path))


def test_export_key_covers_locally_imported_modules():
    models = REPO / "recipes" / "models"
    step = Export(ExportParams(model="models/cnn.py:build"), REPO / "recipes", REPO)
    assert models / "blocks.py" in step.key_files()
    assert local_imports(models / "transformer.py", REPO) == [models / "blocks.py"]


def test_local_imports_follows_packages_and_relative_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .layers import Block\n")
    (tmp_path / "pkg" / "layers.py").write_text("import torch\nfrom . import util\n")
    (tmp_path / "pkg" / "util.py").write_text("X = 1\n")
    (tmp_path / "entry.py").write_text("import os\nfrom pkg import layers\n")
    found = {p.relative_to(tmp_path).as_posix() for p in local_imports(tmp_path / "entry.py", tmp_path)}
    assert found == {"pkg/__init__.py", "pkg/layers.py", "pkg/util.py"}


def test_export_reports_a_callable_that_raises(tmp_path):
    (tmp_path / "bad.py").write_text("def build():\n    raise RuntimeError('no weights here')\n")
    step = Export(ExportParams(model="bad.py:build"), tmp_path, tmp_path)
    with pytest.raises(StepError, match="bad.py:build raised RuntimeError: no weights here"):
        step.run(context(tmp_path, tmp_path))


def test_export_rejects_dynamic_axes_for_unknown_names():
    with pytest.raises(ValueError, match="not in input_names"):
        ExportParams(model="m.py:build", input_names=["x"], dynamic_axes={"y": {0: "batch"}})


def test_export_dynamic_batch_runs_at_other_sizes(tmp_path):
    import numpy as np

    from optbuild.backends.onnxruntime.loader import session

    step = Export(ExportParams.model_validate({
        "model": "models/cnn.py:build", "input_names": ["image"], "output_names": ["logits"],
        "dynamic_axes": {"image": {"0": "batch"}, "logits": {"0": "batch"}}}), REPO / "recipes", REPO)
    ctx = context(tmp_path, REPO / "recipes")
    step.run(ctx)
    for batch in (1, 3):
        (logits,) = session(ctx.out_dir / "model.onnx").run(
            None, {"image": np.zeros((batch, 3, 64, 64), np.float32)})
        assert logits.shape == (batch, 10)
    assert ctx.metrics["max_rel_error"] < 1e-4
