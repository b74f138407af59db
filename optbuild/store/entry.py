"""The action entry: what a cached step produced, and from what.

Stored as JSON under ``ac/`` (local and remote alike). Output paths are validated so that
an entry, wherever it came from, can never write outside its step's output folder.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

FORMAT = 1


class OutputFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str
    size: int


def check_relative_path(name: str) -> str:
    """Reject absolute paths, '..', backslashes and empty parts in an output name."""
    path = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or path.is_absolute()
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise ValueError(f"output path {name!r} escapes the output folder")
    return name


class ActionEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    key: str
    step: str  # "recipe:step" that built it (informational: keys are content-based)
    kind: str
    outputs: dict[str, OutputFile]
    primary: str | None = None
    ingredients: dict[str, Any]  # the canonical key material, for plan/explain diffs
    log: str | None = None  # digest of the step's log blob
    metrics: dict[str, Any] = {}
    duration_s: float = 0.0
    created_at: float = 0.0
    built_on: str = ""  # hostname

    @field_validator("outputs")
    @classmethod
    def _safe_paths(cls, outputs: dict[str, OutputFile]) -> dict[str, OutputFile]:
        for name in outputs:
            check_relative_path(name)
        return outputs

    def blob_digests(self) -> set[str]:
        digests = {o.digest for o in self.outputs.values()}
        if self.log:
            digests.add(self.log)
        return digests
