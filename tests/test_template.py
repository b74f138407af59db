"""Recipe templates (#12 item 2): one pipeline, many models; a recipe is its arguments."""

from __future__ import annotations

import pytest
from plugins.fastpath import optbuild
from plugins.projects import CONFIG, ProjectDir

from optbuild.common.errors import Problem
from optbuild.project.recipe import load_project
from optbuild.project.template import instantiate
from optbuild.project.tomlsource import load_toml

TEMPLATE = """\
# the pipeline every model goes through
[template.args]
tail = "-end"          # a default

[steps.src]
kind = "text"
path = "${args.data}"  # relative to the recipe that uses the template
upper = "${args.upper}"

[steps.mid]
kind = "join"
input = "src"
suffix = "-${args.name}"

[steps.out]
kind = "join"
input = "mid"
suffix = "${args.tail}"
"""


def recipe(name: str, upper: str = "false", extra: str = "") -> str:
    return (f'[recipe]\ntemplate = "../templates/pipeline.toml"\n'
            f'args = {{ data = "../data/{name}.txt", upper = {upper}, name = "{name}" }}\n' + extra)


def template_project(root, template: str = TEMPLATE, **recipes: str) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    proj.write("optbuild.toml", CONFIG)
    proj.write("templates/pipeline.toml", template)
    for name, text in (recipes or {"a": recipe("a"), "b": recipe("b", upper="true")}).items():
        proj.write(f"data/{name}.txt", name)
        proj.write(f"recipes/{name}.toml", text)
    return proj


def test_each_recipe_gets_the_templates_steps_with_its_arguments(tmp_path):
    proj = template_project(tmp_path / "p")
    assert sorted(load_project(proj.root).steps) == ["a:mid", "a:out", "a:src", "b:mid", "b:out", "b:src"]
    assert proj.build().ok
    assert proj.read("build/a/out/data.txt") == "a-a-end"
    assert proj.read("build/b/out/data.txt") == "B-b-end"  # upper = true: the argument's type kept


def test_a_layout_edit_of_the_template_rebuilds_nothing_a_parameter_edit_rebuilds_its_steps(tmp_path):
    proj = template_project(tmp_path / "p")
    assert proj.build().ok
    proj.write("templates/pipeline.toml", "# reworded\n\n" + TEMPLATE.replace('kind = "join"', 'kind   =   "join"'))
    assert proj.cli("plan", "--json").steps("would-build") == []
    proj.write("templates/pipeline.toml", TEMPLATE.replace('suffix = "${args.tail}"', 'suffix = "${args.tail}!"'))
    assert proj.cli("plan", "--json").steps("would-build") == ["a:out", "b:out"]


def test_a_recipe_adds_steps_and_changes_keys_of_the_templates(tmp_path):
    extra = '\n[steps.mid]\nsuffix = "-custom"\n\n[steps.more]\nkind = "join"\ninput = "out"\nsuffix = "+"\n'
    proj = template_project(tmp_path / "p", a=recipe("a", extra=extra))
    assert proj.build().ok
    assert proj.read("build/a/more/data.txt") == "a-custom-end+"


def test_matrix_steps_work_inside_a_template(tmp_path):
    template = TEMPLATE + '\n[steps.m]\nkind = "join"\ninput = "out"\nsuffix = "${matrix.s}"\nmatrix = { s = ["x", "y"] }\n'
    proj = template_project(tmp_path / "p", template)
    assert {"a:m[x]", "a:m[y]", "b:m[x]", "b:m[y]"} <= set(load_project(proj.root).steps)


def test_a_placeholder_without_argument_points_at_the_template_line_and_names_the_recipe(tmp_path):
    proj = template_project(tmp_path / "p", TEMPLATE.replace("${args.name}", "${args.nmae}"), a=recipe("a"))
    found = proj.problems()
    template = proj.root / "templates/pipeline.toml"
    assert f"{template}:13: steps.mid.suffix: ${{args.nmae}}: no such argument" in found[0]
    assert found[0].endswith("(expanded for recipe a.toml)")


def test_an_argument_the_template_does_not_use_is_refused_at_the_recipes_line(tmp_path):
    proj = template_project(tmp_path / "p", a=recipe("a").replace('name = "a"', 'name = "a", colour = 3'))
    assert any(p.startswith(f"{proj.root / 'recipes/a.toml'}:3: recipe.args.colour: argument 'colour' is not used")
               for p in proj.problems())


