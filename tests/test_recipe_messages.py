"""Validation messages in the recipe's words (#10 item 2).

An unknown key names the closest known one; a `profiles` value of the wrong form shows the
expected form, written with the recipe's own values; a misspelled `file.py:callable` or
`data_args` keyword is caught when the project loads, by reading the file (never running
it). Every message still names the file, the line and the field.
"""

from __future__ import annotations

import pytest

from optbuild.common.errors import ProjectError
from optbuild.project.recipe import load_project


def problems(project) -> list[str]:
    with pytest.raises(ProjectError) as info:
        load_project(project.root)
    return [str(p) for p in info.value.problems]


def where(project, relative: str, line: int) -> str:
    return f"{project.root / relative}:{line}: "


# --- a. unknown keys ----------------------------------------------------------------------------
@pytest.mark.parametrize("file, old, new, expected", [
    ("optbuild.toml", "jobs = 2", "jbos = 2", "10: build.jbos: unknown key; did you mean 'jobs'?"),
    ("optbuild.toml", "[build]", "[biuld]", "9: biuld: unknown key; did you mean 'build'?"),
    ("recipes/chain.toml", "# a three-step chain and a side branch",
     '[recipe]\ndescripton = "a chain"', "2: recipe.descripton: unknown key; did you mean 'description'?"),
    ("recipes/chain.toml", "[steps.side]", "[step.side]", "16: step: unknown key; did you mean 'steps'?"),
    ("recipes/chain.toml", 'suffix = "-mid"', 'sufix = "-mid"', "9: steps.mid.sufix: unknown key; did you mean 'suffix'?"),
    ("recipes/chain.toml", 'kind = "text"', 'knid = "text"\nkind = "text"',
     "3: steps.src.knid: unknown key; did you mean 'kind'?"),
])
def test_an_unknown_key_names_the_closest_known_one(project, file, old, new, expected):
    project.write(file, project.read(file).replace(old, new))
    assert problems(project) == [f"{project.root / file}:{expected}"]


def test_an_unknown_key_like_no_known_one_lists_them(project):
    project.write("recipes/chain.toml", project.read("recipes/chain.toml").replace('suffix = "-mid"', "colour = 3"))
    assert problems(project) == [where(project, "recipes/chain.toml", 9) + "steps.mid.colour: unknown key "
                                 "(expected one of: kind, enabled, input, other, suffix, sleep, fail, nested)"]


def test_an_unknown_key_inside_a_profile_names_the_closest_bound(project):
    project.write("recipes/engine.toml", '[steps.rtx]\nkind = "engine"\nbackend = "tensorrt-rtx"\n'
                  'input = "chain:src"\nprofiles = [{ x = { min = [1, 4], opt = [2, 4], mx = [8, 4] } }]\n')
    at = where(project, "recipes/engine.toml", 5)
    assert problems(project) == [at + "steps.rtx.profiles.0.x.max: required key is missing",
                                 at + "steps.rtx.profiles.0.x.mx: unknown key; did you mean 'max'?"]


def test_a_validator_speaks_without_pydantic_prefix(project):
    project.write("recipes/engine.toml", '[steps.rtx]\nkind = "engine"\nbackend = "tensorrt-rtx"\n'
                  'input = "chain:src"\nprofiles = [{}]\n')
    assert problems(project) == [where(project, "recipes/engine.toml", 5) + "steps.rtx.profiles: profile 0 names no input"]


# --- b. the form of `profiles` --------------------------------------------------------------------
FORM = "(a list of tables, one per optimization profile, each mapping an input name to its min, opt and max shapes)"
EXAMPLE = ("expected a list of tables, one per optimization profile, each mapping an input name to its min, opt "
           "and max shapes, e.g. profiles = [{ image = { min = [1, 3, 224, 224], opt = [8, 3, 224, 224], "
           "max = [32, 3, 224, 224] } }]")


