"""The Dask task that builds one step: what the coordinator sends, as a node reads it, and
what the node sends back.

Both travel as plain dicts (``model_dump``) and are read back with ``read``. A task is wire
data from anyone who can reach the scheduler: ``Task.read`` only checks its shape (types,
digests, sizes); what it claims (its key, its kind, its host, its remote) the node checks
itself (``optbuild.distributed.task``). A result is validated the same way by the
coordinator, and its entry as any remote entry is (``builder.DaskBuilder``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from optbuild.store.entry import OutputFile, check_digest

PROJECT_KIND = "project:"  # implementation prefix of a project-local kind: project:<path>:<Class>


class BadTask(ValueError):
    """Not a task: the message says which field is wrong."""


class Upstream(BaseModel):
    """An upstream step's outputs, by name, as blobs of the remote CAS. The key holds their
    digests but not which is the main one: the node checks ``primary`` against the entry of
    ``key`` in the remote cache."""

    model_config = ConfigDict(frozen=True)

    step: str
    key: str  # the upstream step's action key: where its entry lies in the remote cache
    primary: str | None = None
    outputs: dict[str, OutputFile]

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        return check_digest(value, "key")


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
            raise BadTask(f"not a task: {_first_problem(exc, 'the task')}") from None

    @property
    def project_kind(self) -> str | None:
        """``<path>:<Class>`` of a project-local kind; None for an installed one."""
        if self.implementation.startswith(PROJECT_KIND):
            return self.implementation[len(PROJECT_KIND):]
        return None


class TaskResult(BaseModel):
    """What a node reports of one task: the entry it stored, or why there is none."""

    model_config = ConfigDict(strict=True)  # "yes" is not true: a node answers with what it dumped

    ok: bool
    node: str = "?"
    entry: str | None = None  # the action entry as the remote cache holds it (maybe signed)
    error: str | None = None
    log: str = ""  # a failed step's log (its tail)
    expected: bool = False  # a failure the step explained
    repeats: bool = False  # the same inputs would fail the same way
    infra: bool = False  # the node's failure (a transfer, a refusal, a bug), not the step's
    crossed: dict[str, list[int]] = {}  # per blob the node moved for it: [times up, times down]

    @classmethod
    def read(cls, doc: Any) -> TaskResult:
        """The result ``doc`` holds; one that is not a result is the node's failure, said."""
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            return cls(ok=False, error=f"the node's answer is not a task result ({_first_problem(exc, 'the result')})",
                       infra=True)


def _first_problem(exc: ValidationError, whole: str) -> str:
    """"field.sub: what is wrong" of the first error (``whole`` when it is the document's)."""
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or whole}: {first['msg']}"
