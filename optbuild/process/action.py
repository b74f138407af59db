"""The action: what a step's output is a function of, in one typed value.

One ``Action`` is keyed (``key``: the digest of its canonical JSON), stored with its cache
entry and in optbuild.lock (``material``), shipped to a Dask node and read back there
(``from_material``), and run (``run_params``: the parameters the step's process gets).
Wherever it runs, a step is run from its action, so what is run is what was keyed.

An upstream step's name is not content: the key holds ``None`` for a parameter that names
one step (a list of steps, select's candidates, stays as written: its report names them),
and ``run_params`` puts the names of the steps that fed it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from optbuild.common.digest import ALGORITHM, digest_bytes
from optbuild.store.entry import canonical_json

KEY_FORMAT = 1

# material field -> the Python type it must have (``from_material`` checks wire data)
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": int, "hash": str, "salt": str, "kind": str, "version": str, "params": dict,
    "inputs": dict, "files": dict, "tools": dict, "host": dict}
_OPTIONAL: dict[str, type] = {"class": str, "missing": dict}


class BadAction(ValueError):
    """Key material that is not an action's; the message names the field."""


@dataclass(frozen=True)
class Action:
    """A step's key material, typed. Field order is irrelevant to the key (its JSON is
    canonical: sorted keys)."""

    kind: str
    version: str  # the kind's implementation version
    params: dict[str, Any]  # validated, as keyed: a parameter naming one upstream step is None
    inputs: dict[str, dict[str, str]]  # parameter -> the upstream step's outputs (name -> digest)
    files: dict[str, str]  # project-relative path -> digest of every file the step reads
    tools: dict[str, str | None]  # tool -> version; None: not installed
    host: dict[str, Any]  # the host fields the step's output depends on
    salt: str = ""
    kind_class: str | None = None  # a project kind: "<file>:<Class>" (its bytes are in files)
    # inputs of a step that takes partial inputs whose steps did not succeed: field -> why
    missing: dict[str, dict[str, str]] = field(default_factory=dict)
    format: int = KEY_FORMAT
    hash: str = ALGORITHM

    def material(self) -> dict[str, Any]:
        """The plain JSON form: what is hashed, stored and shipped (``class`` and ``missing``
        only when set, as keys made before them had neither)."""
        doc: dict[str, Any] = {
            "format": self.format, "hash": self.hash, "salt": self.salt, "kind": self.kind,
            "version": self.version, "params": self.params, "inputs": self.inputs, "files": self.files,
            "tools": self.tools, "host": self.host}
        if self.kind_class is not None:
            doc["class"] = self.kind_class
        if self.missing:
            doc["missing"] = dict(sorted(self.missing.items()))
        return doc

    @cached_property
    def key(self) -> str:
        return digest_bytes(canonical_json(self.material()))

    @classmethod
    def from_material(cls, doc: Any) -> Action:
        """The action ``doc`` (wire data, a lock record) holds; BadAction naming the first
        field that is missing, unknown or of the wrong type."""
        if not isinstance(doc, dict):
            raise BadAction(f"key material must be an object, not {type(doc).__name__}")
        if unknown := sorted(set(doc) - set(_REQUIRED) - set(_OPTIONAL)):
            raise BadAction(f"unknown key material field {unknown[0]!r}")
        for name, types in (*_REQUIRED.items(), *_OPTIONAL.items()):
            if name not in doc and name in _OPTIONAL:
                continue
            value = doc.get(name)
            if not isinstance(value, types) or (types is int and isinstance(value, bool)):
                raise BadAction(f"key material field {name!r} is missing or not {_NAMES.get(types, 'an object')}")
        _check_missing(doc.get("missing") or {})
        return cls(kind=doc["kind"], version=doc["version"], params=doc["params"], inputs=doc["inputs"],
                   files=doc["files"], tools=doc["tools"], host=doc["host"], salt=doc["salt"],
                   kind_class=doc.get("class"), missing=doc.get("missing") or {}, format=doc["format"],
                   hash=doc["hash"])

    def run_params(self, upstream: Mapping[str, str]) -> dict[str, Any]:
        """The parameters the step runs with: the keyed ones, with the name of the step that
        fed each input (``upstream``: parameter -> step id) where the key holds None."""
        params = dict(self.params)
        for name, step in upstream.items():
            if name in params and params[name] is None:
                params[name] = step
        return params


_NAMES: dict[Any, str] = {int: "an integer", str: "text", dict: "an object"}


def _check_missing(missing: dict[str, Any]) -> None:
    if not all(isinstance(v, dict) and set(v) == {"step", "why"} and all(isinstance(t, str) for t in v.values())
               for v in missing.values()):
        raise BadAction("key material field 'missing' is not a table of steps and reasons")
