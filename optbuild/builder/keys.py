"""Action keys: a digest of everything that can change a step's output.

The key material ("ingredients") is a plain JSON-able dict, stored with the action entry
and in optbuild.lock, so that `plan` and `explain` can say which ingredient changed.
Recipe comments and key order do not reach it: params enter as validated values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optbuild.common.digest import ALGORITHM, FileHasher, digest_bytes
from optbuild.common.fingerprint import Fingerprint
from optbuild.common.recipetable import KEYED_WHEN_SET, fields_with
from optbuild.common.toolchain import Toolchain
from optbuild.project.recipe import StepSpec
from optbuild.steps.base import StepParams
from optbuild.store.entry import canonical_json

KEY_FORMAT = 1


def key_files(spec: StepSpec) -> list[Path]:
    """Files whose bytes key ``spec``: the step's own, plus a project-local kind's source and
    the project modules that source imports (editing a helper of the kind changes its code)."""
    files = list(spec.key_files if spec.key_files is not None else spec.step.key_files())
    impl_file, _, _ = spec.implementation.rpartition(":")
    if impl_file.endswith(".py"):
        from optbuild.common.pyimports import local_imports

        kind_file = Path(impl_file)
        files += [path for path in (kind_file, *local_imports(kind_file, spec.step.project_root))
                  if path not in files]
    return files


def file_digests(spec: StepSpec, hasher: FileHasher, project_root: Path) -> dict[str, str]:
    """Project-relative path -> digest of every key file (FileNotFoundError if one is gone)."""
    return {_display_path(path, project_root): hasher.digest(path) for path in key_files(spec)}


def _display_path(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def key_params(params: StepParams) -> dict[str, Any]:
    """The validated parameters as they enter a key: fields marked KEYED_WHEN_SET are left
    out while unset (None)."""
    dumped = params.model_dump(mode="json")
    for name in fields_with(type(params), KEYED_WHEN_SET):
        if dumped.get(name) is None:
            dumped.pop(name, None)
    return dumped


def step_ingredients(
    spec: StepSpec,
    upstream: dict[str, dict[str, str]],
    *,
    hasher: FileHasher,
    toolchain: Toolchain,
    host: Fingerprint,
    salt: str,
    project_root: Path,
    missing: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The key material of ``spec``.

    ``upstream`` maps each StepRef field to the outputs (name -> digest) of the step it
    names: keys depend on upstream *content*, so an upstream rebuild that reproduces the
    same bytes does not rebuild anything downstream. ``missing``: the fields of a step that
    takes partial inputs whose steps did not succeed, with why (in the key, so that one
    that later succeeds runs the step again).
    """
    step = spec.step
    params = key_params(step.params)
    for field_name in spec.deps:
        if "." not in field_name:  # a list of steps (select's candidates) stays: its report names them
            params[field_name] = None  # the name of the upstream step is not content
    material = {
        "format": KEY_FORMAT,
        "hash": ALGORITHM,
        "salt": salt,
        "kind": spec.kind,
        "version": step.version,
        "params": params,
        "inputs": {name: upstream[name] for name in sorted(spec.deps) if name not in (missing or {})},
        "files": file_digests(spec, hasher, project_root),
        "tools": {name: toolchain.version(name) for name in step.tool_names()},
        "host": step.host_key(host),
    }
    impl_file, _, class_name = spec.implementation.rpartition(":")
    if impl_file.endswith(".py"):  # a project kind: its file's bytes are in "files", which class of it runs here
        material["class"] = f"{_display_path(Path(impl_file), project_root)}:{class_name}"
    if missing:
        material["missing"] = dict(sorted(missing.items()))
    return material


def action_key(ingredients: dict[str, Any]) -> str:
    return digest_bytes(canonical_json(ingredients))


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human reasons why ``new`` ingredients differ from ``old`` ones."""
    from optbuild.common.fingerprint import describe_change

    reasons: list[str] = []
    for section in ("format", "hash", "salt", "kind", "class", "version"):
        if old.get(section) != new.get(section):
            label = {"version": "step implementation version", "salt": "cache salt",
                     "class": "kind's class"}.get(section, section)
            reasons.append(f"{label} changed: {old.get(section)!r} -> {new.get(section)!r}")
    for section, label in (("params", "parameter"), ("tools", "tool"), ("host", "host")):
        before, after = old.get(section) or {}, new.get(section) or {}
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                if section == "host":
                    reasons.append(describe_change(name, before.get(name), after.get(name)))
                else:
                    reasons.append(f"{label} {name}: {_short(before.get(name))} -> {_short(after.get(name))}")
    before, after = old.get("files") or {}, new.get("files") or {}
    for name in sorted(set(before) | set(after)):
        if name not in before:
            reasons.append(f"new input file {name}")
        elif name not in after:
            reasons.append(f"input file {name} no longer used")
        elif before[name] != after[name]:
            reasons.append(f"input file {name} changed")
    before, after = old.get("inputs") or {}, new.get("inputs") or {}
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            reasons.append(f"upstream output ({name}) changed")
    return reasons or ["key material changed"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."
