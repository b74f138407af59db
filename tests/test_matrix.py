"""Matrix steps (#12 item 1): one [steps.NAME] table with `matrix = {AXIS = [values]}` is one
step per combination, named NAME[v1,v2], with ${matrix.AXIS} in its parameters."""

from __future__ import annotations

import json

import pytest
from plugins.projects import CONFIG, ProjectDir

from optbuild.project.recipe import load_project

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
    several = proj.cli("explain", "m:j")  # explain takes one step: the target names four
    assert several.returncode == 2
    assert ("error: m:j is a matrix step: name one of its instances: "
            "m:j[false,x], m:j[false,y], m:j[true,x], m:j[true,y]") in several.stderr


def test_an_unknown_axis_is_named_with_the_line_of_the_matrix_step_and_nothing_else(tmp_path):
    every = '\n[steps.all]\nkind = "join"\ninput = "up[false]"\nother = "j[*]"\n'  # its instances: unknown too
    proj = matrix_project(tmp_path / "p", MATRIX.replace("-${matrix.tag}", "-${matrix.colour}") + every)
    expected = f"{proj.root / 'recipes/m.toml'}:7: steps.j: ${{matrix.colour}}: no such axis (axes: upper, tag)"
    assert proj.problems() == [expected]


@pytest.mark.parametrize("matrix, expected", [
    ('matrix = ["a"]', "11: steps.j.matrix: a matrix is a table of axes"),
    ("matrix = { tag = [] }", "11: steps.j.matrix.tag: an axis is a non-empty list of values"),
    ('matrix = { tag = ["a b"] }', "11: steps.j.matrix.tag: value 'a b': matrix values are"),
    ('matrix = { tag = ["a", "a"] }', "11: steps.j.matrix.tag: values repeat"),
    ("matrix = { tag = [{ x = 1 }] }", "11: steps.j.matrix.tag: value {'x': 1}: a table value needs a 'name' key"),
    ('matrix = { tag = [{ name = "a b" }] }', "11: steps.j.matrix.tag: value {'name': 'a b'}: its name 'a b' must be"),
    ('matrix = { tag = [{ name = "a", "x.y" = 1 }] }', "11: steps.j.matrix.tag: value 'a': key 'x.y' must be"),
    ('matrix = { tag = [{ name = "a" }, "a"] }', "11: steps.j.matrix.tag: values repeat: ['a', 'a']"),
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


# An axis of tables: each value's name names the instances, its other keys go together.
TABLES = """\
[steps.up]
kind = "text"
path = "../data/input.txt"

[steps.j]
kind = "join"
input = "${matrix.variant.source}"
suffix = "-${matrix.variant}:${matrix.variant.tag}"
sleep = "${matrix.variant.sleep}"
matrix = { variant = [{ name = "fast", source = "up", tag = "x", sleep = 0 },
                      { name = "slow", source = "up", tag = "y", sleep = 0.01 }], n = [1, 2] }

[steps.last]
kind = "join"
input = "j[slow,2]"
"""


def test_an_axis_of_tables_names_instances_by_name_and_gives_their_keys(tmp_path):
    project = load_project(matrix_project(tmp_path / "p", TABLES).root)
    assert list(project.steps) == ["m:up", "m:j[fast,1]", "m:j[fast,2]", "m:j[slow,1]", "m:j[slow,2]", "m:last"]
    slow = project.steps["m:j[slow,2]"]
    assert slow.deps == {"input": "m:up"}
    assert slow.step.params.suffix == "-slow:y" and slow.step.params.sleep == 0.01  # typed when whole
    assert project.steps["m:last"].deps == {"input": "m:j[slow,2]"}


def test_an_axis_of_tables_gives_the_keys_of_the_steps_written_out(tmp_path):
    by_hand = TABLES.split("[steps.j]")[0] + "".join(
        f'[steps."j[{name},{n}]"]\nkind = "join"\ninput = "up"\nsuffix = "-{name}:{tag}"\nsleep = {sleep}\n\n'
        for name, tag, sleep in (("fast", "x", 0), ("slow", "y", 0.01)) for n in (1, 2)
    ) + '[steps.last]\nkind = "join"\ninput = "j[slow,2]"\n'
    short, long = matrix_project(tmp_path / "short", TABLES), matrix_project(tmp_path / "long", by_hand)
    assert short.build().ok and long.build().ok
    keys = [{sid: r["key"] for sid, r in json.loads(p.read("optbuild.lock"))["steps"].items()}
            for p in (short, long)]
    assert keys[0] == keys[1] and len(keys[0]) == 6


@pytest.mark.parametrize("edit, expected", [
    # a key one value lacks: the instance is named, and the line of the parameter asking for it
    (('tag = "y", ', ""), ("8: steps.j.suffix: j[slow,1]: ${matrix.variant.tag}: the value 'slow' of axis "
                          "'variant' has no key 'tag' (its keys: name, source, sleep)")),
    (("${matrix.variant.tag}", "${matrix.n.tag}"), ("8: steps.j.suffix: j[fast,1]: ${matrix.n.tag}: the value "
                                                   "'1' of axis 'n' is not a table, so it has no key 'tag'")),
    (('source = "up", tag = "x"', 'source = "up", tag = ["x"]'),
     "8: steps.j.suffix: j[fast,1]: ${matrix.variant.tag} is a list: it can only stand alone in a string"),
    (("${matrix.variant.tag}", "${matrix.colour.tag}"), ("5: steps.j: ${matrix.colour.tag}: no such axis "
                                                        "(axes: variant, n)")),
])
def test_a_key_that_a_table_value_cannot_give_is_named_with_its_instance_and_line(tmp_path, edit, expected):
    found = matrix_project(tmp_path / "p", TABLES.replace(*edit)).problems()
    assert len(found) == 1 and found[0].startswith(f"{tmp_path / 'p' / 'recipes/m.toml'}:{expected}"), found


def test_an_axis_of_tables_can_come_from_a_template_argument(tmp_path):
    proj = ProjectDir.with_test_kinds(tmp_path / "p")
    proj.write("optbuild.toml", CONFIG)
    proj.write("templates/t.toml", TABLES.split("[steps.last]")[0].replace(
        TABLES[TABLES.index("[{ name"):TABLES.index(", n = [1, 2]")], '"${args.variants}"'))
    proj.write("recipes/m.toml", '[recipe]\ntemplate = "../templates/t.toml"\n'
                                 'args.variants = [{ name = "only", source = "up", tag = "z", sleep = 0 }]\n')
    proj.write("data/input.txt", "hello")
    assert sorted(load_project(proj.root).steps) == ["m:j[only,1]", "m:j[only,2]", "m:up"]
    assert proj.build().ok and proj.read("build/m/j[only,2]/data.txt") == "hello-only:z"
