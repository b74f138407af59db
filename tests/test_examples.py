"""The example project builds for real: torch export, onnxsim, onnxruntime checks."""

from __future__ import annotations

import re
import shutil

import pytest
from plugins.projects import REPO, ProjectDir

pytestmark = pytest.mark.slow

# The example recipes as they were written out by hand, step by step (455 lines), before
# they became one template with matrix steps (#12 item 5): they must give the same steps.
# Their engine_ort says level = "all" where it said "extended": the engine's default and the
# template's since the level below ran conv nets slower than their input (#33 item 6).
HANDWRITTEN = REPO / "tests/fixtures/examples_handwritten"
PRECISIONS = ("fp32", "fp16", "int8")

# Each hand-written step -> the step the template, its matrices and the recipes' omit lists
# make of it (the others keep their names).
RENAMED = {
    **{f"{model}:rtx_{p}": f"{model}:rtx[{p}]" for model in ("cnn", "transformer") for p in PRECISIONS},
    **{f"{model}:verify_rtx_{p}": f"{model}:verify_rtx[{p}]" for model in ("cnn", "transformer") for p in PRECISIONS},
    **{f"{model}:verify_{v}": f"{model}:verify[{v}]"
       for model, variants in (("cnn", ("int8", "ov_fp32", "ov_int8")), ("transformer", ("int8", "dynamic")),
                               ("encoder", ("int8", "dynamic", "ov_fp32", "ov_int8")))
       for v in variants},
    **{f"encoder:bench_{v}": f"encoder:bench[{v}]" for v in ("int8", "dynamic", "ov_fp32", "ov_int8")},
}
# Hand-written steps whose key differs on purpose, and why.
DIFFERENT = {
    # a select step's key holds its candidates' names, which its report prints: they are
    # bench[int8]... now, not bench_int8... (their own keys, and so their figures, are equal)
    "encoder:best",
}
# The one line the template adds to what was written by hand: the CPU variants' verify
# steps record a failure (fail = false) for best to drop the variant, where they stopped
# the build. The hand-written recipes are compared with that line added.
CPU_VERIFY = re.compile(r"^(\[steps\.verify_(?!rtx_)\w+\]\n)", re.MULTILINE)
# What the template gives models that had no such steps: a select step per model; every
# model's fp32 and fp16 on onnxruntime CUDA (the encoder's fp16 model with them); and every
# model's best as a Triton repository entry (serve).
SERVE = {f"{model}:serve" for model in ("cnn", "transformer", "encoder")}
CUDA = {f"{model}:{step}[{precision}]" for model in ("cnn", "transformer", "encoder")
        for step in ("engine_cuda", "verify_cuda", "bench_cuda") for precision in ("fp32", "fp16")}
ADDED = {f"{model}:{step}" for model, variants in (("cnn", ("int8", "ov_fp32", "ov_int8")),
                                                   ("transformer", ("int8", "dynamic")))
         for step in ("bench_fp32", "best", *(f"bench[{v}]" for v in variants))} | CUDA | {"encoder:fp16"} | SERVE


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> ProjectDir:
    root = tmp_path_factory.mktemp("examples")
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    return ProjectDir(root)


def planned_keys(project: ProjectDir) -> dict[str, tuple[str, str | None]]:
    run = project.cli("plan", "--json")
    assert run.returncode == 0, run.stderr + run.stdout
    return {e["step"]: (e["status"], e.get("key")) for e in run.events if e.get("event") == "step"}


def test_examples_build_then_noop(examples):
    first = examples.cli("build", "--json", "-j", "2")
    assert first.returncode == 0, first.stderr + first.stdout
    built = first.steps("built")
    assert {"cnn:export", "cnn:simplify", "transformer:export", "transformer:simplify"} <= set(built)
    # the larger encoder's static and dynamic INT8 models pass their verify steps
    assert {"encoder:verify[int8]", "encoder:verify[dynamic]", "encoder:engine_ort"} <= set(built)
    # each model's CPU variants are benchmarked here and the fastest that passed is chosen
    assert {"cnn:best", "transformer:best", "encoder:best"} <= set(built)
    assert (examples.root / "build/encoder/best/selection.txt").read_text().count("chosen") == 1
    # ... and laid out for Triton: best's model (ONNX or an OpenVINO IR here) and its config
    assert SERVE <= set(built)
    for model in ("cnn", "transformer", "encoder"):
        assert (examples.root / f"build/{model}/serve/{model}/config.pbtxt").is_file()
        assert len(list((examples.root / f"build/{model}/serve/{model}/1").glob("model.*"))) >= 1
    engines = {f"{model}:rtx[{precision}]" for model in ("cnn", "transformer") for precision in PRECISIONS}
    assert engines <= set(built)
    for engine in engines:
        recipe, step = engine.split(":")
        assert (examples.root / "build" / recipe / step / "model.engine").stat().st_size > 100_000
    # the engines' verify steps need an RTX GPU, the CUDA engines onnxruntime-gpu and an NVIDIA
    # GPU: unavailable here (their verify and benchmark steps skipped), and the build is still ok
    assert {s for s in CUDA if "engine_cuda" in s} <= set(first.steps("unavailable"))
    assert set(first.steps("skipped")) == {s for s in CUDA if "engine_cuda" not in s}
    assert len(built) == 59 and len(first.steps("unavailable")) == 12
    second = examples.cli("build", "--json")
    assert second.returncode == 0
    assert second.steps("built") == []


