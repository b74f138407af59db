"""Remote-cache fixtures (a pytest plugin): real remote caches on loopback, simulated machines.

* ``s3_server``: moto's S3-compatible server on 127.0.0.1 (a free port), in this process,
  with dummy AWS credentials in the environment (which CLI subprocesses inherit).
* ``s3_remote`` / ``file_remote``: a fresh, empty remote (a new bucket, a new folder) with
  helpers to inspect and damage it the way a real fault would.
* ``machines``: makes project copies ("hosts") with their own build folder and local cache,
  all configured for one remote.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from plugins.projects import CONFIG, PIPELINE, ProjectDir

from optbuild.common.digest import FileHasher
from optbuild.store.local import LocalStore
from optbuild.store.marker import MARKER
from optbuild.store.remote import SIGNATURE_PREFIX, RemoteAudit, RemoteSession, RemoteStore

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
_buckets = itertools.count()


@dataclass
class S3Server:
    endpoint: str
    server: Any

    def stop(self) -> None:
        self.server.stop()


def start_s3_server() -> S3Server:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return S3Server(f"http://{host}:{port}", server)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    saved = {name: os.environ.get(name) for name in AWS_ENV}
    os.environ.update(AWS_ENV)
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class Remote:
    """A remote cache under test, and raw access to it (as an attacker or a fault has)."""

    url: str
    fs: Any  # an fsspec file system on the remote
    root: str  # the remote's root path in ``fs``
    endpoint: str | None = None

    def section(self, **extra: Any) -> str:
        lines = ["[remote]", f'url = "{self.url}"']
        if self.endpoint:
            lines.append(f'endpoint_url = "{self.endpoint}"')
        extra.setdefault("timeout_s", 5)
        for name, value in extra.items():
            lines.append(f"{name} = {_toml(value)}")
        return "\n".join(lines) + "\n"

    def entry_path(self, key: str, slot: str | None = None) -> str:
        """Where the entry of ``key`` lies; ``slot``: a signing key's id (an entry kept beside one
        signed with another key)."""
        return f"{self.root}/ac/{key[:2]}/{key[2:]}{'' if slot is None else '.' + slot}.json"

    def blob_path(self, digest: str) -> str:
        return f"{self.root}/cas/{digest[:2]}/{digest[2:]}"

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(path)

    def read_entry(self, key: str) -> tuple[bytes, dict[str, Any]]:
        """An entry's signature line (b"" when unsigned) and its JSON document."""
        data = self.read(self.entry_path(key))
        head = b""
        if data.startswith(SIGNATURE_PREFIX):
            line, _, data = data.partition(b"\n")
            head = line + b"\n"
        return head, json.loads(data)

    def write_entry(self, key: str, head: bytes, doc: dict[str, Any]) -> None:
        """Store ``doc`` as the entry of ``key`` behind the signature line ``head`` (kept as is)."""
        self.write(self.entry_path(key), head + json.dumps(doc).encode())

    def write(self, path: str, data: bytes) -> None:
        if "://" not in self.url or self.url.startswith("file://"):
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            if self.fs.exists(path):
                os.chmod(path, 0o644)
        self.fs.pipe_file(path, data)

    def delete(self, path: str) -> None:
        self.fs.rm_file(path)

    def keys(self) -> list[str]:
        try:
            paths = self.fs.find(f"{self.root}/ac")
        except FileNotFoundError:
            return []
        return sorted({p.rsplit("/", 2)[-2] + p.rsplit("/", 2)[-1].split(".")[0] for p in paths})

    def audit(self, signing_key_env: str | None = None) -> RemoteAudit:
        """Every entry acceptable and every blob it names present and intact (re-hashed)."""
        store = RemoteStore(self.url, endpoint_url=self.endpoint, signing_key_env=signing_key_env)
        return RemoteSession(store).audit(rehash=True)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return f'"{value}"'


@pytest.fixture
def s3_remote(s3_server: S3Server) -> Remote:
    import s3fs

    bucket = f"optbuild-test-{os.getpid()}-{next(_buckets)}"
    fs = s3fs.S3FileSystem(endpoint_url=s3_server.endpoint, skip_instance_cache=True,
                           use_listings_cache=False)
    fs.mkdir(bucket)
    return Remote(f"s3://{bucket}/cache", fs, f"{bucket}/cache", s3_server.endpoint)


@pytest.fixture
def file_remote(tmp_path: Path) -> Remote:
    from fsspec.implementations.local import LocalFileSystem

    root = tmp_path / "shared-mount" / "cache"
    root.mkdir(parents=True)
    return Remote(f"file://{root}", LocalFileSystem(), str(root))


@pytest.fixture(params=["s3", "file"])
def any_remote(request: pytest.FixtureRequest) -> Remote:
    return request.getfixturevalue(f"{request.param}_remote")


Machines = Callable[..., ProjectDir]


@pytest.fixture
def machines(tmp_path: Path) -> Machines:
    """``make(name, remote_section, extra_steps="")``: a project copy with its own caches."""

    def make(name: str, remote_section: str = "", extra_steps: str = "") -> ProjectDir:
        proj = ProjectDir.with_test_kinds(tmp_path / name)
        proj.write("optbuild.toml", CONFIG + "\n" + remote_section)
        proj.write("recipes/chain.toml", PIPELINE + extra_steps)
        return proj

    return make


def outputs(project: ProjectDir) -> dict[str, bytes]:
    """Every file under build/ (outputs only: no logs, no marker, none of optbuild's own
    records in .optbuild/), by relative path."""
    build = project.root / "build"
    return {p.relative_to(build).as_posix(): p.read_bytes() for p in sorted(build.rglob("*"))
            if p.is_file() and not {".logs", ".optbuild"} & set(p.relative_to(build).parts) and p.name != MARKER}


def local_store(project: ProjectDir) -> LocalStore:
    return LocalStore(project.root / "cache", FileHasher(None))


def step_events(result: Any, *statuses: str) -> list[str]:
    return sorted(e["step"] for e in result.reporter.events
                  if e.get("event") == "step" and e["status"] in statuses)


def warnings(events: list[dict]) -> list[str]:
    return [e["message"] for e in events if e.get("event") == "warning"]


def cache_event(events: list[dict]) -> dict:
    return next(e for e in events if e.get("event") == "cache")


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a hung server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def closed_port() -> str:
    """An endpoint where nothing listens (connection refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def cli(project: ProjectDir, *args: str) -> Any:
    """Run the CLI in this process (no interpreter start-up); stdout/stderr are captured.

    Build progress lines go to the reporter's own stream; what a command prints itself
    (summaries, errors, transfer progress) is captured.
    """
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from plugins.projects import CliRun

    from optbuild.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["-C", str(project.root), *args])
    return CliRun(code, out.getvalue(), err.getvalue())
