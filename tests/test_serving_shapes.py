"""Which dims a measurement may not guess (optbuild.model.samples.undeclared_dims): the batch
is axis 0 and any dim named as some input's axis 0; every other open dim (a sequence length, an
image's height or width) needs a declared size, and a declared input without a shape has none."""

from __future__ import annotations

import pytest

from optbuild.backends.base import TensorSpec
from optbuild.model.inputdecl import InputDecl
from optbuild.model.samples import measured_specs, random_samples, undeclared_dims

pytest.importorskip("numpy")

TOKENS = TensorSpec("tokens", "int64", ("batch", "seq"))
MASK = TensorSpec("mask", "int64", ("batch", "seq"))
IMAGE = TensorSpec("image", "float32", (None, 3, "height", None))
LINES = TensorSpec("lines", "float32", ("n", 64, None))  # axis 0 by position, whatever its name
STATE = TensorSpec("state", "float32", (2, "batch", 128))  # the batch by name, not at axis 0


def _open(specs, decls=None):
    return [(spec.name, axis) for spec, axis in undeclared_dims(specs, decls)]


def test_every_open_dim_but_the_batch_is_undeclared():
    assert _open([TOKENS, MASK]) == [("tokens", 1), ("mask", 1)]
    assert _open([IMAGE]) == [("image", 2), ("image", 3)]  # named or unknown alike
    assert _open([LINES]) == [("lines", 2)]


def test_a_dim_named_as_an_axis_0_is_the_batch_wherever_it_is():
    assert _open([TOKENS, STATE]) == [("tokens", 1)]
    assert _open([STATE]) == [("state", 1)]  # alone, nothing names it the batch


def test_a_declared_shape_sizes_its_input_and_a_shapeless_declaration_does_not():
    sized = {"tokens": InputDecl(shape=[1, 128])}
    assert _open([TOKENS, IMAGE], sized) == [("image", 2), ("image", 3)]
    assert _open([TOKENS], {"tokens": InputDecl(range=(0, 5))}) == [("tokens", 1)]


def test_fixed_models_have_nothing_open():
    assert _open([TensorSpec("x", "float32", (1, 3, 224, 224))]) == []


def test_undeclared_the_batch_gets_its_size_everywhere_it_is_named():
    tokens, state = measured_specs([TOKENS, STATE], None, batch=4, other=16)
    assert tokens.shape == (4, 16) and state.shape == (2, 4, 128)


def test_a_shapeless_declaration_keeps_dynamic_size_for_its_open_dims():
    """The declaration gives values, not sizes: its open dims get dynamic_size, as undeclared ones."""
    samples = random_samples([TOKENS], 3, seed=0, dynamic_size=5, decls={"tokens": InputDecl(values=[3])})
    assert [feed["tokens"].shape for feed in samples.feeds] == [(5, 5)] * 3
    assert all((feed["tokens"] == 3).all() for feed in samples.feeds)


def test_a_dim_named_like_a_declared_one_takes_its_size():
    decls = {"tokens": InputDecl(shape=[1, [16, 64, 128]])}
    assert _open([TOKENS, MASK], decls) == []
    tokens, mask, image = measured_specs([TOKENS, MASK, IMAGE], decls, batch=2, other=7)
    assert tokens.shape == (1, 64)  # declared: the range's opt
    assert mask.shape == (1, 64)  # both dims named like tokens': their declared sizes
    assert image.shape == (2, 3, 7, 7)
