"""Step kinds by name: the built-ins, and third-party kinds from the entry point group
``optbuild.steps`` (name -> ``module:Class``). Modules are imported only when used."""

from __future__ import annotations

import importlib
from functools import cache

from optbuild.steps.base import Step

ENTRY_POINT_GROUP = "optbuild.steps"

# "kind" or "kind/backend" -> "module:Class"
BUILTIN: dict[str, str] = {
    "onnx": "optbuild.steps.source:OnnxSource",
    "export": "optbuild.steps.export:Export",
    "simplify": "optbuild.steps.simplify:Simplify",
}


@cache
def _plugins() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registry_name(kind: str, backend: str | None) -> str:
    return f"{kind}/{backend}" if backend else kind


def known_kinds() -> list[str]:
    return sorted({name.split("/")[0] for name in (*BUILTIN, *_plugins())})


def backends(kind: str) -> list[str]:
    prefix = f"{kind}/"
    return sorted(name[len(prefix):] for name in (*BUILTIN, *_plugins()) if name.startswith(prefix))


@cache
def step_class(name: str) -> type[Step]:
    """The Step class registered as ``name`` ("kind" or "kind/backend"); KeyError if none."""
    target = BUILTIN.get(name) or _plugins().get(name)
    if target is None:
        raise KeyError(name)
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Step)):
        raise TypeError(f"{target} is not an optbuild Step subclass")
    return cls
