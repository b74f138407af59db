"""The project: ``optbuild.toml`` and the recipes it names, validated as a whole.

Loading collects every problem (file, line, field, message) before failing, so a user
fixes a broken project in one pass; nothing is built when the project does not validate.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from optbuild.common import callables
from optbuild.common.errors import Problem, ProjectError
from optbuild.common.paths import folder_problem, name_problem
from optbuild.common.projectroot import CONFIG_NAME, project_root
from optbuild.common.recipetable import RecipeTable
from optbuild.model.inputdecl import InputDecls
from optbuild.project import matrix, template
from optbuild.project.overrides import (
    Override,
    apply_overrides,
    blame_overrides,
    parse_override,
    unknown_override_recipes,
)
from optbuild.project.tomlsource import TomlDocument, load_toml
from optbuild.steps import registry
from optbuild.steps.base import Step


class _Section(RecipeTable):
    """An optbuild.toml table: as strict as a recipe's (jobs = "4" or keep_going = "yes" is an
    error), and inf and nan (which TOML reads) are no timeout, size or count."""

    model_config = ConfigDict(allow_inf_nan=False)


class ProjectSection(_Section):
    recipes: list[str] = ["recipes/*.toml"]
    build_dir: str = "build"
    lock_file: str = "optbuild.lock"
    # build_dir and [cache] dir may lie outside the project folder only when this says so:
    # a cloned project's settings must not aim builds, and `clean`, at folders elsewhere.
    allow_outside: bool = False


class CacheSection(_Section):
    dir: str = "cache"
    max_size: str | int = "20 GiB"
    # Changing the salt disowns every earlier cache entry at once.
    salt: str = ""

    @field_validator("max_size")
    @classmethod
    def _size(cls, value: str | int) -> str | int:
        from optbuild.common.units import parse_size

        parse_size(str(value))
        return value


class BuildSection(_Section):
    jobs: int = Field(0, ge=0, description="parallel steps; 0 = one per CPU (on Dask: the farm's slots)")
    keep_going: bool = False
    # Default of build / plan --skip-unavailable: steps this host cannot run (a GPU step on a
    # CPU host) are reported unavailable, with what they need, and the rest builds green.
    skip_unavailable: bool = False
    # Steps run in children forked from a server that has imported their tools once (Linux);
    # false: a fresh Python process per step, which imports them every time.
    preload: bool = True
    # true: `optbuild build` hands changed builds to a build server that stays loaded between
    # them (optbuild.cli.buildserver; Linux; $OPTBUILD_SERVER overrides), ended after
    # server_idle_s seconds without a build. Unset: off.
    server: bool | None = None
    server_idle_s: float = Field(900.0, gt=0)
    # Where steps build: "local" (worker processes on this host), "dask" (Dask workers that
    # `optbuild worker` started; needs [remote] url, see docs/distributed.md) or "auto"
    # (dask when its scheduler answers, else local).
    executor: typing.Literal["local", "dask", "auto"] = "local"
    scheduler: str = ""  # the Dask scheduler's address (tcp://HOST:PORT) for executor = "dask"

    @field_validator("scheduler")
    @classmethod
    def _scheduler(cls, value: str) -> str:
        return check_scheduler(value)


def check_scheduler(address: str) -> str:
    """``address`` if it is empty or a Dask scheduler's address, else ValueError."""
    if address and not re.fullmatch(r"(tcp|tls|inproc|ucx|ws|wss)://[^\s/]+", address):
        raise ValueError(f"{address!r} is not a Dask scheduler address (expected tcp://HOST:PORT)")
    return address


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_OPTIONS = {"key", "secret", "token", "password", "secret_access_key", "aws_secret_access_key",
                   "aws_session_token", "session_token", "account_key", "sas_token"}


