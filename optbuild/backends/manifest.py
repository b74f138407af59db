"""``engine.json``: what an engine step writes beside its engine (the backend that runs it and
what it was built for), and what verify, benchmark, select, bench and deploy read back.

One writer (``write_manifest``) and one reader (``read_manifest``), both through
``EngineManifest``: the fields every runtime shares are typed here, a runtime's own fields
(``tensorrt_version``, ``inference_precision``, ...) pass through as written. The bytes
written are sorted-key JSON, as before the schema: they are an engine step's output, so its
digest enters the keys downstream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optbuild.backends.base import Manifest

MANIFEST = "engine.json"
MAX_BYTES = 1 << 20  # a manifest is a few KiB, profiles included


class Binding(BaseModel):
    """An input or output of an engine: its name and shape (a runtime's own notation of
    open dims: TensorRT writes sizes, OpenVINO sizes, ranges or null)."""

    model_config = ConfigDict(extra="allow")
    name: str
    shape: list[Any] | None  # None: OpenVINO's dynamic rank


class EngineManifest(BaseModel):
    """The fields of an engine.json that more than one runtime or reader relies on."""

    model_config = ConfigDict(extra="allow")
    backend: str = Field(min_length=1)  # the backend that runs it, as registry.get names it
    provider: str | None = None  # onnxruntime: the execution provider it was optimized for
    level: Literal["disable", "basic", "extended", "all"] | None = None  # onnxruntime's level
    inputs: list[Binding] | None = None
    outputs: list[Binding] | None = None
    # TensorRT: per profile, input name -> {"min", "opt", "max"} shapes
    profiles: list[dict[str, dict[Literal["min", "opt", "max"], list[int]]]] | None = None


class ManifestError(ValueError):
    """An engine.json that cannot be read or is not one an engine step writes."""


def _checked(data: Any, where: str) -> None:
    try:
        EngineManifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"field {'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}"
                             for e in exc.errors())
        raise ManifestError(f"{where}: not an engine.json as an engine step writes it ({problems}); "
                            "rebuild the step that made it") from None


def write_manifest(out_dir: Path, manifest: Manifest) -> None:
    """Write an engine step's ``engine.json`` beside its engine, checked against
    ``EngineManifest`` first (a step that writes a wrong one fails, not its readers)."""
    _checked(dict(manifest), f"{out_dir / MANIFEST} (about to be written)")
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(path: Path) -> dict[str, Any]:
    """The engine.json at ``path``, as written; ManifestError naming the file and the field
    when it is unreadable, too large, not JSON or not a manifest."""
    from optbuild.common.jsonfile import read_json

    try:
        data = read_json(path, MAX_BYTES)
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable engine.json ({exc}); rebuild the step that made it") from None
    _checked(data, str(path))
    return data
