"""Publishing deploy steps' outputs into a served Triton model repository, switched atomically.

A server that watches the repository must see a model's old version or its new one, never a
half-copied file. So a new version is copied, fsynced, into a hidden folder of the model's
(``.optbuild-tmp-*``: Triton takes only numeric folders for versions) and appears by one rename
to the next version number; ``config.pbtxt`` is replaced by a rename too, after the version
(a server that reloads between the two renames loads the new version with the previous
configuration, or fails to and keeps serving the old one). Versions beyond ``keep`` are renamed
away before they are deleted. One publish at a time per model: an flock on
``<model>/.optbuild.lock`` (a file, which Triton ignores). A killed publish leaves at most a
hidden folder behind, removed by the next publish.

Each version holds ``optbuild.json``: what was published (step, key, where and when it was
built, where it came from, each file's digest) and the configuration it was published with, so
that a rollback puts that configuration back. A publish whose files and configuration equal
the current version's changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.common.atomic import fsync_path, write_atomic
from optbuild.common.digest import hash_file
from optbuild.common.errors import OptbuildError
from optbuild.common.paths import confined, name_problem
from optbuild.store.flock import locked

RECORD = "optbuild.json"
LOCK = ".optbuild.lock"
_TEMP = ".optbuild-tmp-"
_GONE = ".optbuild-old-"


@dataclass(frozen=True)
class Release:
    """One deploy step's output for one model: ``folder`` holds config.pbtxt and one version."""

    model: str
    folder: Path
    provenance: dict[str, Any]  # step, key, built_on, built_at, source


@dataclass(frozen=True)
class Change:
    model: str
    version: int | None  # the version now current
    what: str  # "published", "unchanged", "rolled back"


def releases(output: Path, provenance: dict[str, Any]) -> list[Release]:
    """The models a deploy step's ``output`` folder holds (``<model>/config.pbtxt``)."""
    found = [Release(p.parent.name, p.parent, provenance) for p in sorted(output.glob("*/config.pbtxt"))]
    if not found:
        raise OptbuildError(f"{output} holds no <model>/config.pbtxt: is it a deploy step's output?")
    return found


def versions(model_dir: Path) -> list[int]:
    """The model's version numbers, as Triton sees them (numeric folders), lowest first."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and p.is_dir())


def publish(release: Release, to: Path, keep: int) -> Change:
    """Make ``release`` the current version of its model in the repository ``to``."""
    model_dir = _model_dir(to, release.model)
    (source,) = [p for p in release.folder.iterdir() if p.is_dir() and p.name.isdigit()] or [None]
    if source is None:
        raise OptbuildError(f"{release.folder} holds no version folder")
    files = {p.relative_to(source).as_posix(): p for p in sorted(source.rglob("*")) if p.is_file()}
    digests = {name: hash_file(path)[0] for name, path in files.items()}
    config = (release.folder / "config.pbtxt").read_text()
    with locked(model_dir / LOCK):
        _sweep(model_dir)
        current = versions(model_dir)
        if current and _same(model_dir / str(current[-1]), digests, config):
            return Change(release.model, current[-1], "unchanged")
        number = current[-1] + 1 if current else 1
        temp = model_dir / f"{_TEMP}{uuid.uuid4().hex[:12]}"
        temp.mkdir()
        for name, path in files.items():
            _copy(path, temp / name)
        record = {"model": release.model, "version": number, **release.provenance,
                  "published_at": time.time(), "published_on": socket.gethostname(),
                  "files": digests, "config": config}
        write_atomic(temp / RECORD, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        fsync_path(temp)
        os.rename(temp, model_dir / str(number))  # the switch: the version appears whole
        fsync_path(model_dir)
        _set_config(model_dir, config)
        _prune(model_dir, keep)
    return Change(release.model, number, "published")


def rollback(to: Path, model: str) -> Change:
    """Make the version before the current one current again: the current one is removed and
    the configuration it was published with replaced by the previous version's."""
    model_dir = _model_dir(to, model)
    with locked(model_dir / LOCK):
        _sweep(model_dir)
        current = versions(model_dir)
        if len(current) < 2:
            raise OptbuildError(f"{model_dir} has {len(current)} version(s): nothing to roll back to "
                                "(publish with --keep 2 or more to keep one)")
        previous = model_dir / str(current[-2])
        try:
            config = json.loads((previous / RECORD).read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            raise OptbuildError(f"{previous / RECORD} is missing or unreadable: optbuild did not publish "
                                "that version, so it cannot say which config.pbtxt goes with it") from None
        _remove(model_dir, model_dir / str(current[-1]))
        _set_config(model_dir, config)
    return Change(model, current[-2], "rolled back")


def _model_dir(to: Path, model: str) -> Path:
    if (problem := name_problem(model)) is not None:
        raise OptbuildError(f"model name {model!r} {problem}")
    to.mkdir(parents=True, exist_ok=True)
    model_dir = confined(to / model, to, f"model {model!r} to")
    model_dir.mkdir(exist_ok=True)
    return model_dir


def _same(version: Path, digests: dict[str, str], config: str) -> bool:
    """Whether ``version`` holds these files and was published with this configuration."""
    try:
        record = json.loads((version / RECORD).read_text())
    except (OSError, ValueError):
        return False
    on_disk = {p.relative_to(version).as_posix(): p for p in version.rglob("*") if p.is_file() and p.name != RECORD}
    return (isinstance(record, dict) and record.get("files") == digests and record.get("config") == config
            and on_disk.keys() == digests.keys()
            and all(hash_file(path)[0] == digests[name] for name, path in on_disk.items()))


def _copy(source: Path, dest: Path) -> None:
    """A copy of its own (not a link into the cache), on disk before the version appears."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    with open(dest, "rb+") as f:
        os.fsync(f.fileno())
    fsync_path(dest.parent)


def _set_config(model_dir: Path, config: str) -> None:
    path = model_dir / "config.pbtxt"
    if not path.is_file() or path.read_text() != config:
        write_atomic(path, config.encode())


def _prune(model_dir: Path, keep: int) -> None:
    for number in versions(model_dir)[:-keep]:
        _remove(model_dir, model_dir / str(number))


def _remove(model_dir: Path, version: Path) -> None:
    """Rename away, then delete: the server never sees a half-deleted version."""
    gone = model_dir / f"{_GONE}{uuid.uuid4().hex[:12]}"
    os.rename(version, gone)
    shutil.rmtree(gone)


def _sweep(model_dir: Path) -> None:
    """What a killed publish or removal left: only our hidden folders, under the lock."""
    for leftover in model_dir.iterdir():
        if leftover.name.startswith((_TEMP, _GONE)) and leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
