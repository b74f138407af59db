"""kind = "select" (#12 item 4): the best benchmarked candidate that passed its checks and
meets the constraints; ties broken deterministically; a report of why each won or lost.

The decisions, on figures chosen (the ``figures`` test kind) and compared as the benchmarks
took them (``measure = "cached"``). Measuring the candidates together, on real models:
test_select_together.py."""

from __future__ import annotations

import json
import shutil

import pytest
from plugins.projects import CONFIG, FIXTURES, ProjectDir
from pydantic import ValidationError

from optbuild.common.fingerprint import Fingerprint
from optbuild.project.recipe import load_project
from optbuild.steps.select import SelectParams

KINDS = CONFIG.replace("[kinds]\n", '[kinds]\nfigures = "figures.py:Figures"\n')


def candidate(name: str, **figures: object) -> str:
    return f'[steps.{name}]\nkind = "figures"\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in figures.items()) + "\n"


def select_project(root, candidates: str, select: str) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    shutil.copy(FIXTURES / "figures.py", root / "figures.py")
    proj.write("optbuild.toml", KINDS)
    proj.write("recipes/m.toml", candidates + '[steps.best]\nkind = "select"\nmeasure = "cached"\n' + select)
    return proj


def selection(proj: ProjectDir) -> dict:
    return json.loads(proj.read("build/m/best/selection.json"))


def test_the_fastest_candidate_is_chosen_and_its_model_is_the_output(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=3.0) + candidate("b", p50_ms=1.5)
                          + candidate("c", p50_ms=2.0), 'candidates = ["a", "b", "c"]\n')
    assert proj.build().ok
    report = selection(proj)
    assert report["chosen"] == "m:b"
    assert proj.read("build/m/best/model.onnx").startswith("m:b")
    assert [r["why"] for r in report["candidates"]] == ["p50_ms 3", "chosen", "p50_ms 2"]
    assert "*m:b" in proj.read("build/m/best/selection.txt")


def test_a_candidate_that_failed_verify_is_never_chosen(tmp_path):
    proj = select_project(tmp_path / "p", candidate("fast", p50_ms=0.5, passed=False, cosine=0.2)
                          + candidate("slow", p50_ms=9.0, passed=True, cosine=0.9999),
                          'candidates = ["fast", "slow"]\n')
    assert proj.build().ok
    report = selection(proj)
    assert report["chosen"] == "m:slow"
    assert report["candidates"][0]["rejected"] == ["its verify step failed"]


def test_a_tie_goes_to_the_smaller_model_then_to_the_one_listed_first(tmp_path):
    # y and z differ only in what select does not rank by (else they would be one cached action)
    tie = candidate("x", p50_ms=1.0, size_bytes=2000) + candidate("y", p50_ms=1.0, size_bytes=1000, passed=True) \
        + candidate("z", p50_ms=1.0, size_bytes=1000, passed=True, cosine=0.5)
    proj = select_project(tmp_path / "p", tie, 'candidates = ["x", "y", "z"]\n')
    assert proj.build().ok and selection(proj)["chosen"] == "m:y"
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace('["x", "y", "z"]', '["x", "z", "y"]'))
    assert proj.build().ok and selection(proj)["chosen"] == "m:z"


def test_constraints_drop_candidates_and_none_left_fails_with_the_table(tmp_path):
    candidates = candidate("a", p50_ms=1.0, passed=True, cosine=0.95) + candidate("b", p50_ms=4.0, passed=True,
                                                                                  cosine=0.999)
    proj = select_project(tmp_path / "p", candidates, 'candidates = ["a", "b"]\nmin_cosine = 0.99\n')
    assert proj.build().ok and selection(proj)["chosen"] == "m:b"
    assert selection(proj)["candidates"][0]["rejected"] == ["cosine 0.950000 < 0.99"]
    proj.write("recipes/m.toml", proj.read("recipes/m.toml") + "max_p50_ms = 2.0\n")
    result = proj.build()
    assert not result.ok
    error = result.outcomes["m:best"].error
    assert "no candidate meets the constraints" in error and "p50 4.000 ms > 2.0" in error