class RemoteSection(_Section):
    """A shared cache behind an fsspec URL (see docs/remote-cache.md). No secrets here."""

    url: str = ""  # file:///mnt/cache, s3://bucket/prefix, gs://bucket/prefix...; "" = no remote
    read: bool = True  # fetch what other hosts built
    write: bool = True  # upload what this host builds
    timeout_s: float = Field(10.0, gt=0, description="a remote call silent this long has failed")
    max_errors: int = Field(3, ge=1, description="errors after which the run stops using the remote")
    signing_key_env: str = ""  # NAME of the environment variable that holds the HMAC key
    endpoint_url: str = ""  # S3-compatible servers (MinIO, Ceph, R2...): http://host:9000
    options: dict[str, Any] = {}  # further fsspec storage options (credentials come from the environment)

    @field_validator("signing_key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if value and not _ENV_NAME.match(value):
            raise ValueError("must be the NAME of an environment variable holding the key "
                             "(e.g. OPTBUILD_SIGNING_KEY), never the key itself")
        return value

    @field_validator("options")
    @classmethod
    def _no_secrets(cls, value: dict[str, Any]) -> dict[str, Any]:
        secrets = sorted(k for k in value if k.lower() in _SECRET_OPTIONS)
        if secrets:
            raise ValueError(f"{', '.join(secrets)}: credentials do not belong in optbuild.toml; "
                             "set them in the environment (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
        return value


class ProjectConfig(_Section):
    project: ProjectSection = ProjectSection()
    # Project-local step kinds: name -> "path/to/file.py:Class" (relative to optbuild.toml).
    kinds: dict[str, str] = {}
    cache: CacheSection = CacheSection()
    build: BuildSection = BuildSection()
    remote: RemoteSection = RemoteSection()


class RecipeSection(_Section):
    description: str = ""
    template: str = ""  # a template file (optbuild.project.template), relative to the recipe
    args: dict[str, Any] = {}  # the template's arguments


class RecipeInputs(_Section):
    """A recipe's ``[inputs.NAME]`` tables: what its model's inputs take (see inputdecl),
    given to every step that runs the model, unless the step declares that input itself."""

    inputs: InputDecls = {}


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

    @property
    def cache_dir(self) -> Path:
        return self.root / self.config.cache.dir

    @property
    def build_dir(self) -> Path:
        return self.root / self.config.project.build_dir

    @property
    def lock_file(self) -> Path:
        return self.root / self.config.project.lock_file


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


def _table_model(annotation: Any, loc: tuple) -> type[BaseModel] | None:
    """The model of the table at ``loc`` inside a value of type ``annotation``, following
    fields, list items, dict values and Optional; None where that is ambiguous."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return _table_model(args[0], loc) if len(args) == 1 else None
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if not loc:
        return annotation if is_model else None
    part, rest = loc[0], loc[1:]
    if is_model:
        field_info = annotation.model_fields.get(str(part))
        return _table_model(field_info.annotation, rest) if field_info is not None else None
    if origin is list and isinstance(part, int):
        return _table_model(args[0], rest)
    if origin is dict:
        return _table_model(args[1], rest)
    return None


def unknown_key(key: str, known: list[str], expected: str | None = None) -> str:
    """"unknown key" with the closest known key, or else ``expected`` (default: the known keys)."""
    if hint := difflib.get_close_matches(key, known, n=1):
        return f"unknown key; did you mean {hint[0]!r}?"
    if expected is None and known:
        expected = f"expected one of: {', '.join(known)}"
    return f"unknown key ({expected})" if expected else "unknown key"


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false"}
_ALSO_EXPECTED = {"list_type": "a list", "string_type": "a string", "dict_type": "a table", "model_type": "a table"}


def _union_member(model: type[BaseModel], loc: tuple) -> bool:
    """Whether ``loc``'s last part names a member of a union field (pydantic's
    ``keep_io_types.bool``): no key the recipe wrote."""
    table = _table_model(model, loc[:-2]) if len(loc) >= 2 else None
    field_info = table.model_fields.get(str(loc[-2])) if table is not None else None
    if field_info is None:
        return False
    members = [a for a in typing.get_args(field_info.annotation) if a is not type(None)]
    return typing.get_origin(field_info.annotation) in (typing.Union, types.UnionType) and len(members) > 1


def _merge_unions(errors: list[dict], model: type[BaseModel]) -> list[dict]:
    """The errors of a union field's members as one error at the field, where each says what
    the member expects (``bool | list[str]`` given "yes": "expected true or false or a list,
    got the string 'yes'"); other errors as they are."""
    merged: dict[tuple, dict] = {}
    out = []
    for error in errors:
        expected = _EXPECTED.get(error["type"]) or _ALSO_EXPECTED.get(error["type"])
        if expected is None or not _union_member(model, error["loc"]):
            out.append(error)
            continue
        loc = error["loc"][:-1]
        if loc not in merged:
            merged[loc] = {**error, "loc": loc, "type": "union_type", "expected": []}
            out.append(merged[loc])
        merged[loc]["expected"].append(expected)
    for error in merged.values():
        error["msg"] = f"expected {' or '.join(error['expected'])}, got {_written(error['input'])}"
    return out


def _written(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the string {value!r}"
    return repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"


def wrong_type(kind: str, value: Any) -> str:
    """Why ``value`` is not of the strict type ``kind`` (pydantic's error type), and the fix:
    a recipe's numbers and booleans are taken as written, never converted."""
    message = f"expected {_EXPECTED[kind]}, got {_written(value)}"
    if isinstance(value, str) and kind != "bool_type":
        return f"{message}: write the number without quotes"
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return f"{message}: write {value.lower()} without quotes"
    if kind == "int_type" and isinstance(value, float) and value.is_integer():
        return f"{message}: write {int(value)}"
    return message


def validation_problems(doc: TomlDocument, prefix: tuple, exc: ValidationError, model: type[BaseModel],
                        top_keys: tuple[str, ...] = ()) -> list[Problem]:
    """``exc`` (from validating ``model`` at ``prefix`` of ``doc``) as located problems, in
    the recipe's words. ``top_keys``: keys valid beside ``model``'s fields at its top level
    (a step's ``kind``), offered when an unknown key is near one."""
    problems = []
    for error in _merge_unions(exc.errors(), model):
        loc = (*prefix, *error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            table = _table_model(model, error["loc"][:-1])
            known = [] if table is None else list(table.model_fields)
            if len(error["loc"]) == 1:
                known = [*top_keys, *known]
            message = unknown_key(str(error["loc"][-1]), known)
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "value_error":  # our validators' words, without pydantic's prefix
            message = str(error["ctx"]["error"])
        elif error["type"] in _EXPECTED:
            message = wrong_type(error["type"], error["input"])
        problems.append(doc.problem(loc, message))
    return problems


def non_finite_problems(doc: TomlDocument, prefix: tuple, value: Any) -> list[Problem]:
    """A problem for each infinite or NaN number in ``value`` (at ``prefix`` of ``doc``), nested
    tables and arrays included. TOML reads ``inf``, ``nan`` and ``1e999`` (which overflows) as
    floats, and a parameter enters the step's key as JSON, which has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        written = "nan" if math.isnan(value) else ("-" if value < 0 else "") + "inf (or a number too large for a float)"
        return [doc.problem(prefix, f"{written} is not a finite number: a parameter enters the step's key, which "
                                    "holds finite numbers only; write a finite value")]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in non_finite_problems(doc, (*prefix, key), item)]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in non_finite_problems(doc, (*prefix, index), item)]
    return []


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


def _load_recipe(path: Path, recipe: str, root: Path, problems: list[Problem],
                 local: dict[str, str], invalid: set[str], overrides: list[Override]) -> list[StepSpec]:
    """The valid steps of one recipe; ids of steps that failed validation go to ``invalid``."""
    try:
        doc = load_toml(path)
    except ProjectError as exc:
        problems.extend(exc.problems)
        return []
    data, docs = template.instantiate(doc, problems)
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


def load_project(start: Path | None = None, overrides: list[str] | None = None) -> Project:
    """Load and validate the project whose optbuild.toml is at or above ``start``, with
    ``overrides`` (``-S RECIPE:STEP.PARAM=VALUE``, see optbuild.project.overrides) applied."""
    parsed = [parse_override(text) for text in overrides or []]
    config_file = find_config(start or Path.cwd())
    root = config_file.parent
    config, config_doc = _load_config(config_file)
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
    for name, path in recipe_files.items():
        for spec in _load_recipe(path, name, root, problems, local, invalid, parsed):
            steps[spec.id] = spec
    _resolve_refs(steps, problems, invalid)
    _check_files(steps, problems)
    _check_calls(steps, problems)
    if problems:
        raise ProjectError(problems)
    for spec in steps.values():
        spec.step.bind({field_name: steps[target].step for field_name, target in spec.deps.items()})
    return Project(root, config_file, config, recipe_files, steps)