@pytest.mark.parametrize("backend", ["tensorrt-rtx", "tensorrt"])
@pytest.mark.parametrize("profiles, expected", [
    ('[{ input = "x", min = [1, 3, 224, 224], opt = [8, 3, 224, 224], max = [32, 3, 224, 224] }]',
     "profile 0 has min / opt / max at its top level: they go in a table named after the input; write "
     "profiles = [{ x = { min = [1, 3, 224, 224], opt = [8, 3, 224, 224], max = [32, 3, 224, 224] } }] " + FORM),
    ("{ x = [1, 3, 224, 224] }",
     "profiles is one table, not a list of them; write profiles = [{ x = { min = [1, 3, 224, 224], "
     "opt = [1, 3, 224, 224], max = [1, 3, 224, 224] } }] " + FORM),
    ("{ x = { min = [1, 4], opt = [2, 4], max = [8, 4] } }",
     "profiles is one table, not a list of them; write profiles = [{ x = { min = [1, 4], opt = [2, 4], "
     "max = [8, 4] } }] " + FORM),
    ("[{ x = [1, 4] }]",
     "input 'x' of profile 0 has one shape, not min, opt and max (the same three make a fixed shape); write "
     "profiles = [{ x = { min = [1, 4], opt = [1, 4], max = [1, 4] } }] " + FORM),
    ("[{ min = [1, 4], max = [8, 4] }]",
     "profile 0 has min / max at its top level: they go in a table named after the input; write "
     "profiles = [{ INPUT_NAME = { min = [1, 4], opt = [...], max = [8, 4] } }] " + FORM),
    ('"x"', "profiles is a string; " + EXAMPLE),
    ('["x"]', "profile 0 is a string, not a table; " + EXAMPLE),
    ("[{ x = { min = [1, 4], opt = [2, 4], max = [8, 4] }, mask = 3 }]",
     "input 'mask' of profile 0 is an integer, not a table of min, opt and max; " + EXAMPLE),
])
def test_profiles_of_the_wrong_form_show_the_expected_form(project, backend, profiles, expected):
    project.write("recipes/engine.toml", f'[steps.e]\nkind = "engine"\nbackend = "{backend}"\n'
                  f'input = "chain:src"\nprofiles = {profiles}\n')
    assert problems(project) == [where(project, "recipes/engine.toml", 5) + "steps.e.profiles: " + expected]


# --- c. callables, read and never run -------------------------------------------------------------
NET = '''\
import helpers
from helpers import loader

open(__file__ + ".ran", "w").close()  # would show that loading the project ran this file


def build():
    return loader()


def images(count=64, seed=0):
    yield from ()


def windows(size, *, seed=0):
    yield from ()


def _private():
    pass
'''


@pytest.fixture
def net(project):
    project.write("models/net.py", NET)
    return project


def recipe(net, text: str) -> str:
    net.write("recipes/m.toml", text)
    return "recipes/m.toml"


def calibrate(data: str, data_args: str = "{}") -> str:
    return f'[steps.cal]\nkind = "calibrate"\ninput = "chain:src"\ndata = "{data}"\ndata_args = {data_args}\n'


@pytest.mark.parametrize("text, expected", [
    ('[steps.export]\nkind = "export"\nmodel = "../models/net.py:biuld"\n',
     "3: steps.export.model: ../models/net.py defines no 'biuld'; did you mean 'build'?"),
    ('[steps.export]\nkind = "export"\nmodel = "../models/net.py:windows"\n',
     "3: steps.export.model: windows() is called with no arguments but needs 'size'"),
    (calibrate("../models/net.py:imgaes"), "4: steps.cal.data: ../models/net.py defines no 'imgaes'; did you mean 'images'?"),
    (calibrate("../models/net.py:zzz"),
     "4: steps.cal.data: ../models/net.py defines no 'zzz' (its functions: build, images, windows)"),
    (calibrate("../models/net.py:images", "{ cuont = 8, seed = 1 }"),
     "5: steps.cal.data_args.cuont: images() takes no argument 'cuont'; did you mean 'count'?"),
    (calibrate("../models/net.py:images", "{ colour = 1 }"),
     "5: steps.cal.data_args.colour: images() takes no argument 'colour' (its arguments: count, seed)"),
    (calibrate("../models/net.py:windows", "{ seed = 1 }"),
     "5: steps.cal.data_args: windows() needs 'size': give it in data_args"),
    (('[steps.v]\nkind = "verify"\nreference = "chain:src"\ncandidate = "chain:mid"\nmax_abs = 0.1\n'
      'data = "../models/net.py:images"\ndata_args = { count = 8, sed = 1 }\n'),
     "7: steps.v.data_args.sed: images() takes no argument 'sed'; did you mean 'seed'?"),
])
def test_a_callable_or_keyword_the_file_lacks_fails_the_load(net, text, expected):
    file = recipe(net, text)
    assert problems(net) == [f"{net.root / file}:{expected}"]
    assert not (net.root / "models/net.py.ran").exists()


