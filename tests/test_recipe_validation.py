"""Bad input: every problem is reported with file, line and field; nothing is built."""

from __future__ import annotations

import pytest

from optbuild.common.errors import ProjectError
from optbuild.project.recipe import load_project


def problems(project) -> list[str]:
    with pytest.raises(ProjectError) as info:
        load_project(project.root)
    return [str(p) for p in info.value.problems]


def test_invalid_toml_names_file_and_line(project):
    project.write("recipes/chain.toml", '[steps.src]\nkind = "text"\npath = \n')
    (message,) = problems(project)
    assert "recipes/chain.toml:3:" in message and "invalid TOML" in message


def test_unknown_key_names_line_and_field(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('suffix = "-out"', 'sufix = "-out"'))
    (message,) = problems(project)
    assert message.endswith("recipes/chain.toml:14: steps.out.sufix: unknown key; did you mean 'suffix'?")


def test_unknown_step_kind_suggests_the_closest(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('kind = "text"', 'kind = "txt"'))
    (message,) = problems(project)
    assert "chain.toml:3: steps.src.kind: unknown step kind 'txt'; did you mean 'text'?" in message


def test_wrong_type_names_the_field(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('suffix = "-mid"', "suffix = 3"))
    (message,) = problems(project)
    assert "chain.toml:9: steps.mid.suffix: Input should be a valid string" in message


def test_reference_to_a_missing_step_also_across_recipes(project):
    project.write("recipes/other.toml", '[steps.x]\nkind = "join"\ninput = "chain:nope"\n')
    (message,) = problems(project)
    assert "other.toml:3: steps.x.input: no step 'chain:nope'" in message


def test_cross_recipe_reference_is_resolved(project):
    project.write("recipes/other.toml", '[steps.x]\nkind = "join"\ninput = "chain:out"\n')
    loaded = load_project(project.root)
    assert loaded.steps["other:x"].deps == {"input": "chain:out"}


def test_cycle_is_named(project):
    from optbuild.project.graph import StepGraph

    project.write("recipes/loop.toml", '[steps.a]\nkind = "join"\ninput = "b"\n\n[steps.b]\nkind = "join"\ninput = "a"\n')
    with pytest.raises(ProjectError) as info:
        StepGraph(load_project(project.root).steps)
    (message,) = [str(p) for p in info.value.problems]
    assert "dependency cycle: loop:" in message
    assert "loop:a" in message and "loop:b" in message


def test_missing_input_file_names_the_field(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace("input.txt", "absent.txt"))
    (message,) = problems(project)
    assert "chain.toml:4: steps.src.path: file not found:" in message and "absent.txt" in message


def test_every_problem_is_reported_at_once(project):
    text = project.read("recipes/chain.toml").replace('suffix = "-mid"', "suffix = 3").replace('kind = "text"', 'kind = "nope"')
    project.write("recipes/chain.toml", text)
    assert len(problems(project)) >= 2


def test_missing_required_key(project):
    project.write("recipes/chain.toml", '[steps.src]\nkind = "text"\n')
    (message,) = problems(project)
    assert "steps.src.path: required key is missing" in message


def test_project_config_errors_name_the_field(project):
    project.write("optbuild.toml", project.read("optbuild.toml").replace("jobs = 2", 'jobs = "many"'))
    (message,) = problems(project)
    assert "optbuild.toml:10: build.jobs:" in message


@pytest.mark.parametrize("file", ["optbuild.toml", "recipes/chain.toml"])
def test_deeply_nested_toml_names_the_file_and_line(project, file):
    project.write(file, project.read(file) + "\nnested = " + "[" * 5000 + "]" * 5000 + "\n")
    (message,) = problems(project)
    line = len(project.read(file).splitlines())
    assert message.startswith(f"{project.root / file}:{line}: invalid TOML: arrays or inline tables nested too deeply")


NOT_FINITE = "is not a finite number: a parameter enters the step's key, which holds finite numbers only"


@pytest.mark.parametrize("number, shown", [("1e999", "inf"), ("inf", "inf"), ("-inf", "-inf"), ("nan", "nan")])
def test_a_number_that_is_not_finite_is_refused_with_its_line(project, number, shown):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace(
        'suffix = "-mid"', f'suffix = "-mid"\nsleep = {number}'))
    (message,) = problems(project)
    assert message.startswith(f"{project.root / 'recipes/chain.toml'}:10: steps.mid.sleep: {shown} ")
    assert NOT_FINITE in message


def test_a_number_that_is_not_finite_inside_arrays_and_tables_is_refused_where_it_is(project):
    project.write("recipes/chain.toml", "[inputs.x]\nrange = [0.0, 1e999]\n" + project.read("recipes/chain.toml"))
    (message,) = problems(project)
    assert message.startswith(f"{project.root / 'recipes/chain.toml'}:2: inputs.x.range.1: inf ")
    assert NOT_FINITE in message


def test_a_number_that_is_not_finite_set_by_an_override_is_blamed_on_it(project):
    with pytest.raises(ProjectError) as info:
        load_project(project.root, ["chain:mid.sleep=nan"])
    (message,) = [str(p) for p in info.value.problems]
    assert message.startswith(f"{project.root / 'recipes/chain.toml'}:6: steps.mid.sleep: nan ")
    assert message.endswith("(set by -S chain:mid.sleep=nan)")


@pytest.mark.parametrize("value, field", [("server_idle_s = inf", "build.server_idle_s"),
                                          ("timeout_s = nan", "remote.timeout_s")])
def test_a_number_that_is_not_finite_in_the_project_config_is_refused(project, value, field):
    table = field.split(".")[0]
    text = project.read("optbuild.toml").replace("[build]\njobs = 2\n", "") + f"[{table}]\n{value}\n"
    project.write("optbuild.toml", text)
    (message,) = problems(project)
    line = len(text.splitlines())
    assert message == f"{project.root / 'optbuild.toml'}:{line}: {field}: Input should be a finite number"


def test_no_config_anywhere_says_to_create_one(tmp_path):
    with pytest.raises(ProjectError, match="no optbuild.toml") as caught:
        load_project(tmp_path)
    assert "touch optbuild.toml" in str(caught.value) and "An empty file means the defaults" in str(caught.value)


def test_an_empty_config_means_the_defaults(tmp_path):
    (tmp_path / "optbuild.toml").write_text("")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.toml").write_text('[steps.s]\nkind = "onnx"\npath = "m.onnx"\n')
    (tmp_path / "recipes" / "m.onnx").write_bytes(b"")  # loading checks that it exists, not what it holds
    project = load_project(tmp_path)
    assert list(project.steps) == ["r:s"]
    assert project.build_dir == tmp_path / "build"


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda t: t.replace('path = "../data/input.txt"', "path = "), "invalid TOML"),
        (lambda t: t.replace('kind = "text"', 'kind = "bogus"'), "unknown step kind 'bogus'"),
        (lambda t: t.replace('input = "mid"', 'input = "gone"'), "no step 'chain:gone'"),
        (lambda t: t.replace('suffix = "-out"', 'suffix = "-out"\nsleep = 1e999'), "steps.out.sleep: inf "),
    ],
)
def test_cli_prints_a_clear_error_and_exits_nonzero_without_traceback(project, edit, expected):
    project.write("recipes/chain.toml", edit(project.read("recipes/chain.toml")))
    run = project.cli("build")
    assert run.returncode == 2
    assert expected in run.stderr
    assert "Traceback" not in run.stderr
    assert not (project.root / "build").exists()
