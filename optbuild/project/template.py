"""Recipe templates: one pipeline, many models.

A template is a TOML file of ``[steps.NAME]`` (and ``[inputs.NAME]``) tables whose strings
may hold ``${args.NAME}``; its optional ``[template.args]`` table gives defaults. A recipe
uses it with a few lines:

    [recipe]
    template = "../templates/classifier.toml"   # relative to this recipe
    args = { model = "models/cnn.py:build", min_cosine = 0.99 }

and gets the template's steps with the arguments put in (a string that is exactly one
placeholder takes the argument with its type; a table key may hold placeholders too, e.g.
``dynamic_axes = { "${args.input}" = { 0 = "batch" } }``). Paths in them are relative to the
recipe, like the recipe's own. The recipe may add steps of its own, a ``[steps.NAME]`` of the
template's name changes the keys it sets in that step, and ``omit = ["NAME", ...]`` in its
``[recipe]`` leaves template steps out (before their placeholders are filled, so they need
no arguments; a recipe step of that name then replaces the template's whole). An argument
that the template neither uses nor defaults, a placeholder with no argument, or an omitted
name that is not a template step is an error naming the line.

Keys are made from the expanded steps' parameters, as for any step: a template edit
rebuilds exactly the steps whose parameters it changed, in every recipe that uses it, and
an edit of comments or layout rebuilds nothing. A problem in a step that came from the
template points at the template's line and names the recipe.
"""

from __future__ import annotations

import re
from typing import Any

from optbuild.common.errors import Problem, ProjectError
from optbuild.project.tomlsource import TomlDocument, load_toml

_PLACEHOLDER = re.compile(r"\$\{args\.([^}]*)\}")
SECTIONS = ("template", "inputs", "steps")
OMIT = "omit"  # [recipe] omit = [...]: template steps the recipe leaves out


def instantiate(recipe: TomlDocument, problems: list[Problem]) -> tuple[dict[str, Any], dict[str, TomlDocument]]:
    """The recipe's tables with its template's merged in (unchanged without a template), and
    the document each step was written in (where its problems point)."""
    own_steps = recipe.data.get("steps", {})
    where = dict.fromkeys(own_steps if isinstance(own_steps, dict) else {}, recipe)
    section = recipe.data.get("recipe", {})
    if not isinstance(section, dict) or not section.get("template"):
        if isinstance(section, dict) and OMIT in section:
            problems.append(recipe.problem(("recipe", OMIT), "omit leaves out steps of a template: this "
                                                             "recipe has no template"))
        return _without_omit(recipe.data), where
    template = _load(recipe, section["template"], problems)
    if template is None:
        return _without_omit(recipe.data), where
    args = _arguments(recipe, template, section.get("args", {}), problems)
    if args is None:
        return _without_omit(recipe.data), where
    omitted = _omitted(recipe, template, section.get(OMIT, []), problems)
    tables = template.data
    if omitted and isinstance(tables.get("steps"), dict):
        tables = {**tables, "steps": {k: v for k, v in tables["steps"].items() if k not in omitted}}
    used: set[str] = set()
    data = _substitute(template, tables, args, used, (), problems)
    for name in sorted(set(section.get("args", {})) - used - set(_defaults(template))):
        problems.append(recipe.problem(("recipe", "args", name), f"argument {name!r} is not used by "
                                                                  f"{template.path.name}"))
    template_steps = data.get("steps", {}) if isinstance(data.get("steps"), dict) else {}
    steps = dict(template_steps)
    for name, table in (own_steps.items() if isinstance(own_steps, dict) else ()):
        base = steps.get(name)
        steps[name] = {**base, **table} if isinstance(base, dict) and isinstance(table, dict) else table
    where = {name: (recipe if name in own_steps else template) for name in steps}
    inputs = {**(data.get("inputs") or {}), **(recipe.data.get("inputs") or {})}
    merged = {**{k: v for k, v in _without_omit(recipe.data).items() if k not in ("steps", "inputs")},
              "steps": steps}
    if inputs:
        merged["inputs"] = inputs
    return merged, where


