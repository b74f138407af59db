"""Matrix steps (#12 item 1): one [steps.NAME] table with `matrix = {AXIS = [values]}` is one
step per combination, named NAME[v1,v2], with ${matrix.AXIS} in its parameters."""

from __future__ import annotations

import json

import pytest
from plugins.projects import CONFIG, ProjectDir

from optbuild.recipe import load_project

MATRIX = """\
[steps.up]
kind = "text"
path = "../data/input.txt"
upper = "${matrix.upper}"
matrix = { upper = [false, true] }

[steps.j]
kind = "join"
input = "up[${matrix.upper}]"
suffix = "-${matrix.tag}"
matrix = { upper = [false, true], tag = ["x", "y"] }

[steps.last]
kind = "join"
input = "j[true,y]"
suffix = "!"
"""

# The same steps, written out by hand.
BY_HAND = "".join(
    f'[steps."up[{u}]"]\nkind = "text"\npath = "../data/input.txt"\nupper = {u}\n\n' for u in ("false", "true")
) + "".join(
    f'[steps."j[{u},{t}]"]\nkind = "join"\ninput = "up[{u}]"\nsuffix = "-{t}"\n\n'
    for u in ("false", "true") for t in ("x", "y")
) + '[steps.last]\nkind = "join"\ninput = "j[true,y]"\nsuffix = "!"\n'


def matrix_project(root, recipe: str = MATRIX) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/m.toml", recipe)
    return proj


def test_a_matrix_step_is_one_step_per_combination_in_the_order_written(tmp_path):
    project = load_project(matrix_project(tmp_path / "p").root)
    assert list(project.steps) == ["m:up[false]", "m:up[true]", "m:j[false,x]", "m:j[false,y]",
                                   "m:j[true,x]", "m:j[true,y]", "m:last"]
    assert project.steps["m:up[true]"].step.params.upper is True  # a whole placeholder keeps its type
    assert project.steps["m:j[false,y]"].deps == {"input": "m:up[false]"}
    assert project.steps["m:last"].deps == {"input": "m:j[true,y]"}


def test_instances_build_into_their_own_folders(tmp_path):
    proj = matrix_project(tmp_path / "p")
    assert proj.build().ok
    assert proj.read("build/m/j[true,y]/data.txt") == "HELLO-y"
    assert proj.read("build/m/j[false,x]/data.txt") == "hello-x"
    assert proj.read("build/m/last/data.txt") == "HELLO-y!"


def test_the_matrix_form_gives_the_same_steps_and_keys_as_the_steps_written_out(tmp_path):
    short, long = matrix_project(tmp_path / "short"), matrix_project(tmp_path / "long", BY_HAND)
    assert short.build().ok and long.build().ok
    keys = [{sid: r["key"] for sid, r in json.loads(p.read("optbuild.lock"))["steps"].items()}
            for p in (short, long)]
    assert keys[0] == keys[1] and len(keys[0]) == 7
    assert len(MATRIX.splitlines()) < len(BY_HAND.splitlines()) / 2


def test_a_target_naming_the_matrix_step_selects_all_its_instances(tmp_path):
    proj = matrix_project(tmp_path / "p")
    run = proj.cli("plan", "m:j", "--json")
    assert run.returncode == 0, run.stderr
    assert run.steps("would-build") == ["m:j[false,x]", "m:j[false,y]", "m:j[true,x]", "m:j[true,y]",
                                        "m:up[false]", "m:up[true]"]


def test_graph_and_explain_show_instances(tmp_path):
    proj = matrix_project(tmp_path / "p")
    assert '"m:j[true,y]" -> "m:last"' in proj.cli("graph").stdout
    assert proj.build().ok
    explained = proj.cli("explain", "m:j[true,y]")
    assert explained.returncode == 0 and "-y" in explained.stdout


def test_an_unknown_axis_is_named_with_the_line_of_the_matrix_step_and_nothing_else(tmp_path):
    proj = matrix_project(tmp_path / "p", MATRIX.replace("-${matrix.tag}", "-${matrix.colour}"))
    expected = f"{proj.root / 'recipes/m.toml'}:7: steps.j: ${{matrix.colour}}: no such axis (axes: upper, tag)"
    assert proj.problems() == [expected]


@pytest.mark.parametrize("matrix, expected", [
    ('matrix = ["a"]', "11: steps.j.matrix: a matrix is a table of axes"),
    ("matrix = { tag = [] }", "11: steps.j.matrix.tag: an axis is a non-empty list of values"),
    ('matrix = { tag = ["a b"] }', "11: steps.j.matrix.tag: value 'a b': matrix values are"),
    ('matrix = { tag = ["a", "a"] }', "11: steps.j.matrix.tag: values repeat"),
    ("matrix = { tag = [{ x = 1 }] }", "11: steps.j.matrix.tag: value {'x': 1}"),
])
def test_a_malformed_matrix_is_refused_at_its_line(tmp_path, matrix, expected):
    recipe = MATRIX.replace('matrix = { upper = [false, true], tag = ["x", "y"] }', matrix)
    recipe = recipe.replace("up[${matrix.upper}]", "up[true]").replace("j[true,y]", "up[true]")
    found = matrix_project(tmp_path / "p", recipe).problems()
    assert len(found) == 1 and found[0].startswith(f"{tmp_path / 'p' / 'recipes/m.toml'}:{expected}"), found


def test_an_invalid_parameter_in_one_instance_names_that_instance_and_the_line(tmp_path):
    recipe = MATRIX + '\n[steps.nap]\nkind = "join"\ninput = "last"\nsleep = "${matrix.s}"\nmatrix = { s = [0, "long"] }\n'
    found = matrix_project(tmp_path / "p", recipe).problems()
    assert len(found) == 1 and found[0].startswith(f"{tmp_path / 'p' / 'recipes/m.toml'}:21: steps.nap[long].sleep: "), found


def test_an_instance_that_clashes_with_a_step_of_its_own_is_refused(tmp_path):
    recipe = MATRIX + '\n[steps."up[true]"]\nkind = "text"\npath = "../data/input.txt"\n'
    assert any("instance 'up[true]' is also a step of its own" in p
               for p in matrix_project(tmp_path / "p", recipe).problems())
