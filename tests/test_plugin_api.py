"""optbuild.plugin is the one module a step kind needs: a project kind written against it alone
builds with the real CLI, and the import paths that the package layout moved still load a
kind for one release, warning its author where to import from instead."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from plugins.projects import ProjectDir

from optbuild import plugin
from optbuild.common.errors import StepError
from optbuild.steps.base import Step

# A project's kinds that import nothing of optbuild but optbuild.plugin: a source step, and one
# that reads its input's artifact and calls a project callable.
PLUGIN_KINDS = '''
from optbuild.plugin import Artifact, CallableRef, InputPath, Step, StepContext, StepError, StepParams, StepRef
from optbuild.plugin import callable_at


class WordsParams(StepParams):
    path: InputPath


class Words(Step):
    """Reads a file of words."""

    Params = WordsParams
    primary_output = "words.txt"

    def run(self, ctx: StepContext) -> None:
        (ctx.out_dir / "words.txt").write_text(ctx.path(self.params.path).read_text())


class ShapeParams(StepParams):
    input: StepRef
    transform: CallableRef


class Shape(Step):
    """Passes its input's words through a project callable."""

    Params = ShapeParams
    primary_output = "words.txt"

    def run(self, ctx: StepContext) -> None:
        source: Artifact = ctx.inputs["input"]
        text = source.primary.read_text()
        if not text.strip():
            raise StepError(f"{source.step} gives no words: write some in its file")
        with callable_at(self.params.transform, ctx.base_dir, StepError) as transform:
            (ctx.out_dir / "words.txt").write_text(transform(text))
        ctx.metrics["words"] = len(text.split())
'''

# A kind as written before the package layout moved optbuild.errors and optbuild.pyimports.
OLD_PATH_KINDS = '''
from optbuild.errors import StepError
from optbuild.pyimports import local_imports
from optbuild.steps.base import InputPath, Step, StepParams


class ImportsParams(StepParams):
    path: InputPath


class Imports(Step):
    """Lists the project's modules that a Python file imports."""

    Params = ImportsParams
    primary_output = "imports.txt"

    def run(self, ctx):
        entry = ctx.path(self.params.path)
        if entry.suffix != ".py":
            raise StepError(f"{entry} is no Python file")
        (ctx.out_dir / "imports.txt").write_text(" ".join(p.name for p in local_imports(entry, ctx.project_root)))
'''

CONFIG = '[project]\nrecipes = ["recipes/*.toml"]\n\n[kinds]\nwords = "kinds.py:Words"\nshape = "kinds.py:Shape"\n'
RECIPE = '''
[steps.words]
kind = "words"
path = "../data/words.txt"

[steps.shout]
kind = "shape"
input = "words"
transform = "../tools/shape.py:shout"
'''
OLD_CONFIG = '[project]\nrecipes = ["recipes/*.toml"]\n\n[kinds]\nimports = "kinds.py:Imports"\n'
OLD_RECIPE = '[steps.imports]\nkind = "imports"\npath = "../tools/main.py"\n'
MOVED = [("optbuild.errors", "optbuild.common.errors", "StepError"),
         ("optbuild.pyimports", "optbuild.common.pyimports", "local_imports")]


def words_project(root, kinds: str, config: str, recipe: str) -> ProjectDir:
    proj = ProjectDir(root)
    proj.write("optbuild.toml", config)
    proj.write("kinds.py", kinds)
    proj.write("recipes/text.toml", recipe)
    proj.write("tools/shape.py", "def shout(text):\n    return text.upper()\n")
    proj.write("tools/main.py", "import shape\n")
    proj.write("data/words.txt", "hello world")
    return proj


def test_a_project_kind_written_against_optbuild_plugin_alone_builds_with_the_cli(tmp_path):
    proj = words_project(tmp_path / "proj", PLUGIN_KINDS, CONFIG, RECIPE)
    run = proj.cli("build", "--json")
    assert run.returncode == 0, run.stderr
    assert run.steps("built") == ["text:shout", "text:words"]
    assert proj.read("build/text/shout/words.txt") == "HELLO WORLD"
    assert "deprecated" not in run.stderr


def test_a_project_kinds_step_error_reaches_the_user_as_its_message(tmp_path):
    proj = words_project(tmp_path / "proj", PLUGIN_KINDS, CONFIG, RECIPE)
    proj.write("data/words.txt", " ")
    run = proj.cli("build")
    assert run.returncode != 0
    assert "text:words gives no words: write some in its file" in run.stdout + run.stderr


@pytest.mark.parametrize("params, found", [
    ("", "Words has no Params"),  # the generic base alone (Step[WordsParams]) names no model
    ("Params = dict", "Words.Params is <class 'dict'>"),
])
def test_a_kind_without_a_params_model_is_named_in_the_recipes_error_not_a_traceback(tmp_path, params, found):
    kinds = PLUGIN_KINDS.replace("class Words(Step):", "class Words(Step[WordsParams]):").replace(
        "    Params = WordsParams\n", f"    {params}\n")
    proj = words_project(tmp_path / "proj", kinds, CONFIG, RECIPE)
    run = proj.cli("build")
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert f"steps.words.kind: step kind 'words' ({proj.root / 'kinds.py'}:Words) cannot load: {found}: a kind " \
           "names the model of its parameters, a subclass of optbuild.plugin.StepParams" in run.stderr, run.stderr


def test_a_kind_written_against_the_moved_paths_still_builds_and_its_author_is_told_where_to_go(tmp_path):
    proj = words_project(tmp_path / "proj", OLD_PATH_KINDS, OLD_CONFIG, OLD_RECIPE)
    run = proj.cli("build", "--json")
    assert run.returncode == 0, run.stderr
    assert proj.read("build/text/imports/imports.txt") == "shape.py"
    for old, _new, name in MOVED:  # the warning names the kind's own line, and the way out
        assert f"kinds.py:{OLD_PATH_KINDS.splitlines().index(f'from {old} import {name}') + 1}: " \
               f"DeprecationWarning: {old} is deprecated" in run.stderr, run.stderr
        assert f"import {name} from optbuild.plugin" in run.stderr


@pytest.mark.parametrize(("old", "new", "name"), MOVED)
def test_an_old_path_warns_and_gives_the_moved_modules_objects(old, new, name, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh: its warning runs again
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated .*: import {name} from optbuild\.plugin"):
        alias = importlib.import_module(old)
    moved = importlib.import_module(new)
    assert alias.__all__ and all(getattr(alias, each) is getattr(moved, each) for each in alias.__all__)
    assert getattr(alias, name) is getattr(plugin, name)


def test_every_name_of_optbuild_plugin_resolves_and_is_documented():
    assert {"Step", "StepParams", "StepContext", "StepRef", "InputPath", "CallableRef", "StepError",
            "Artifact"} <= set(plugin.__all__)
    for name in plugin.__all__:
        assert hasattr(plugin, name), name
        assert f"``{name}``" in plugin.__doc__, f"optbuild.plugin's docstring does not say what {name} is for"
    # the classes optbuild itself checks against: a kind's Step is a Step, its StepError a StepError
    assert plugin.Step is Step and plugin.StepError is StepError


def test_importing_optbuild_plugin_loads_no_heavy_library():
    """A kind's module imports it at module level, and loading a project imports the kinds."""
    code = ("import sys, optbuild.plugin; "
            "print([m for m in ('numpy', 'torch', 'onnx', 'onnxruntime', 'tensorrt') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