def _without_omit(data: dict[str, Any]) -> dict[str, Any]:
    """The recipe's tables with ``omit`` taken out of ``[recipe]`` (this module's key)."""
    section = data.get("recipe")
    if not isinstance(section, dict) or OMIT not in section:
        return data
    return {**data, "recipe": {k: v for k, v in section.items() if k != OMIT}}


def _omitted(recipe: TomlDocument, template: TomlDocument, names: Any, problems: list[Problem]) -> set[str]:
    """The template steps that ``omit`` names (none where it has a problem, reported: the
    template's steps are then checked whole)."""
    loc = ("recipe", OMIT)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(recipe.problem(loc, 'expected a list of the template\'s step names: omit = ["fp16"]'))
        return set()
    steps = template.data.get("steps", {})
    unknown = [n for n in names if not isinstance(steps, dict) or n not in steps]
    if unknown:
        known = ", ".join(steps) if isinstance(steps, dict) else ""
        problems.append(recipe.problem(loc, f"{template.path.name} has no step {unknown[0]!r} "
                                            f"(its steps: {known})"))
        return set()
    return set(names)


def _load(recipe: TomlDocument, relative: Any, problems: list[Problem]) -> TomlDocument | None:
    loc = ("recipe", "template")
    if not isinstance(relative, str):
        problems.append(recipe.problem(loc, "expected the template file's path, relative to this recipe"))
        return None
    path = (recipe.path.parent / relative).resolve()
    try:
        template = load_toml(path)
    except ProjectError as exc:
        problems.append(recipe.problem(loc, f"template {relative!r}: " + "; ".join(str(p) for p in exc.problems)))
        return None
    for key in template.data:
        if key not in SECTIONS:
            problems.append(template.problem((key,), f"unknown key (a template has {', '.join(SECTIONS)})"))
            return None
    # its problems name the recipe it was expanded for
    return TomlDocument(template.path, template.data, template.text, context=f"recipe {recipe.path.name}")


def _defaults(template: TomlDocument) -> dict[str, Any]:
    section = template.data.get("template", {})
    args = section.get("args", {}) if isinstance(section, dict) else {}
    return args if isinstance(args, dict) else {}


def _arguments(recipe: TomlDocument, template: TomlDocument, given: Any,
               problems: list[Problem]) -> dict[str, Any] | None:
    if not isinstance(given, dict):
        problems.append(recipe.problem(("recipe", "args"), "expected a table of arguments: args = { model = ... }"))
        return None
    return {**_defaults(template), **given}


def _substitute(doc: TomlDocument, value: Any, args: dict[str, Any], used: set[str], loc: tuple,
                problems: list[Problem]) -> Any:
    """``value`` with every ``${args.NAME}`` replaced; an unknown NAME is a problem at ``loc``."""
    if isinstance(value, dict):
        return {_fill(doc, k, args, used, (*loc, k), problems, key=True):
                _substitute(doc, v, args, used, (*loc, k), problems)
                for k, v in value.items() if loc != () or k != "template"}
    if isinstance(value, list):
        return [_substitute(doc, v, args, used, (*loc, i), problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    return _fill(doc, value, args, used, loc, problems)


def _fill(doc: TomlDocument, text: str, args: dict[str, Any], used: set[str], loc: tuple,
          problems: list[Problem], *, key: bool = False) -> Any:
    """``text`` with its placeholders filled. Exactly one placeholder takes the argument with
    its type, unless ``text`` is a table ``key`` (a string, always)."""
    names = _PLACEHOLDER.findall(text)
    missing = [n for n in names if n not in args]
    if missing:
        problems.append(doc.problem(loc, f"${{args.{missing[0]}}}: no such argument; give it in the "
                                         "recipe's [recipe] args, or a default in [template.args]"))
        return text
    used.update(names)
    whole = _PLACEHOLDER.fullmatch(text)
    if whole and not key:
        return args[whole.group(1)]
    return _PLACEHOLDER.sub(lambda m: str(args[m.group(1)]), text)
