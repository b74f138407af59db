"""Recipe templates: one pipeline, many models.

A template is a TOML file of ``[steps.NAME]`` (and ``[inputs.NAME]``) tables whose strings
may hold ``${args.NAME}``; its optional ``[template.args]`` table gives defaults. A recipe
uses it with a few lines:

    [recipe]
    template = "../templates/classifier.toml"   # relative to this recipe
    args = { model = "models/cnn.py:build", min_cosine = 0.99 }

and gets the template's steps with the arguments put in (a string that is exactly one
placeholder takes the argument with its type). Paths in them are relative to the recipe,
like the recipe's own. The recipe may add steps of its own, and a ``[steps.NAME]`` of the
template's name changes the keys it sets in that step. An argument that the template
neither uses nor defaults, or a placeholder with no argument, is an error naming the line.

Keys are made from the expanded steps' parameters, as for any step: a template edit
rebuilds exactly the steps whose parameters it changed, in every recipe that uses it, and
an edit of comments or layout rebuilds nothing. A problem in a step that came from the
template points at the template's line and names the recipe.
"""

from __future__ import annotations

import re
from typing import Any

from optbuild.errors import Problem, ProjectError
from optbuild.tomlsource import TomlDocument, load_toml

_PLACEHOLDER = re.compile(r"\$\{args\.([^}]*)\}")
SECTIONS = ("template", "inputs", "steps")


def instantiate(recipe: TomlDocument, problems: list[Problem]) -> tuple[dict[str, Any], dict[str, TomlDocument]]:
    """The recipe's tables with its template's merged in (unchanged without a template), and
    the document each step was written in (where its problems point)."""
    own_steps = recipe.data.get("steps", {})
    where = dict.fromkeys(own_steps if isinstance(own_steps, dict) else {}, recipe)
    section = recipe.data.get("recipe", {})
    if not isinstance(section, dict) or not section.get("template"):
        return recipe.data, where
    template = _load(recipe, section["template"], problems)
    if template is None:
        return recipe.data, where
    args = _arguments(recipe, template, section.get("args", {}), problems)
    if args is None:
        return recipe.data, where
    used: set[str] = set()
    data = _substitute(template, template.data, args, used, (), problems)
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
    merged = {**{k: v for k, v in recipe.data.items() if k not in ("steps", "inputs")}, "steps": steps}
    if inputs:
        merged["inputs"] = inputs
    return merged, where


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
    return TomlDocument(template.path, template.data, template.lines, context=f"recipe {recipe.path.name}")


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
        return {k: _substitute(doc, v, args, used, (*loc, k), problems) for k, v in value.items()
                if loc != () or k != "template"}
    if isinstance(value, list):
        return [_substitute(doc, v, args, used, (*loc, i), problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    names = _PLACEHOLDER.findall(value)
    missing = [n for n in names if n not in args]
    if missing:
        problems.append(doc.problem(loc, f"${{args.{missing[0]}}}: no such argument; give it in the "
                                         "recipe's [recipe] args, or a default in [template.args]"))
        return value
    used.update(names)
    whole = _PLACEHOLDER.fullmatch(value)
    if whole:
        return args[whole.group(1)]
    return _PLACEHOLDER.sub(lambda m: str(args[m.group(1)]), value)

