"""Declared model inputs: what the checks feed a model, and the mistakes caught early."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from optbuild.backends.base import TensorSpec
from optbuild.common.errors import StepError
from optbuild.model.inputdecl import InputDecl, check_declarations, merged, profile_shapes
from optbuild.model.samples import describe_tried, feeds

IMAGE = TensorSpec("x", "float32", ("batch", 3, "?", "?"))
RATE = TensorSpec("sr", "int64", ())


def decl(**fields) -> InputDecl:
    return InputDecl.model_validate(fields)


def test_undeclared_symbolic_dims_take_1_2_3_in_turn():
    shapes = [feeds([IMAGE], None, check)["x"].shape for check in range(4)]
    assert shapes == [(1, 3, 1, 1), (2, 3, 2, 2), (3, 3, 3, 3), (1, 3, 1, 1)]


def test_declared_ranges_are_tried_at_opt_min_max_or_min_max_mid():
    decls = {"x": decl(shape=[[1, 4, 8], 3, 48, [32, 320]])}
    shapes = [feeds([IMAGE], decls, check)["x"].shape for check in range(3)]
    assert shapes == [(4, 3, 48, 32), (1, 3, 48, 320), (8, 3, 48, 176)]


def test_a_scalar_with_allowed_values_takes_each_in_turn():
    decls = {"sr": decl(values=[8000, 16000])}
    got = [int(feeds([RATE], decls, check)["sr"]) for check in range(3)]
    assert got == [8000, 16000, 8000]
    assert feeds([RATE], decls, 0)["sr"].dtype == np.int64 and feeds([RATE], decls, 0)["sr"].shape == ()


def test_values_and_ranges_bound_what_is_drawn():
    tokens = TensorSpec("ids", "int64", (1, 64))
    drawn = feeds([tokens, IMAGE], {"ids": decl(values=[3, 5]), "x": decl(range=[0.0, 1.0])}, 0)
    assert set(np.unique(drawn["ids"])) <= {3, 5}
    assert drawn["x"].min() >= 0.0 and drawn["x"].max() <= 1.0
    ints = feeds([tokens], {"ids": decl(range=[10, 12])}, 0)["ids"]
    assert set(np.unique(ints)) == {10, 11, 12}, "integer ranges include both ends"


def test_feeds_are_seeded():
    a, b = feeds([IMAGE], None, 1), feeds([IMAGE], None, 1)
    np.testing.assert_array_equal(a["x"], b["x"])


def test_a_step_entry_replaces_the_recipe_entry_of_the_same_input():
    recipe = {"x": decl(shape=[1, 3, 32, 32]), "sr": decl(values=[8000])}
    step = {"sr": decl(values=[16000])}
    assert merged(recipe, step) == {"x": recipe["x"], "sr": step["sr"]}
    assert merged(None, None) is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"shape": [1, [4, 2]]}, "min <= opt <= max"),
    ({"shape": [[1, 2, 3, 4]]}, r"\[min, max\] or \[min, opt, max\]"),
    ({"range": [0, 1], "values": [1]}, "either range or values"),
    ({"range": [2, 1]}, "is above high"),
    ({"values": []}, "at least one value"),
    ({"shap": [1]}, "Extra inputs are not permitted"),
])
def test_malformed_declarations_are_refused_at_load(fields, message):
    with pytest.raises(ValidationError, match=message):
        decl(**fields)


@pytest.mark.parametrize(("decls", "message"), [
    ({"X": decl(shape=[1])}, r"inputs.X: m has no input 'X'; did you mean 'x'\? \(its inputs: x, sr\)"),
    ({"x": decl(shape=[1, 3, 8])}, r"rank 3, m declares float32 \[batch, 3, \?, \?\] \(rank 4\)"),
    ({"x": decl(shape=[1, 4, 8, 8])}, "dim 1 is fixed at 3 in m, the declaration gives 4"),
    ({"sr": decl(dtype="int32")}, "dtype int32 declared, m takes int64"),
])
def test_declarations_that_contradict_the_model_say_how(decls, message):
    image = TensorSpec("x", "float32", ("batch", 3, None, None))
    with pytest.raises(StepError, match=message):
        check_declarations([image, RATE], decls, "m")


def test_a_failed_check_says_what_it_fed_and_how_to_declare_more():
    text = describe_tried([IMAGE, RATE], {"sr": decl(values=[8000, 16000])}, [0, 1, 2])
    assert "x float32 [1, 3, 1, 1] / [2, 3, 2, 2] / [3, 3, 3, 3] N(0, 1) (the model's own)" in text
    assert "sr int64 [] values [8000, 16000] (declared)" in text
    assert "[inputs.x] shape = [...]" in text


def test_a_tensorrt_profile_comes_from_declared_ranges():
    decls = {"x": decl(shape=[[1, 4, 8], 3, 48, [32, 320]])}
    assert profile_shapes([IMAGE, RATE], decls) == {"x": ([1, 3, 48, 32], [4, 3, 48, 320], [8, 3, 48, 320])}
    assert profile_shapes([IMAGE], None) is None, "a dynamic input without a declaration needs profiles"
