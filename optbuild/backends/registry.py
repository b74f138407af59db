"""Backends by name: the built-ins, and third-party ones from the entry point group
``optbuild.backends`` (name -> ``module:attr``, a ``Backend`` instance). A module is
imported when its backend is first asked for; none imports its runtime on import.

Verify, bench and the steps' checks find what runs an artifact here (``for_artifact``, or
``for_step`` before it is built), and never name a backend themselves.
"""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.backends.base import Backend, Manifest, Runner
from optbuild.backends.manifest import MANIFEST, ManifestError, read_manifest
from optbuild.common import plugins
from optbuild.common.errors import StepError

if TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

ENTRY_POINT_GROUP = "optbuild.backends"

BUILTIN: dict[str, str] = {
    "onnxruntime": "optbuild.backends.onnxruntime:BACKEND",
    "tensorrt": "optbuild.backends.tensorrt.backend:TENSORRT",
    "tensorrt-rtx": "optbuild.backends.tensorrt.backend:TENSORRT_RTX",
    "openvino": "optbuild.backends.openvino:BACKEND",
}


def names() -> list[str]:
    return sorted({*BUILTIN, *plugins.declared(ENTRY_POINT_GROUP)})


@cache
def get(name: str) -> Backend:
    """The backend called ``name``; KeyError naming the known ones if there is none."""
    where = BUILTIN.get(name) or plugins.declared(ENTRY_POINT_GROUP).get(name)
    if where is None:
        raise KeyError(f"no backend {name!r} (known: {', '.join(names())})")
    module, _, attr = where.partition(":")
    backend = getattr(importlib.import_module(module), attr)
    if not isinstance(backend, Backend):
        raise TypeError(f"{where} is not an optbuild Backend")
    return backend


def for_step(step: Any) -> tuple[Backend, Manifest] | None:
    """What runs the output of ``step`` (a Step), from what the step says of itself before
    it is built; None when its output is nothing a backend runs."""
    manifest = step.runs_on()
    if manifest is None:
        return None
    return get(manifest["backend"]), manifest


def by_suffix(suffix: str) -> Backend | None:
    """The built-in backend that opens files of ``suffix`` with no manifest (".onnx")."""
    for name in BUILTIN:
        if suffix in (backend := get(name)).suffixes:
            return backend
    return None


def onnx_backend() -> Backend:
    """The backend that runs a plain ONNX model, one with no manifest."""
    backend = by_suffix(".onnx")
    if backend is None:
        raise KeyError("no backend runs .onnx files")
    return backend


def open_onnx(model: Path, host: Fingerprint, *, threads: int | None = None, literal: bool = False) -> Runner:
    """A runner (not yet entered) of the plain ONNX model ``model``, on ``onnx_backend()``."""
    backend = onnx_backend()
    return backend.open(model, {"backend": backend.name}, host, threads=threads, literal=literal)


def for_artifact(model: Path, what: str) -> tuple[Backend, Manifest]:
    """What runs the artifact ``model``: the backend its ``engine.json`` names, else the one
    that opens its suffix. StepError, naming ``what`` ("the candidate r:engine"), when none
    does or the manifest is unreadable."""
    manifest_file = model.parent / MANIFEST
    if manifest_file.is_file():
        try:
            manifest = read_manifest(manifest_file)
        except ManifestError as exc:
            raise StepError(f"{what}: {exc}") from None
        name = manifest["backend"]
        if name not in names():
            raise StepError(f"{what} is an engine of backend {name!r}, which no installed backend runs "
                            f"(they are {', '.join(names())})")
        return get(name), manifest
    backend = by_suffix(model.suffix)
    if backend is None:
        raise StepError(f"{what} gives {model.name} with no {MANIFEST} beside it to say which backend "
                        f"runs it (without one, the backends run "
                        f"{', '.join(sorted({s for n in BUILTIN for s in get(n).suffixes}))} files)")
    return backend, {"backend": backend.name}