@pytest.mark.parametrize("source, ref", [
    ("def feeds(**options):\n    pass\n", "feeds"),
    ("from helpers import *\n", "feeds"),
    ("from helpers import feeds\n", "feeds"),
    ("import helpers as feeds\n", "feeds"),
    ("feeds = make_feeds()\n", "feeds"),
    ("class feeds:\n    pass\n", "feeds"),
    ("class Data:\n    def feeds(self):\n        pass\n", "Data.feeds"),
    ("globals()['feeds'] = make_feeds()\n", "feeds"),
    ("exec('def feeds(**kw): pass')\n", "feeds"),
    ("import sys\nsetattr(sys.modules[__name__], 'feeds', make_feeds())\n", "feeds"),
    ("def __getattr__(name):\n    return make_feeds()\n", "feeds"),
    ("def setup():\n    global feeds\n    feeds = make_feeds()\nsetup()\n", "feeds"),
    ("import functools\n@functools.cache\ndef feeds(count=1):\n    pass\n", "feeds"),
    ("if FAST:\n    def feeds():\n        pass\nelse:\n    def feeds(anything):\n        pass\n", "feeds"),
    ("for feeds in [make_feeds()]:\n    pass\n", "feeds"),
    ("async def feeds(count=1):\n    pass\n", "feeds"),
    ("def feeds(count, /):\n    pass\n", "feeds"),
    ("def feeds(:\n", "feeds"),  # does not parse: left to the step, which reports the import error
])
def test_what_reading_cannot_judge_is_accepted(project, source, ref):
    project.write("models/data.py", source)
    project.write("recipes/m.toml", calibrate(f"../models/data.py:{ref}", "{ anything = 1 }"))
    assert "m:cal" in load_project(project.root).steps


def test_a_fixed_file_is_read_again(net):
    recipe(net, calibrate("../models/net.py:feeds"))
    (message,) = problems(net)
    assert message.endswith("steps.cal.data: ../models/net.py defines no 'feeds' (its functions: build, images, windows)")
    net.write("models/net.py", NET + "\n\ndef feeds():\n    yield from ()\n")
    assert "m:cal" in load_project(net.root).steps


def test_a_missing_file_is_reported_once(net):
    recipe(net, calibrate("../models/gone.py:images"))
    (message,) = problems(net)
    assert message.startswith(where(net, "recipes/m.toml", 4) + "steps.cal.data: file not found:")


def test_cli_plan_reports_a_misspelled_callable_without_running_anything(net):
    recipe(net, '[steps.export]\nkind = "export"\nmodel = "../models/net.py:biuld"\n')
    run = net.cli("plan")
    assert run.returncode == 2
    assert "m.toml:3: steps.export.model: ../models/net.py defines no 'biuld'; did you mean 'build'?" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (net.root / "models/net.py.ran").exists()


HOOKS = '''\
from optbuild.steps.base import CallableRef, Step, StepParams


class HookParams(StepParams):
    hook: CallableRef
    more: list[CallableRef] = []


class Hook(Step):
    Params = HookParams
'''


def test_a_local_kinds_callables_are_checked_by_name_only(net):
    net.write("hooks.py", HOOKS)
    net.write("optbuild.toml", net.read("optbuild.toml").replace("[kinds]\n", '[kinds]\nhook = "hooks.py:Hook"\n'))
    recipe(net, '[steps.h]\nkind = "hook"\nhook = "../models/net.py:windows"\n'
                'more = ["../models/net.py:build", "../models/net.py:imagse"]\n')
    # windows() needs an argument, but how a local kind calls it is its own affair
    assert problems(net) == [where(net, "recipes/m.toml", 4)
                             + "steps.h.more: ../models/net.py defines no 'imagse'; did you mean 'images'?"]