def test_by_throughput_the_highest_wins(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0, throughput_per_s=50.0)
                          + candidate("b", p50_ms=2.0, throughput_per_s=400.0),
                          'candidates = ["a", "b"]\nobjective = "throughput_per_s"\n')
    assert proj.build().ok and selection(proj)["chosen"] == "m:b"


def test_all_instances_of_a_matrix_step_are_candidates_with_name_star(tmp_path):
    matrix = '[steps.bench]\nkind = "figures"\np50_ms = "${matrix.ms}"\nmatrix = { ms = [3.0, 1.0, 2.0] }\n\n'
    proj = select_project(tmp_path / "p", matrix, 'candidates = ["bench[*]"]\n')
    assert proj.build().ok
    assert selection(proj)["chosen"] == "m:bench[1.0]"
    assert [r["step"] for r in selection(proj)["candidates"]] == ["m:bench[3.0]", "m:bench[1.0]", "m:bench[2.0]"]


def test_a_new_candidate_figure_selects_again(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0) + candidate("b", p50_ms=2.0),
                          'candidates = ["a", "b"]\n')
    assert proj.build().ok and selection(proj)["chosen"] == "m:a"
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace("p50_ms = 2.0", "p50_ms = 0.5"))
    result = proj.build()
    assert "m:best" in result.steps("built") and selection(proj)["chosen"] == "m:b"


def test_a_star_on_a_step_that_is_not_a_matrix_is_refused(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0), 'candidates = ["a[*]"]\n')
    assert any("'m:a[*]': 'm:a' is not a matrix step" in p for p in proj.problems())


def test_the_report_names_the_candidates_as_the_recipe_does_now(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0) + candidate("b", p50_ms=2.0),
                          'candidates = ["a", "b"]\n')
    assert proj.build().ok
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace("[steps.a]", "[steps.fast]")
               .replace('["a", "b"]', '["fast", "b"]'))
    assert proj.build().ok and selection(proj)["chosen"] == "m:fast"


def test_a_candidate_that_cannot_run_here_is_listed_with_why_and_the_rest_are_chosen_from(tmp_path):
    """On a GPU host without OpenVINO, best was skipped because one candidate was unavailable."""
    proj = select_project(tmp_path / "p", candidate("gpu", p50_ms=0.1, unavailable_because="needs a CUDA GPU")
                          + candidate("cpu", p50_ms=3.0) + candidate("ov", p50_ms=2.0),
                          'candidates = ["gpu", "cpu", "ov"]\n')
    result = proj.build(skip_unavailable=True)
    assert result.ok and result.outcomes["m:best"].status == "built"
    report = selection(proj)
    assert report["chosen"] == "m:ov"
    assert [(r["step"], r["rejected"]) for r in report["candidates"]] == [
        ("m:gpu", ["unavailable: m:gpu cannot run here: needs a CUDA GPU"]), ("m:cpu", []), ("m:ov", [])]
    assert "m:gpu" in proj.read("build/m/best/selection.txt").splitlines()[2]


def test_a_failed_candidate_is_listed_and_a_candidate_that_runs_later_selects_again(tmp_path):
    proj = select_project(tmp_path / "p", candidate("broken", p50_ms=0.1, fails=True) + candidate("ok", p50_ms=3.0),
                          'candidates = ["broken", "ok"]\n')
    result = proj.build(keep_going=True)
    assert not result.ok and result.outcomes["m:best"].status == "built"  # the failure is still the build's
    assert selection(proj)["candidates"][0]["rejected"][0].startswith("failed: the candidate broke")
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace("fails = true\n", ""))
    result = proj.build()
    assert result.ok and result.outcomes["m:best"].status == "built"  # its key named the missing one
    assert selection(proj)["chosen"] == "m:broken"


