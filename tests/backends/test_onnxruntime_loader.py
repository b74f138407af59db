"""The loader is the one way optbuild opens an onnxruntime session: from a file or a model's
bytes, at one of onnxruntime's graph optimization levels; no other module of optbuild calls
``InferenceSession``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from plugins.models import make_convnet

from optbuild.backends.onnxruntime.loader import LEVELS, SESSION_LEVELS, session

OPTBUILD = Path(__file__).parents[2] / "optbuild"


def test_a_session_opens_from_a_file_or_bytes_alike_at_every_level(tmp_path):
    path = make_convnet(tmp_path / "m.onnx")
    model = onnx.load(str(path))
    sess = session(path, level="disable")
    name = sess.get_inputs()[0].name
    shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape]
    feed = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    expected = sess.run(None, feed)[0]
    for level in LEVELS:
        got = session(model.SerializeToString(), level=level).run(None, feed)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_every_level_names_a_graph_optimization_level_of_onnxruntime():
    assert list(SESSION_LEVELS) == list(LEVELS)
    assert all(hasattr(ort.GraphOptimizationLevel, name) for name in SESSION_LEVELS.values())


def test_no_module_but_the_loader_opens_a_session_itself():
    loader = OPTBUILD / "backends/onnxruntime/loader.py"
    direct = [str(p.relative_to(OPTBUILD)) for p in OPTBUILD.rglob("*.py")
              if p != loader and re.search(r"\bInferenceSession\(", p.read_text(encoding="utf-8"))]
    assert direct == []
