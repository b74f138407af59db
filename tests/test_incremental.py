"""Incremental builds: a step runs exactly when something its output depends on changed."""

from __future__ import annotations

import os
import time

from optbuild.common.toolchain import Toolchain

ALL = ["chain:mid", "chain:out", "chain:side", "chain:src"]


def test_first_build_runs_every_step_and_materializes_outputs(project):
    result = project.build()
    assert result.ok
    assert sorted(result.steps("built")) == ALL
    assert project.read("build/chain/out/data.txt") == "hello-mid-out"
    assert project.read("build/chain/side/data.txt") == "hello-side"
    assert (project.root / "build/chain/out/data.txt").stat().st_mode & 0o222 == 0  # read-only


def test_second_build_executes_no_step(project):
    project.build()
    result = project.build()
    assert result.ok
    assert result.steps("built") == []
    assert sorted(result.steps("cached")) == ALL


def test_changed_parameter_rebuilds_that_step_and_its_descendants_only(project):
    project.build()
    text = project.read("recipes/chain.toml").replace('suffix = "-mid"', 'suffix = "-MID"')
    project.write("recipes/chain.toml", text)
    result = project.build()
    assert sorted(result.steps("built")) == ["chain:mid", "chain:out"]
    assert project.read("build/chain/out/data.txt") == "hello-MID-out"


def test_touching_an_input_without_changing_its_bytes_rebuilds_nothing(project):
    project.build()
    path = project.root / "data/input.txt"
    later = time.time() + 5
    os.utime(path, (later, later))
    assert project.build().steps("built") == []


def test_changed_input_bytes_rebuild_its_consumers(project):
    project.build()
    project.write("data/input.txt", "HELLO")
    result = project.build()
    assert sorted(result.steps("built")) == ALL
    assert project.read("build/chain/side/data.txt") == "HELLO-side"


def test_comment_and_key_order_edits_in_a_recipe_rebuild_nothing(project):
    project.build()
    text = project.read("recipes/chain.toml")
    text = "# a new comment\n" + text.replace('input = "mid"\nsuffix = "-out"', 'suffix = "-out"  # moved\ninput = "mid"')
    project.write("recipes/chain.toml", text)
    assert project.build().steps("built") == []


def test_declared_tool_version_change_rebuilds_the_steps_that_declare_it(project):
    project.build()
    # `join` declares pydantic as a tool; `text` declares none.
    result = project.build(toolchain=Toolchain({"pydantic": "0.0-simulated"}))
    assert sorted(result.steps("built")) == ["chain:mid", "chain:out", "chain:side"]


def test_upstream_rebuild_with_identical_output_stops_the_rebuild_early(project):
    project.build()
    # The source now upper-cases an input that is already upper case: new key, same bytes.
    project.write("data/input.txt", "HELLO")
    project.build()
    text = project.read("recipes/chain.toml").replace('path = "../data/input.txt"', 'path = "../data/input.txt"\nupper = true')
    project.write("recipes/chain.toml", text)
    result = project.build()
    assert result.steps("built") == ["chain:src"]
    assert sorted(result.steps("cached")) == ["chain:mid", "chain:out", "chain:side"]


def test_a_target_builds_only_its_ancestors(project):
    result = project.build(["chain:mid"])
    assert sorted(result.steps("built")) == ["chain:mid", "chain:src"]
    assert not (project.root / "build/chain/out").exists()


def test_a_step_shared_by_two_recipes_is_built_once(project):
    project.write("recipes/copy.toml", '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n')
    result = project.build()
    assert len(result.steps("built")) == 4 and len(result.steps("cached")) == 1
    assert project.read("build/copy/src/data.txt") == "hello"


def test_deleted_build_output_is_restored_from_the_cache(project):
    project.build()
    (project.root / "build/chain/out/data.txt").unlink()
    result = project.build()
    assert result.steps("built") == []
    assert project.read("build/chain/out/data.txt") == "hello-mid-out"


def test_nested_outputs_are_cached_and_restored(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml") + "nested = true\n")
    project.build()
    assert project.read("build/chain/side/sub/extra.txt") == "nested"


def test_plan_says_why_each_step_would_build(project):
    project.build()
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('"-mid"', '"-m2"'))
    project.write("data/input.txt", "bye")
    result = project.build(dry_run=True)
    by_step = {e["step"]: e for e in result.reporter.events if e.get("event") == "step"}
    assert by_step["chain:src"]["status"] == "would-build"
    assert "input file data/input.txt changed" in by_step["chain:src"]["reasons"]
    assert by_step["chain:mid"]["reasons"] == ["upstream chain:src will build first"]
    # and nothing was built or recorded
    assert project.read("build/chain/src/data.txt") == "hello"


def test_plan_names_the_changed_parameter(project):
    project.build()
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('"-side"', '"-s2"'))
    result = project.build(dry_run=True)
    side = next(e for e in result.reporter.events if e.get("step") == "chain:side")
    assert side["reasons"] == ['parameter suffix: -side -> -s2']
    assert sorted(result.steps("cached")) == ["chain:mid", "chain:out", "chain:src"]


def test_remapping_a_kind_to_another_class_of_the_same_file_rebuilds_its_steps(project):
    project.write("kinds.py", project.read("kinds.py") + (
        "\n\nclass Shout(Join):\n    def run(self, ctx):\n        super().run(ctx)\n"
        "        out = ctx.out_dir / 'data.txt'\n        out.write_text(out.read_text().upper())\n"))
    project.build()
    project.write("optbuild.toml", project.read("optbuild.toml").replace('"kinds.py:Join"', '"kinds.py:Shout"'))
    result = project.build()
    assert sorted(result.steps("built")) == ["chain:mid", "chain:out", "chain:side"]
    assert project.read("build/chain/out/data.txt") == "HELLO-MID-OUT"


def test_editing_a_module_that_a_project_kind_imports_rebuilds_its_steps(project):
    project.write("kinds.py", project.read("kinds.py") + (
        "\n\nclass Tagged(Join):\n    def run(self, ctx):\n        from tag import TAG\n\n        super().run(ctx)\n"
        "        out = ctx.out_dir / 'data.txt'\n        out.write_text(out.read_text() + TAG)\n"))
    project.write("tag.py", "TAG = '!'\n")
    project.write("optbuild.toml", project.read("optbuild.toml").replace('"kinds.py:Join"', '"kinds.py:Tagged"'))
    project.build()
    project.write("tag.py", "TAG = '?'\n")
    result = project.build()
    assert sorted(result.steps("built")) == ALL  # every kind of kinds.py: the file imports tag.py
    assert project.read("build/chain/out/data.txt") == "hello-mid?-out?"
