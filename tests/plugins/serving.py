"""A BERT in miniature for the tests of what benchmarks measure: token ids (and a mask) whose
sequence length the model leaves open, [batch, seq], as a real encoder's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from plugins.models import OPSET, save


def tokens_model(path: Path, mask: bool = False) -> Path:
    """tokens: int64 [batch, seq] (and mask: int64 [batch, seq], multiplying each token's
    embedding) -> mean embedding -> y: float32 [batch, 3]."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["emb", "tokens"], ["e"])]
    inputs = [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])]
    initializers = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "emb"),
                    numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")]
    pooled = "e"
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"]))
        initializers.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "last"))
        nodes += [helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Unsqueeze", ["mf", "last"], ["mu"]),
                  helper.make_node("Mul", ["e", "mu"], ["masked"])]
        pooled = "masked"
    nodes += [helper.make_node("ReduceMean", [pooled], ["m"], axes=[1], keepdims=0),
              helper.make_node("MatMul", ["m", "w"], ["y"])]
    graph = helper.make_graph(nodes, "tokens", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], initializers)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)