def test_the_template_gives_the_hand_written_steps_with_the_same_keys(examples, tmp_path):
    """The hand-written recipes planned against the cache the template's build filled: every
    step whose parameters are equal has the key of its counterpart, so it is cached."""
    assert examples.cli("build", "-j", "2").returncode == 0  # nothing to do after the test above
    new = planned_keys(examples)
    old_project = ProjectDir(tmp_path / "handwritten")
    # the same project-relative paths as the examples' (a key names its files by them)
    shutil.copytree(examples.root / "recipes/models", old_project.root / "recipes/models",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for recipe in HANDWRITTEN.glob("*.toml"):
        text = CPU_VERIFY.sub(r"\1fail = false\n", recipe.read_text())
        (old_project.root / "recipes" / recipe.name).write_text(text)
    old_project.write("optbuild.toml", "[project]\nallow_outside = true  # the examples' cache\n\n"
                                       f'[cache]\ndir = "{examples.root / "cache"}"\n\n'
                                       "[build]\nskip_unavailable = true\n")
    old = planned_keys(old_project)
    assert len(old) == 52 and len(new) == 83
    assert set(RENAMED) <= set(old) and DIFFERENT <= set(old)
    counterparts = {RENAMED.get(step, step): step for step in old}
    assert set(new) - set(counterparts) == ADDED and set(counterparts) <= set(new)
    for step, (status, key) in old.items():
        new_status, new_key = new[RENAMED.get(step, step)]
        assert key is not None and new_key is not None, step
        if step in DIFFERENT:
            assert key != new_key and status == "would-build", step
        else:
            assert key == new_key, f"{step} -> {RENAMED.get(step, step)}"
            assert status == new_status and status in ("cached", "unavailable"), step

    def lines(files):
        return sum(len(path.read_text().splitlines()) for path in files)

    # the template says each step in under 60% of the hand-written lines (it says more steps)
    before = lines(HANDWRITTEN.glob("*.toml"))
    after = lines([*REPO.glob("recipes/*.toml"), *REPO.glob("recipes/templates/*.toml")])
    assert before == 455 and after / len(new) < 0.6 * before / len(old), (before, after)


def test_editing_a_module_imported_by_the_export_callable_rebuilds_the_exports(examples):
    examples.cli("build")
    blocks = examples.root / "recipes/models/blocks.py"
    blocks.write_text(blocks.read_text() + "\n# an edit that changes no behaviour\n")
    plan = examples.cli("plan", "--json")
    reasons = {e["step"]: e["reasons"] for e in plan.events if e.get("event") == "step"}
    assert "input file recipes/models/blocks.py changed" in reasons["cnn:export"]
    run = examples.cli("build", "--json")
    assert {"cnn:export", "transformer:export"} <= set(run.steps("built"))
    # the exported bytes are the same, so the rest of each pipeline is reused
    assert "cnn:simplify" in run.steps("cached")


def test_a_recipe_that_changes_the_templates_target_list_rebuilds_exactly_its_engines(examples):
    examples.cli("build")
    recipe = examples.root / "recipes/cnn.toml"
    original = recipe.read_text()
    try:  # a recipe's [steps.rtx] changes the keys it sets in every instance of the template's matrix
        recipe.write_text(original + '\n[steps.rtx]\ntargets = ["sm89", "sm120"]\n')
        plan = examples.cli("plan", "--json")
        reasons = {e["step"]: e["reasons"] for e in plan.events if e.get("event") == "step"}
        assert reasons["cnn:rtx[fp32]"] == ['parameter targets: ["sm86", "sm89"] -> ["sm89", "sm120"]']
        run = examples.cli("build", "--json")
        assert run.returncode == 0, run.stderr
        assert run.steps("built") == ["cnn:rtx[fp16]", "cnn:rtx[fp32]", "cnn:rtx[int8]"]
    finally:
        recipe.write_text(original)
