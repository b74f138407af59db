"""The tables of ``optbuild.toml`` and of a recipe's own ``[recipe]`` and ``[inputs]``, as
pydantic models: their keys, types, defaults and the checks of a value on its own."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from optbuild.common.recipetable import RecipeTable
from optbuild.model.inputdecl import InputDecls


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
    jobs: int = Field(default=0, ge=0, description="parallel steps; 0 = one per CPU (on Dask: the farm's slots)")
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
    server_idle_s: float = Field(default=900.0, gt=0)
    # Where steps build: "local" (worker processes on this host), "dask" (Dask workers that
    # `optbuild worker` started; needs [remote] url, see docs/distributed.md) or "auto"
    # (dask when its scheduler answers, else local).
    executor: Literal["local", "dask", "auto"] = "local"
    scheduler: str = ""  # the Dask scheduler's address (tcp://HOST:PORT) for executor = "dask"
    # With the dask executor, which outputs come to this host: "targets" (the steps named, else
    # the last steps of what was selected; the others stay on the remote cache, where the nodes
    # read them: "build without the bytes") or "all".
    download: Literal["targets", "all"] = "targets"

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
    timeout_s: float = Field(default=10.0, gt=0, description="a remote call silent this long has failed")
    max_errors: int = Field(default=3, ge=1, description="errors after which the run stops using the remote")
    signing_key_env: str = ""  # NAME of the environment variable that holds the HMAC key
    # Blobs up to this size travel inside their entry, so one request restores a small step;
    # 0: none does (an optbuild of before entry format 3 reads only entries that carry none).
    inline_max: str | int = "64 KiB"
    endpoint_url: str = ""  # S3-compatible servers (MinIO, Ceph, R2...): http://host:9000
    options: dict[str, Any] = {}  # further fsspec storage options (credentials come from the environment)

    @field_validator("signing_key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if value and not _ENV_NAME.match(value):
            raise ValueError("must be the NAME of an environment variable holding the key "
                             "(e.g. OPTBUILD_SIGNING_KEY), never the key itself")
        return value

    @field_validator("inline_max")
    @classmethod
    def _carried_size(cls, value: str | int) -> str | int:
        from optbuild.common.units import parse_size
        from optbuild.store.entry import MAX_CARRIED_BYTES

        if parse_size(str(value)) > MAX_CARRIED_BYTES:
            raise ValueError(f"at most {MAX_CARRIED_BYTES // 1024} KiB (an entry that carries more is refused)")
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
