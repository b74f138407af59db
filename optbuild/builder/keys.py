"""Action keys: the ``Action`` of a step, whose digest is its key.

The key material is everything that can change a step's output (``process.action``),
stored with the action entry and in optbuild.lock, so that `plan` and `explain` can say
which ingredient changed. Recipe comments and key order do not reach it: params enter as
validated values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optbuild.common.digest import FileHasher
from optbuild.common.fingerprint import Fingerprint
from optbuild.common.recipetable import KEYED_WHEN_SET, fields_with
from optbuild.common.toolchain import Toolchain
from optbuild.process.action import Action
from optbuild.project.recipe import StepSpec
from optbuild.steps.base import StepParams


class Keyer:
    """Makes the actions of one build's steps. What one build reads of a file is read once:
    the project modules a project kind's file imports are resolved once per file, and a
    file's digest is taken once (the kind file of 9,000 steps, say), so every step of the
    build is keyed on the same bytes. ``file_digests`` reads again: it checks that a step's
    files did not change while it built."""

    def __init__(self, *, hasher: FileHasher, toolchain: Toolchain, salt: str, project_root: Path):
        self.hasher = hasher
        self.toolchain = toolchain
        self.salt = salt
        self.project_root = project_root
        self._kinds: dict[str, tuple[str | None, list[Path]]] = {}  # implementation -> ``_kind``
        self._names: dict[Path, str] = {}  # key file -> its name in actions
        self._digests: dict[Path, str] = {}  # key file -> its digest, as this build read it

    def action(self, spec: StepSpec, upstream: dict[str, dict[str, str]], host: Fingerprint,
               missing: dict[str, dict[str, str]] | None = None) -> Action:
        """The action of ``spec``.

        ``upstream`` maps each StepRef field to the outputs (name -> digest) of the step it
        names: keys depend on upstream *content*, so an upstream rebuild that reproduces the
        same bytes does not rebuild anything downstream. ``missing``: the fields of a step that
        takes partial inputs whose steps did not succeed, with why (in the key, so that one
        that later succeeds runs the step again). FileNotFoundError when a key file is gone.
        """
        step = spec.step
        params = key_params(step.params)
        for field_name in spec.deps:
            if "." not in field_name:  # a list of steps (select's candidates) stays: its report names them
                params[field_name] = None  # the name of the upstream step is not content
        kind_class, _ = self._kind(spec.implementation)
        return Action(
            kind=spec.kind, version=step.version, params=params,
            inputs={name: step.outputs_read(name, upstream[name]) for name in sorted(spec.deps)
                    if name not in (missing or {})},
            files=self._file_digests(spec), tools={name: self.toolchain.version(name) for name in step.tool_names()},
            host=step.host_key(host), salt=self.salt, kind_class=kind_class, missing=missing or {})

    def file_digests(self, spec: StepSpec) -> dict[str, str]:
        """Project-relative path -> digest of every key file as it is now (FileNotFoundError
        if one is gone)."""
        return {name: self.hasher.digest(path) for name, path in self.named_key_files(spec).items()}

    def _file_digests(self, spec: StepSpec) -> dict[str, str]:
        """``file_digests``, each file read once a build."""
        digests = {}
        for name, path in self.named_key_files(spec).items():
            if (digest := self._digests.get(path)) is None:
                digest = self._digests[path] = self.hasher.digest(path)
            digests[name] = digest
        return digests

    def named_key_files(self, spec: StepSpec) -> dict[str, Path]:
        """The key files of ``spec`` by the names the action gives them (project-relative)."""
        names = {}
        for path in self.key_files(spec):
            if (name := self._names.get(path)) is None:
                name = self._names[path] = _display_path(path, self.project_root)
            names[name] = path
        return names

    def key_files(self, spec: StepSpec) -> list[Path]:
        """Files whose bytes key ``spec``: the step's own, plus a project-local kind's source and
        the project modules that source imports (editing a helper of the kind changes its code)."""
        files = list(spec.key_files if spec.key_files is not None else spec.step.key_files())
        files += [path for path in self._kind(spec.implementation)[1] if path not in files]
        return files

    def _kind(self, implementation: str) -> tuple[str | None, list[Path]]:
        """For a project kind ("/abs/file.py:Class"), the class as its action names it (the
        project-relative file and the class: which class of the file runs) and the files whose
        bytes key it (its source and the project modules that imports); (None, []) for a
        built-in kind. Worked out once per kind and build."""
        if (found := self._kinds.get(implementation)) is None:
            impl_file, _, class_name = implementation.rpartition(":")
            found = (None, [])
            if impl_file.endswith(".py"):
                from optbuild.common.pyimports import local_imports

                kind_file = Path(impl_file)
                found = (f"{_display_path(kind_file, self.project_root)}:{class_name}",
                         [kind_file, *local_imports(kind_file, self.project_root)])
            self._kinds[implementation] = found
        return found


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
