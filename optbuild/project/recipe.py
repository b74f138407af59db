"""The project: ``optbuild.toml`` and the recipes it names, validated as a whole.

Loading collects every problem (file, line, field, message) before failing, so a user
fixes a broken project in one pass; nothing is built when the project does not validate.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optbuild.common import callables
from optbuild.common.errors import Problem, ProjectError
from optbuild.common.paths import folder_problem, name_problem
from optbuild.common.projectroot import CONFIG_NAME, project_root
from optbuild.model.inputdecl import InputDecls
from optbuild.project import matrix, template
from optbuild.project.config import ProjectConfig, RecipeInputs, RecipeSection
from optbuild.project.overrides import (
    Override,
    apply_overrides,
    blame_overrides,
    parse_override,
    unknown_override_recipes,
)
from optbuild.project.parsed import ParsedRecipes
from optbuild.project.problems import non_finite_problems, unknown_key, validation_problems
from optbuild.project.tomlsource import TomlDocument, load_toml
from optbuild.steps import registry
from optbuild.steps.base import Step, key_folders


@dataclass
class StepSpec:
    """One step of one recipe, validated; its id is "recipe:step"."""

    id: str
    recipe: str
    name: str
    kind: str  # registry name: "export", "engine/tensorrt-rtx", ...
    implementation: str  # where the kind is implemented: "module:Class" or "/path/file.py:Class"
    step: Step
    doc: TomlDocument
    deps: dict[str, str] = field(default_factory=dict)  # param field -> upstream step id
    enabled: bool = True  # false: parked, skipped with its dependents, without deleting it
    # Step.key_files() as found when the project was loaded (a Project is a snapshot):
    # finding an export's imports means reading its sources, which planning need not repeat.
    key_files: tuple[Path, ...] | None = None
    key_folders: tuple[Path, ...] | None = None  # steps.base.key_folders of key_files, then
    overrides: dict[str, Any] = field(default_factory=dict)  # -S for this run: param -> value
    # The recipe's [inputs.NAME] with the step's own entries, whole: what `optbuild bench`
    # feeds the step's model. The step runs on and is keyed on the part it reads (inputs_read).
    declared: InputDecls | None = None

    @property
    def loc(self) -> tuple[str, ...]:
        return ("steps", self.name)

    def problem(self, message: str, *fields: str) -> Problem:
        return self.doc.problem((*self.loc, *fields), message)


@dataclass
class Project:
    root: Path
    config_file: Path
    config: ProjectConfig
    recipes: dict[str, Path]
    steps: dict[str, StepSpec]  # in load order: recipe files sorted, steps as written
    loaded: frozenset[str] | None = None  # the recipes whose steps are in ``steps``; None: all
    # The text each TOML file (optbuild.toml, recipes, templates) held as loaded, by absolute
    # path: what the no-op stamp vouches for by content when a file changed just before the build.
    texts: dict[str, str] = field(default_factory=dict)

    def has_recipe_loaded(self, recipe: str) -> bool:
        """Whether the steps of ``recipe`` were loaded (``load_project``'s ``recipes``)."""
        return self.loaded is None or recipe in self.loaded

    @cached_property  # asked once a step at 10,000 steps; the config does not change
    def cache_dir(self) -> Path:
        return self.root / self.config.cache.dir

    @cached_property
    def build_dir(self) -> Path:
        return self.root / self.config.project.build_dir

    @cached_property
    def lock_file(self) -> Path:
        return self.root / self.config.project.lock_file

    def step_folder(self, sid: str) -> str:
        """``<recipe>/<step>``: where a step's outputs are put, under the build folder (the one
        place that names it; what optbuild wrote there is recorded under this name)."""
        spec = self.steps[sid]
        return f"{spec.recipe}/{spec.name}"

    def step_dir(self, sid: str) -> Path:
        """``build/<recipe>/<step>`` (the builder proves it inside the build folder before
        writing there)."""
        return self.build_dir / self.step_folder(sid)


def find_config(start: Path) -> Path:
    """The nearest optbuild.toml at or above ``start``."""
    root = project_root(start)
    if root is not None:
        return Path(root) / CONFIG_NAME
    # It marks the project root, under which build/ and cache/ are written: never guessed.
    raise ProjectError([Problem(
        f"no {CONFIG_NAME} in {start.resolve()} or any parent directory. It marks the project's root "
        f"(build/ and cache/ go beside it): create one there, e.g. `touch {CONFIG_NAME}`. An empty "
        "file means the defaults: recipes in recipes/*.toml, outputs in build/, the cache in cache/")])


def _load_config(path: Path) -> tuple[ProjectConfig, TomlDocument]:
    doc = load_toml(path)
    try:
        return ProjectConfig.model_validate(doc.data), doc
    except ValidationError as exc:
        raise ProjectError(validation_problems(doc, (), exc, ProjectConfig)) from None


def _check_folders(config: ProjectConfig, doc: TomlDocument, recipe_files: dict[str, Path],
                   problems: list[Problem]) -> None:
    """The build and cache folders are emptied by ``optbuild clean``: neither may be (or hold)
    the project or its files, nor lie inside the other, nor lie outside the project unless
    ``[project] allow_outside`` says so."""
    root = doc.path.parent
    settings = {("project", "build_dir"): config.project.build_dir, ("cache", "dir"): config.cache.dir}
    protected = [doc.path, *recipe_files.values()]
    bad = False
    for loc, setting in settings.items():
        if (why := folder_problem(root / setting, root, protected)) is not None:
            problems.append(doc.problem(loc, f"{setting!r} {why}: optbuild clean would delete it"))
            bad = True
        elif not config.project.allow_outside and (why := _outside(root / setting, root)) is not None:
            problems.append(doc.problem(loc, f"{setting!r} {why}: set allow_outside = true in [project] "
                                             "to build or cache there"))
            bad = True
    build, cache = ((root / setting).resolve() for setting in settings.values())
    if not bad and (build.is_relative_to(cache) or cache.is_relative_to(build)):
        problems.append(doc.problem(("cache", "dir"), f"the cache folder {cache} and the build folder "
                                                      f"{build} must not lie inside one another"))


def _outside(folder: Path, root: Path) -> str | None:
    """Why ``folder`` lies outside the project folder ``root`` (None if it does not),
    symbolic links followed."""
    real, top = folder.resolve(), root.resolve()
    if real.is_relative_to(top):
        return None
    return f"lies outside the project folder {top} (it is {real})"


def _load_step(doc: TomlDocument, recipe: str, name: str, raw: Any, problems: list[Problem],
               root: Path, local: dict[str, str], inputs: dict[str, Any], *, base_dir: Path) -> StepSpec | None:
    """One step; ``doc``: where it was written (a template's steps are), ``base_dir``: what
    its relative paths are relative to (its recipe's folder)."""
    loc = ("steps", name)
    if not isinstance(raw, dict):
        problems.append(doc.problem(loc, "a step must be a table ([steps.NAME])"))
        return None
    if (why := name_problem(name)) is not None:
        problems.append(doc.problem(loc, f"invalid step name {name!r}: it {why}"))
        return None
    kind, backend = raw.get("kind"), raw.get("backend")
    if not isinstance(kind, str):
        problems.append(doc.problem((*loc, "kind"), "required key 'kind' is missing or not a string"))
        return None
    name_in_registry = registry.resolve(kind, backend if isinstance(backend, str) else None, local)
    choices = registry.backends(kind, local)
    if name_in_registry is None or (choices and "/" not in name_in_registry):
        if choices:
            what = f"unknown backend {backend!r}" if backend else "'backend' is required"
            problems.append(doc.problem(
                (*loc, "backend" if backend else "kind"),
                f"{what} for kind {kind!r} (one of: {', '.join(choices)})"))
        else:
            known = registry.known_kinds(local)
            hint = difflib.get_close_matches(kind, known, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            problems.append(doc.problem(
                (*loc, "kind"), f"unknown step kind {kind!r}{suggestion} (known: {', '.join(known)})"))
        return None
    implementation = registry.implementation_of(name_in_registry, local)
    try:
        cls = registry.step_class(implementation)
    except (ImportError, AttributeError, TypeError, SyntaxError, OSError) as exc:
        problems.append(doc.problem((*loc, "kind"), f"step kind {kind!r} ({implementation}) cannot load: {exc}"))
        return None
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        problems.append(doc.problem((*loc, "enabled"), f"expected true or false, got {enabled!r}"))
        return None
    params_raw = {k: v for k, v in raw.items() if k not in ("kind", "enabled")}
    infinite = non_finite_problems(doc, loc, params_raw)
    if inputs and "inputs" in cls.Params.model_fields and isinstance(params_raw.get("inputs", {}), dict):
        params_raw["inputs"] = {**inputs, **params_raw.get("inputs", {})}  # the step's entries win
    try:
        params = cls.Params.model_validate(params_raw)
    except ValidationError as exc:
        fields = [p.field for p in infinite]
        problems.extend(infinite)
        problems.extend(p for p in validation_problems(doc, loc, exc, cls.Params, top_keys=("kind", "enabled"))
                        if not any(p.field == f or (p.field or "").startswith(f"{f}.") for f in fields))
        return None
    if infinite:
        problems.extend(infinite)
        return None
    declared = getattr(params, "inputs", None)
    if "inputs" in cls.Params.model_fields:  # only what the step reads runs and is keyed
        params = params.model_copy(update={"inputs": params.inputs_read()})
    step = cls(params, base_dir, root)
    return StepSpec(f"{recipe}:{name}", recipe, name, name_in_registry, implementation, step, doc,
                    enabled=enabled, declared=declared)


def _load_recipe(path: Path, recipe: str, root: Path, problems: list[Problem], local: dict[str, str],
                 invalid: set[str], overrides: list[Override], parsed: ParsedRecipes | None,
                 texts: dict[str, str]) -> list[StepSpec]:
    """The valid steps of one recipe; ids of steps that failed validation go to ``invalid``,
    the texts of the recipe and its template to ``texts``."""
    try:
        doc = load_toml(path, parsed)
    except ProjectError as exc:
        problems.extend(exc.problems)
        return []
    data, docs = template.instantiate(doc, problems)
    texts.update((os.path.abspath(d.path), d.text) for d in (doc, *docs.values()))
    for key in data:
        if key not in ("recipe", "inputs", "steps"):
            message = unknown_key(key, ["recipe", "inputs", "steps"],
                                  "a recipe has [recipe], [inputs.NAME] and [steps.NAME]")
            problems.append(doc.problem((key,), message))
    try:
        RecipeSection.model_validate(data.get("recipe", {}))
    except ValidationError as exc:
        problems.extend(validation_problems(doc, ("recipe",), exc, RecipeSection))
    inputs: dict[str, Any] = {}
    try:
        RecipeInputs.model_validate({"inputs": data.get("inputs", {})})
        if not (infinite := non_finite_problems(doc, ("inputs",), data.get("inputs", {}))):
            inputs = data.get("inputs", {})  # given to the steps, keyed on the parts each reads
        problems.extend(infinite)
    except ValidationError as exc:
        problems.extend(validation_problems(doc, (), exc, RecipeInputs))
    steps = data.get("steps", {})
    if not isinstance(steps, dict) or not steps:
        problems.append(doc.problem(("steps",), "a recipe needs at least one [steps.NAME] table"))
        return []
    steps, failed = matrix.expand(steps, docs, problems)
    invalid.update(f"{recipe}:{name}" for name in failed)
    applied = apply_overrides(overrides, recipe, steps, problems)
    specs = []
    for name, raw in steps.items():
        found: list[Problem] = []
        if (spec := _load_step(docs.get(name, doc), recipe, name, raw, found, root, local, inputs,
                               base_dir=path.parent)) is not None:
            spec.overrides = {o.param: o.value for o in applied.get(name, [])}
            specs.append(spec)
        else:
            invalid.add(f"{recipe}:{name}")
        problems.extend(blame_overrides(found, name, applied.get(name, [])))
    return specs


def _resolve_refs(steps: dict[str, StepSpec], problems: list[Problem], invalid: set[str]) -> None:
    for spec in steps.values():
        resolved: list[tuple[str, str]] = []  # (field, step id), a list field's items in order
        for field_name, ref in spec.step.step_refs().items():
            target = ref if ":" in ref else f"{spec.recipe}:{ref}"
            if target in invalid or matrix.base_name(target) in invalid:
                continue  # already reported (the step, or its matrix); a second message would be noise
            if target.endswith("[*]"):
                resolved.extend((field_name, t) for t in _all_instances(spec, field_name, target, steps, problems))
                continue
            if target == spec.id:
                problems.append(spec.problem("a step cannot take its own output", field_name))
            elif target not in steps:
                hint = difflib.get_close_matches(target, list(steps), n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                problems.append(spec.problem(f"no step {target!r}{suggestion}", field_name))
            else:
                resolved.append((field_name, target))
        counts: dict[str, int] = {}
        for field_name, target in resolved:
            name, dot, _ = field_name.partition(".")
            if dot:  # a list field: its items numbered again, a NAME[*] having grown it
                counts[name] = counts.get(name, -1) + 1
                field_name = f"{name}.{counts[name]}"
            spec.deps[field_name] = target


def _all_instances(spec: StepSpec, field_name: str, target: str, steps: dict[str, StepSpec],
                   problems: list[Problem]) -> list[str]:
    """The instances of the matrix step ``target`` (``recipe:NAME[*]``) names."""
    base = target.removesuffix("[*]")
    instances = [sid for sid in steps if "[" in sid and matrix.base_name(sid) == base]
    if not instances:
        problems.append(spec.problem(f"{target!r}: {base!r} is not a matrix step", field_name.partition(".")[0]))
    return instances


def _check_files(steps: dict[str, StepSpec], problems: list[Problem]) -> None:
    for spec in steps.values():
        try:
            files = spec.step.key_files()
        except FileNotFoundError as exc:
            problems.append(spec.problem(f"file not found: {exc.filename}"))
            continue
        spec.key_files = tuple(files)
        spec.key_folders = tuple(key_folders(spec.step, files))
        for path in files:
            if not path.is_file():
                field_name = _field_naming(spec, path)
                problems.append(spec.problem(f"file not found: {path}", *field_name))


def _check_calls(steps: dict[str, StepSpec], problems: list[Problem]) -> None:
    """Callables that their files certainly lack, or call arguments they do not take."""
    for spec in steps.values():
        for call in spec.step.calls():
            for fields, message in callables.check(call, spec.step.base_dir):
                problems.append(spec.problem(message, *fields))


def _field_naming(spec: StepSpec, path: Path) -> tuple[str, ...]:
    """The param field whose value names ``path`` (to point at the right line)."""
    for name, value in spec.step.params:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                candidate = item.rpartition(":")[0] if ".py:" in item else item
                if (spec.step.base_dir / candidate).resolve() == path:
                    return (name,)
    return ()


def _local_kinds(config: ProjectConfig, config_file: Path, problems: list[Problem]) -> dict[str, str]:
    """Project-local kinds with absolute file paths; missing files are problems."""
    local = {}
    for kind, target in config.kinds.items():
        file, sep, attr = target.rpartition(":")
        path = (config_file.parent / file).resolve()
        if not sep or not file.endswith(".py") or not attr.isidentifier():
            problems.append(Problem(f"expected 'path/to/file.py:Class', got {target!r}",
                                    file=config_file, field=f"kinds.{kind}"))
        elif not path.is_file():
            problems.append(Problem(f"file not found: {path}", file=config_file, field=f"kinds.{kind}"))
        else:
            local[kind] = f"{path}:{attr}"
    return local


def project_kinds(start: Path) -> dict[str, str]:
    """The project-local kinds of the project at or above ``start`` (name -> "/abs/file.py:Class");
    empty outside a project. ProjectError if its optbuild.toml or a [kinds] entry is wrong."""
    if project_root(start) is None:
        return {}
    config_file = find_config(start)
    problems: list[Problem] = []
    local = _local_kinds(_load_config(config_file)[0], config_file, problems)
    if problems:
        raise ProjectError(problems)
    return local


def load_project(start: Path | None = None, overrides: list[str] | None = None,
                 recipes: Collection[str] | None = None) -> Project:
    """Load and validate the project whose optbuild.toml is at or above ``start``, with
    ``overrides`` (``-S RECIPE:STEP.PARAM=VALUE``, see optbuild.project.overrides) applied.
    ``recipes``: load the steps of these recipes only (the recipes their steps read from must
    be among them; every recipe file is still found and named in ``Project.recipes``)."""
    parsed = [parse_override(text) for text in overrides or []]
    config_file = find_config(start or Path.cwd())
    root = config_file.parent
    config, config_doc = _load_config(config_file)
    texts = {os.path.abspath(config_file): config_doc.text}
    problems: list[Problem] = []
    recipe_files: dict[str, Path] = {}
    for pattern in config.project.recipes:
        matches = sorted(root.glob(pattern))
        if not matches:
            problems.append(Problem(f"pattern {pattern!r} matches no recipe file",
                                    file=config_file, field="project.recipes"))
        for path in matches:
            name = path.stem
            if (why := name_problem(name)) is not None:  # it names the folder build/<recipe>/
                problems.append(Problem(f"invalid recipe name {name!r} (the file name without "
                                        f".toml): it {why}; rename the file", file=path))
                continue
            if name in recipe_files and recipe_files[name] != path:
                problems.append(Problem(f"recipe name {name!r} is also used by {recipe_files[name]}",
                                        file=path))
            recipe_files[name] = path
    _check_folders(config, config_doc, recipe_files, problems)
    local = _local_kinds(config, config_file, problems)
    steps: dict[str, StepSpec] = {}
    invalid: set[str] = set()
    problems.extend(unknown_override_recipes(parsed, set(recipe_files)))
    # a few recipes are parsed rather than read from the memory of all of them
    recipes_parsed = ParsedRecipes(root / config.project.build_dir) if recipes is None else None
    for name, path in recipe_files.items():
        if recipes is not None and name not in recipes:
            continue
        for spec in _load_recipe(path, name, root, problems, local, invalid, parsed, recipes_parsed, texts):
            steps[spec.id] = spec
    if recipes_parsed is not None:
        recipes_parsed.save()
    _resolve_refs(steps, problems, invalid)
    _check_files(steps, problems)
    _check_calls(steps, problems)
    if problems:
        raise ProjectError(problems)
    for spec in steps.values():
        spec.step.bind({field_name: steps[target].step for field_name, target in spec.deps.items()})
    return Project(root, config_file, config, recipe_files, steps,
                   None if recipes is None else frozenset(recipes) & recipe_files.keys(), texts)
