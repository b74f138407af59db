"""-S RECIPE:STEP.PARAM=VALUE (#12 item 3): a parameter set for one run, validated like the
recipe, recorded in optbuild.lock, without editing a file."""

from __future__ import annotations

import json

import pytest
from plugins.projects import CONFIG, PIPELINE, ProjectDir

from optbuild.common.errors import ProjectError
from optbuild.project.overrides import parse_override
from optbuild.project.recipe import load_project


@pytest.mark.parametrize("text, step, param, value", [
    ("chain:mid.suffix=-x", "mid", "suffix", "-x"),
    ('chain:mid.suffix="a b"', "mid", "suffix", "a b"),
    ("chain:mid.sleep=0.5", "mid", "sleep", 0.5),
    ("chain:mid.fail=false", "mid", "fail", False),
    ("chain:j[0.5,x].sleep=1", "j[0.5,x]", "sleep", 1),
    ("chain:q.extra_options.ActivationSymmetric=true", "q", "extra_options.ActivationSymmetric", True),
])
def test_a_value_is_read_as_toml_else_as_a_plain_string(text, step, param, value):
    parsed = parse_override(text)
    assert (parsed.recipe, parsed.step, parsed.param, parsed.value) == ("chain", step, param, value)


@pytest.mark.parametrize("text", ["chain:mid.suffix", "mid.suffix=x", "chain:mid=x", "chain:.suffix=x", "chain:mid.=x"])
def test_a_malformed_override_says_the_form_it_needs(text):
    with pytest.raises(ProjectError, match=r"expected RECIPE:STEP\.PARAM=VALUE"):
        parse_override(text)


def test_build_with_an_override_builds_the_changed_step_and_records_it(project):
    assert project.build().ok
    run = project.cli("build", "-S", "chain:mid.suffix=-set", "--json")
    assert run.returncode == 0, run.stderr
    assert run.steps("built") == ["chain:mid", "chain:out"]  # out: its input changed
    assert project.read("build/chain/out/data.txt") == "hello-set-out"
    assert "chain:mid.suffix=-set" not in project.read("recipes/chain.toml")  # no file edited
    lock = json.loads(project.read("optbuild.lock"))["steps"]
    assert lock["chain:mid"]["overrides"] == {"suffix": "-set"}
    assert "overrides" not in lock["chain:out"]


def test_plan_takes_overrides_and_says_why_a_step_would_build(project):
    assert project.build().ok
    run = project.cli("plan", "-S", "chain:side.suffix=-s2", "--json")
    assert run.returncode == 0, run.stderr
    assert run.steps("would-build") == ["chain:side"]


def test_an_invalid_override_is_refused_naming_the_flag_the_file_and_the_field(project):
    run = project.cli("build", "-S", "chain:mid.sleep=soon")
    assert run.returncode == 2
    assert f"{project.root / 'recipes/chain.toml'}:6: steps.mid.sleep:" in run.stderr  # the step's line: sleep is not in the file
    assert "(set by -S chain:mid.sleep=soon)" in run.stderr
    assert not (project.root / "build").exists()


@pytest.mark.parametrize("text, expected", [
    ("nope:mid.suffix=x", "-S nope:mid.suffix=x: no recipe 'nope' (recipes: chain)"),
    ("chain:nope.suffix=x", "-S chain:nope.suffix=x: no step 'nope' in recipe 'chain'"),
    ("chain:mid.sufix=x", "steps.mid.sufix: unknown key; did you mean 'suffix'? (set by -S chain:mid.sufix=x)"),
    ("chain:mid.suffix.deeper=x", "-S chain:mid.suffix.deeper=x: 'suffix' is not a table"),
])
def test_an_override_of_something_that_does_not_exist_is_refused(project, text, expected):
    with pytest.raises(ProjectError) as info:
        load_project(project.root, [text])
    assert any(expected in str(p) for p in info.value.problems), [str(p) for p in info.value.problems]


def test_a_matrix_step_name_sets_the_parameter_in_every_instance(tmp_path):
    proj = ProjectDir.with_test_kinds(tmp_path / "p")
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/chain.toml", PIPELINE + '\n[steps.m]\nkind = "join"\ninput = "src"\n'
               'suffix = "${matrix.s}"\nmatrix = { s = ["a", "b"] }\n')
    project = load_project(proj.root, ["chain:m.fail=true", "chain:m[b].sleep=0.25"])
    assert [project.steps[f"chain:m[{s}]"].step.params.fail for s in "ab"] == [True, True]
    assert [project.steps[f"chain:m[{s}]"].step.params.sleep for s in "ab"] == [0.0, 0.25]