def test_a_bad_value_from_the_template_points_at_the_template_line(tmp_path):
    proj = template_project(tmp_path / "p", a=recipe("a", upper='"maybe"'))
    found = proj.problems()
    assert found[0].startswith(f"{proj.root / 'templates/pipeline.toml'}:8: steps.src.upper: ")
    assert "(expanded for recipe a.toml)" in found[0]


def test_a_missing_template_file_is_named_at_the_recipes_line(tmp_path):
    proj = template_project(tmp_path / "p", a=recipe("a").replace("pipeline.toml", "pipeline2.toml"))
    assert proj.problems()[0].startswith(f"{proj.root / 'recipes/a.toml'}:2: recipe.template: template "
                                        "'../templates/pipeline2.toml': ")


def test_a_template_edit_takes_the_no_op_fast_path_off(tmp_path):
    proj = template_project(tmp_path / "p")
    assert optbuild(proj, "build").returncode == 0
    assert optbuild(proj, "build").returncode == 0  # the first stamp cannot vouch for files just written
    assert optbuild(proj, "build").fast
    proj.write("templates/pipeline.toml", TEMPLATE.replace('"-end"', '"-fin"'))
    again = optbuild(proj, "build")
    assert not again.fast and proj.read("build/a/out/data.txt") == "a-a-fin"


def test_a_table_key_may_hold_a_placeholder(tmp_path):
    template = TEMPLATE.replace('upper = "${args.upper}"', 'upper = "${args.upper}"\n\n[inputs."${args.name}"]\n'
                                                            'shape = [1, 4]')
    proj = template_project(tmp_path / "p", template)
    project = load_project(proj.root)
    assert sorted(project.steps) == ["a:mid", "a:out", "a:src", "b:mid", "b:out", "b:src"]
    problems: list[Problem] = []
    data, _ = instantiate(load_toml(proj.root / "recipes/b.toml"), problems)
    assert data["inputs"] == {"b": {"shape": [1, 4]}} and problems == []


OMIT = 'omit = ["out"]\n'


def test_omit_leaves_template_steps_out_and_their_placeholders_need_no_argument(tmp_path):
    template = TEMPLATE.replace('suffix = "${args.tail}"', 'suffix = "${args.tail}${args.only_out}"')
    proj = template_project(tmp_path / "p", template, a=recipe("a", extra=OMIT))
    assert sorted(load_project(proj.root).steps) == ["a:mid", "a:src"]


def test_an_omitted_step_of_the_recipes_own_replaces_the_templates_whole(tmp_path):
    extra = OMIT + '\n[steps.out]\nkind = "join"\ninput = "src"\n'
    proj = template_project(tmp_path / "p", a=recipe("a", extra=extra))
    assert proj.build().ok
    assert proj.read("build/a/out/data.txt") == "a"  # no suffix: nothing of the template's out is left


def test_omitting_a_step_others_take_is_refused_at_their_line(tmp_path):
    proj = template_project(tmp_path / "p", a=recipe("a", extra='omit = ["mid"]\n'))
    assert proj.problems() == [
        # only mid used it: an argument for an omitted step is as superfluous as any unused one
        f"{proj.root / 'recipes/a.toml'}:3: recipe.args.name: argument 'name' is not used by pipeline.toml",
        (f"{proj.root / 'templates/pipeline.toml'}:17: steps.out.input: no step 'a:mid' "
        "(expanded for recipe a.toml)")]


@pytest.mark.parametrize("omit, expected", [
    ('omit = ["outt"]', "pipeline.toml has no step 'outt' (its steps: src, mid, out)"),
    ('omit = "out"', "expected a list of the template's step names"),
])
def test_a_bad_omit_is_refused_at_the_recipes_line(tmp_path, omit, expected):
    proj = template_project(tmp_path / "p", a=recipe("a", extra=omit + "\n"))
    found = proj.problems()
    assert len(found) == 1 and found[0].startswith(f"{proj.root / 'recipes/a.toml'}:4: recipe.omit: {expected}"), found


def test_omit_without_a_template_is_refused(tmp_path):
    proj = template_project(tmp_path / "p", b='[recipe]\nomit = ["x"]\n\n[steps.src]\nkind = "text"\n'
                                              'path = "../data/b.txt"\n')
    assert proj.problems() == [(f"{proj.root / 'recipes/b.toml'}:2: recipe.omit: omit leaves out steps of a "
                               "template: this recipe has no template")]