def test_select_waits_for_one_candidate_and_is_skipped_when_none_ran(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0, unavailable_because="no GPU")
                          + candidate("b", p50_ms=1.0, unavailable_because="no NPU"), 'candidates = ["a", "b"]\n')
    result = proj.build(skip_unavailable=True)
    assert result.outcomes["m:best"].status == "skipped"


def test_without_skip_unavailable_the_build_still_stops_at_the_first_unavailable_candidate(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0, unavailable_because="no GPU")
                          + candidate("b", p50_ms=2.0), 'candidates = ["a", "b"]\n')
    result = proj.build()
    assert not result.ok and result.outcomes["m:best"].status == "skipped"


def test_cached_figures_are_judged_as_the_benchmarks_took_them_and_a_tie_names_its_rule(tmp_path):
    proj = select_project(tmp_path / "p", candidate("x", p50_ms=1.0, size_bytes=2000)
                          + candidate("y", p50_ms=1.0, size_bytes=1000), 'candidates = ["x", "y"]\n')
    assert proj.build().ok
    report = selection(proj)
    assert report["version"] == 4 and report["measure"] == "cached" and report["race"] is None
    assert report["chosen"] == "m:y" and report["tie"] == {"with": ["m:x"], "broken_by": "the smaller model"}
    assert [r["together"] for r in report["candidates"]] == [None, None]
    assert report["candidates"][0]["figures"] == report["candidates"][0]["benchmark"]
    assert "tie, broken by the smaller model" in proj.read("build/m/best/selection.txt")


def test_measuring_together_lists_candidates_it_cannot_open_and_fails_when_none_is_left(tmp_path):
    """Figures candidates are no models: one records no shapes, the other's file does not load."""
    broken = candidate("broken", p50_ms=2.0).replace("\n\n", '\ninputs = { x = { shape = [1, 4], dtype = "float32" } }\n\n')
    proj = select_project(tmp_path / "p", candidate("old", p50_ms=1.0) + broken, 'candidates = ["old", "broken"]\n')
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace('measure = "cached"\n', ""))
    result = proj.build()
    error = result.outcomes["m:best"].error
    assert not result.ok and "no candidate meets the constraints" in error
    assert "not measured here: the benchmark.json of m:old records no shapes" in error
    assert "not measured here: " in error.split("m:broken", 1)[1] and "cannot load the candidate m:broken" in error


def test_size_needs_no_measuring_and_leaves_select_free_of_the_host(tmp_path):
    proj = select_project(tmp_path / "p", candidate("a", p50_ms=1.0, size_bytes=3000)
                          + candidate("b", p50_ms=2.0, size_bytes=1000),
                          'candidates = ["a", "b"]\nobjective = "size_bytes"\n')
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace('measure = "cached"\n', ""))
    assert proj.build().ok and selection(proj)["chosen"] == "m:b" and selection(proj)["measure"] == "cached"
    step = load_project(proj.root).steps["m:best"].step
    assert not step.exclusive and step.host_key(Fingerprint({"cpu.model": "Some CPU"})) == {}
    proj.write("recipes/m.toml", proj.read("recipes/m.toml") + "max_p50_ms = 5.0\n")  # a time constraint: measure
    assert load_project(proj.root).steps["m:best"].step.exclusive


@pytest.mark.parametrize(("params", "words"), [
    ({"rounds": 2}, "greater than or equal to 3"),
    ({"runs": 5, "rounds": 10}, "every round times each candidate at least once"),
    ({"measure": "later"}, "'together' or 'cached'"),
    ({"min_lead": -0.1}, "greater than or equal to 0"),
])
def test_race_params_are_validated(params, words):
    with pytest.raises(ValidationError, match=words):
        SelectParams.model_validate({"candidates": ["a"], **params})
