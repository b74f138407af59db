"""The Dask task that builds one step: what the coordinator sends, as a node reads it.

It travels as a plain dict (``Task.model_dump``) and is read back with ``Task.read``. It is
wire data from anyone who can reach the scheduler: ``read`` only checks its shape (types,
digests, sizes); what it claims (its key, its kind, its host, its remote) the node checks
itself (``optbuild.distributed.task``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from optbuild.store.entry import OutputFile

PROJECT_KIND = "project:"  # implementation prefix of a project-local kind: project:<path>:<Class>


class BadTask(ValueError):
    """Not a task: the message says which field is wrong."""


class Upstream(BaseModel):
    """An upstream step's outputs, by name, as blobs of the remote CAS."""

    model_config = ConfigDict(frozen=True)

    step: str
    primary: str | None = None
    outputs: dict[str, OutputFile]


class Task(BaseModel):
    """One step to build on a node, with what its key is made of."""

    model_config = ConfigDict(frozen=True)

    key: str
    step: str  # recipe:step
    # the kind's class: an installed module's "module:Class", or PROJECT_KIND + the project's file
    implementation: str
    base_dir: str  # the recipe's folder, relative to the project ("." for its root)
    files: dict[str, OutputFile]  # the input files, by project-relative name
    inputs: dict[str, Upstream]  # by the parameter that names the upstream step
    primary_output: str | None = None
    ingredients: dict[str, Any]  # the key material, as the coordinator made it
    preload: tuple[str, ...] = ()
    remote: str  # the remote cache the coordinator fetches from
    signed: bool = False  # the coordinator accepts only signed entries

    @classmethod
    def read(cls, doc: Any) -> Task:
        """The task ``doc`` describes; BadTask naming the first wrong field."""
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the task"
            raise BadTask(f"not a task: {where}: {first['msg']}") from None

    @property
    def project_kind(self) -> str | None:
        """``<path>:<Class>`` of a project-local kind; None for an installed one."""
        if self.implementation.startswith(PROJECT_KIND):
            return self.implementation[len(PROJECT_KIND):]
        return None
