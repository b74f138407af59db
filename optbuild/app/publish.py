"""Publishing deploy steps' outputs into a served Triton model repository, switched atomically.

What Triton serves is decided by one file: ``config.pbtxt``. optbuild appends to the
configuration it publishes ``version_policy { specific { versions: N } }``, so that Triton
serves version N with that configuration and ignores every other version folder. A new version
is copied, fsynced, into a hidden folder of the model's (``.optbuild-tmp-*``: Triton takes only
numeric folders as versions), renamed to its number (not served yet: the configuration names
the old one), and then ``config.pbtxt`` is replaced by one rename: a server that polls at any
moment sees the old version with its configuration or the new version with its own, never a mix.
(A new model's configuration is written before its first version: Triton never finds a version
without it, which it would serve with a configuration of its own making.)
(A model folder switched as one symlink does not work: Triton's poll mode reloads a model when
the newest modification time under it grows, so a rollback to an older tree would go unseen.)

Each version holds ``optbuild.json``: what was published (step, key, where and when it was
built, where it came from, each file's digest) and the configuration it was published with. That
record is the authority: every publish and rollback first repairs the model folder under its lock
(a live configuration that is not the served version's is rewritten; folders above the served
version, left by a killed publish or rollback, are removed), so a rerun after a kill ends
consistent. A rollback writes its intent (``.optbuild-rollback``) before it switches, so that a
retried one finishes it instead of rolling back twice. The highest version number ever published
is kept in ``.optbuild-highest``: a number is never reused, even after a rollback.

Everything written or deleted stays inside the repository: a model folder or a version folder
that is a symbolic link is refused, never followed. One publish at a time per model: an flock
on ``<model>/.optbuild.lock``. Triton ignores these hidden files: its versions are numeric folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.common.atomic import fsync_path, write_atomic
from optbuild.common.digest import hash_file
from optbuild.common.errors import DiskFullError, OptbuildError, describe_os_error, is_disk_full
from optbuild.common.flock import locked
from optbuild.common.jsonfile import read_json
from optbuild.common.paths import name_problem

RECORD = "optbuild.json"
LOCK = ".optbuild.lock"
HIGHEST = ".optbuild-highest"
INTENT = ".optbuild-rollback"
_TEMP = ".optbuild-tmp-"
_GONE = ".optbuild-old-"
# A version folder: ASCII digits, no leading zero (Triton ignores those).
_VERSION = re.compile(r"[1-9][0-9]{0,17}")
_PIN = re.compile(r"(?:\A|\n)version_policy \{ specific \{ versions: ([1-9][0-9]{0,17}) \} \}\n\Z")
_MAX_RECORD = 16 << 20


@dataclass(frozen=True)
class Release:
    """One deploy step's output for one model: ``folder`` holds config.pbtxt and one version."""

    model: str
    folder: Path
    provenance: dict[str, Any]  # step, key, built_on, built_at, source


@dataclass(frozen=True)
class Change:
    model: str
    version: int | None  # the version now served
    what: str  # "published", "unchanged", "repaired", "rolled back"
    previous: int | None = None  # the version served before
    step: str | None = None  # the step whose model is served


def releases(output: Path, provenance: dict[str, Any]) -> list[Release]:
    """The models a deploy step's ``output`` folder holds (``<model>/config.pbtxt``)."""
    found = [Release(p.parent.name, p.parent, provenance) for p in sorted(output.glob("*/config.pbtxt"))]
    if not found:
        raise OptbuildError(f"{output} holds no <model>/config.pbtxt: is it a deploy step's output?")
    return found


def served_config(config: str, version: int) -> str:
    """config.pbtxt as published: the step's configuration, pinned to ``version``."""
    body = config.rstrip("\n")
    return f"{body}\nversion_policy {{ specific {{ versions: {version} }} }}\n"


def versions(model_dir: Path) -> list[int]:
    """The model's version folders (ASCII digits), lowest first; OptbuildError for one that is
    a symbolic link (optbuild never writes or deletes through one)."""
    if not model_dir.is_dir():
        return []
    found = []
    for path in model_dir.iterdir():
        if _VERSION.fullmatch(path.name):
            if path.is_symlink():
                raise OptbuildError(f"refusing to publish into {model_dir}: its version folder {path.name} is a "
                                    f"symbolic link (to {os.readlink(path)}); optbuild writes and deletes only "
                                    "inside the repository: replace the link by a folder, or remove it")
            if path.is_dir():
                found.append(int(path.name))
    return sorted(found)


def served_version(model_dir: Path) -> int | None:
    """The version Triton serves: the one config.pbtxt pins, else (a repository optbuild did not
    pin) the highest version folder."""
    pinned = _pinned(model_dir)
    if pinned is not None and (model_dir / str(pinned)).is_dir():
        return pinned
    numbers = versions(model_dir)
    return numbers[-1] if numbers else None


def problems(model_dir: Path) -> list[str]:
    """Why what Triton would serve from ``model_dir`` is not what optbuild published (empty:
    it is, or it serves nothing): the served version whole, with the configuration it was
    published with."""
    numbers, pinned = versions(model_dir), _pinned(model_dir)
    if not numbers:
        return []  # nothing to serve (a first publish not finished): nothing served wrong
    if pinned is not None and pinned not in numbers:
        return [f"{model_dir / 'config.pbtxt'} pins version {pinned}, which is not there"]
    version = pinned if pinned is not None else numbers[-1]
    folder = model_dir / str(version)
    record = _record(folder)
    if record is None:
        return [f"{folder / RECORD} is missing or unreadable"]
    found = []
    if not isinstance(record.get("files"), dict) or not _holds(folder, record["files"]):
        found.append(f"{folder} does not hold the files its {RECORD} lists")
    if _live(model_dir) != served_config(str(record.get("config")), version):
        found.append(f"{model_dir / 'config.pbtxt'} is not the configuration version {version} was published with")
    return found


def publish(release: Release, to: Path, keep: int, replace: bool = False) -> Change:
    """Make ``release`` the served version of its model in the repository ``to``; OptbuildError
    when another step's model is served under that name, unless ``replace``."""
    source = _source(release.folder)
    files = {p.relative_to(source).as_posix(): p for p in sorted(source.rglob("*")) if p.is_file()}
    digests = {name: hash_file(path)[0] for name, path in files.items()}
    config = (release.folder / "config.pbtxt").read_text()
    model_dir = model_folder(to, release.model, create=True)
    with locked(model_dir / LOCK):
        repaired = _repair(model_dir)
        current = served_version(model_dir)
        ours, theirs = release.provenance.get("step"), _refuse_another(model_dir, current, release, replace)
        if current is not None and theirs == ours and _same(model_dir / str(current), digests, config):
            return Change(release.model, current, "repaired" if repaired else "unchanged", current, ours)
        number = max([_highest(model_dir), *versions(model_dir)]) + 1
        record = {"model": release.model, "version": number, **release.provenance,
                  "published_at": time.time(), "published_on": socket.gethostname(),
                  "files": digests, "config": config}
        try:
            write_atomic(model_dir / HIGHEST, f"{number}\n".encode())  # before it can appear: never reused
            if current is None:  # a new model: configured first, so that Triton never loads it without
                _set_config(model_dir, served_config(config, number))
            _add_version(model_dir, number, files, record)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            # the error names the file it read (the source) when the copy fails: name the target
            raise DiskFullError(f"{describe_os_error(OSError(exc.errno, exc.strerror), model_dir)}: version "
                                f"{number} of {release.model} was not published; version {current} is still "
                                "served") from None
        _set_config(model_dir, served_config(config, number))  # the switch
        _prune(model_dir, keep)
    return Change(release.model, number, "published", current, ours)


def check(release: Release, to: Path, replace: bool = False) -> None:
    """OptbuildError for what ``publish`` would refuse (a link, another step's model), found
    before any model is published: nothing is locked, written or created."""
    if (to / release.model).exists() or (to / release.model).is_symlink():
        model_dir = model_folder(to, release.model, create=False)
        _refuse_another(model_dir, served_version(model_dir), release, replace)


def _refuse_another(model_dir: Path, current: int | None, release: Release, replace: bool) -> str | None:
    """The step that published the served version; OptbuildError naming both steps when it is
    not ``release``'s, unless ``replace``."""
    record = _record(model_dir / str(current)) if current is not None else None
    ours, theirs = release.provenance.get("step"), (record or {}).get("step")
    if record is not None and theirs != ours and not replace:
        raise OptbuildError(f"{model_dir} serves version {current}, published by step {theirs}; {ours} "
                            f"publishes another model under the name {release.model!r}: give one of them "
                            "another model_name, or pass --replace to replace it")
    return theirs


def rollback(to: Path, model: str) -> Change:
    """Serve the version before the served one again, with the configuration it was published
    with, and remove the one served now. Safe to retry: a rollback killed on the way is
    finished by the next one (or by the next publish), not done twice."""
    model_dir = model_folder(to, model, create=False)
    with locked(model_dir / LOCK):
        intent = _intent(model_dir)
        _repair(model_dir)  # finishes a rollback that was killed: this retry is it
        if intent is not None:
            return Change(model, intent["to"], "rolled back", intent["from"], _step(model_dir, intent["to"]))
        current = served_version(model_dir)
        older = [n for n in versions(model_dir) if current is not None and n < current]
        if not older:
            raise OptbuildError(f"{model_dir} has {len(older) + (current is not None)} version(s): nothing to roll "
                                "back to (publish with --keep 2 or more to keep one)")
        previous = older[-1]
        if _record(model_dir / str(previous)) is None:
            raise OptbuildError(f"{model_dir / str(previous) / RECORD} is missing or unreadable: optbuild did not "
                                "publish that version, so it cannot say which config.pbtxt goes with it")
        write_atomic(model_dir / INTENT, json.dumps({"from": current, "to": previous}).encode())
        _finish_rollback(model_dir, previous)
    return Change(model, previous, "rolled back", current, _step(model_dir, previous))


def model_folder(to: Path, model: str, create: bool) -> Path:
    """``to/model``, the real path, proven a folder of its own inside ``to``: never a symbolic
    link, whose target optbuild would write into and delete from."""
    if (problem := name_problem(model)) is not None:
        raise OptbuildError(f"model name {model!r} {problem}")
    if create:
        to.mkdir(parents=True, exist_ok=True)
    elif not to.is_dir():
        raise OptbuildError(f"{to} is not a model repository (no such folder)")
    model_dir = to.resolve() / model
    if model_dir.is_symlink():
        raise OptbuildError(f"refusing to publish into {to / model}: it is a symbolic link (to "
                            f"{os.readlink(model_dir)}); optbuild writes and deletes only inside the repository: "
                            "replace the link by a folder, or publish under another model_name")
    if not model_dir.exists():
        if not create:
            raise OptbuildError(f"{to} has no model {model!r} (its folders: "
                                f"{', '.join(sorted(p.name for p in to.iterdir() if p.is_dir())) or 'none'})")
        model_dir.mkdir()
    if not model_dir.is_dir() or (model_dir / LOCK).is_symlink():
        raise OptbuildError(f"{model_dir} is not a folder of its own (or its {LOCK} is a symbolic link): "
                            "remove it, or publish under another model_name")
    return model_dir


def _source(folder: Path) -> Path:
    """The one version folder of a deploy step's output for a model."""
    found = [p for p in folder.iterdir() if _VERSION.fullmatch(p.name) and p.is_dir()]
    if len(found) != 1:
        raise OptbuildError(f"{folder} holds {len(found)} version folders, not one: is it a deploy step's output?")
    return found[0]


def _repair(model_dir: Path) -> bool:
    """Make the model folder consistent after a killed publish or rollback: a rollback's intent
    finished, folders above the served version removed, the live configuration the served
    version's. Whether anything changed."""
    _sweep(model_dir)
    intent = _intent(model_dir)
    if intent is not None:
        _finish_rollback(model_dir, intent["to"])
        return True
    changed = False
    current = _pinned(model_dir)
    if current is not None and (model_dir / str(current)).is_dir():
        for number in versions(model_dir):
            if number > current and _record(model_dir / str(number)) is not None:  # never served
                _remove(model_dir, model_dir / str(number))
                changed = True
    current = served_version(model_dir)
    record = _record(model_dir / str(current)) if current is not None else None
    if current is not None and record is not None and isinstance(record.get("config"), str):
        changed = _set_config(model_dir, served_config(record["config"], current)) or changed
    return changed


def _finish_rollback(model_dir: Path, previous: int) -> None:
    """Serve ``previous`` with its configuration, then remove every version above it."""
    record = _record(model_dir / str(previous))
    if record is None or not isinstance(record.get("config"), str):
        raise OptbuildError(f"{model_dir / str(previous) / RECORD} is missing or unreadable: the rollback to it "
                            f"cannot be finished; remove {model_dir / INTENT} and publish again")
    _set_config(model_dir, served_config(record["config"], previous))
    for number in versions(model_dir):
        if number > previous:
            _remove(model_dir, model_dir / str(number))
    (model_dir / INTENT).unlink()
    fsync_path(model_dir)


def _add_version(model_dir: Path, number: int, files: dict[str, Path], record: dict[str, Any]) -> None:
    """Copy the files into a hidden folder and rename it to ``number``: it appears whole (on a
    failure, the folder is removed)."""
    temp = model_dir / f"{_TEMP}{uuid.uuid4().hex[:12]}"
    temp.mkdir()
    try:
        for name, path in files.items():
            _copy(path, temp / name)
        write_atomic(temp / RECORD, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        fsync_path(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    os.rename(temp, model_dir / str(number))
    fsync_path(model_dir)


def _record(version: Path) -> dict[str, Any] | None:
    """The version's optbuild.json (None when it has none, or it is not one)."""
    path = version / RECORD
    if path.is_symlink():
        return None
    try:
        record = read_json(path, _MAX_RECORD)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _step(model_dir: Path, version: int) -> str | None:
    return (_record(model_dir / str(version)) or {}).get("step")


def _live(model_dir: Path) -> str | None:
    path = model_dir / "config.pbtxt"
    try:
        return path.read_text() if path.is_file() else None
    except (OSError, ValueError):
        return None


def _pinned(model_dir: Path) -> int | None:
    """The version the live config.pbtxt pins, when optbuild pinned it."""
    match = _PIN.search(_live(model_dir) or "")
    return int(match.group(1)) if match else None


def _highest(model_dir: Path) -> int:
    """The highest version number ever published here (0: none)."""
    try:
        text = (model_dir / HIGHEST).read_text(errors="replace")[:32].strip()
    except OSError:
        return 0
    return int(text) if _VERSION.fullmatch(text) else 0


def _intent(model_dir: Path) -> dict[str, int] | None:
    """The rollback under way ({"from": served, "to": previous}), or None."""
    try:
        intent = json.loads((model_dir / INTENT).read_text()[:256])
    except (OSError, ValueError):
        return None
    if isinstance(intent, dict) and all(isinstance(intent.get(k), int) for k in ("from", "to")):
        return intent
    return None


def _same(version: Path, digests: dict[str, str], config: str) -> bool:
    """Whether ``version`` holds these files and was published with this configuration."""
    record = _record(version)
    if record is None or record.get("files") != digests or record.get("config") != config:
        return False
    return _holds(version, digests)


def _holds(version: Path, digests: dict[str, Any]) -> bool:
    """Whether the files of ``version`` (its record aside) are exactly these, with these digests."""
    on_disk = {p.relative_to(version).as_posix(): p for p in version.rglob("*") if p.is_file() and p.name != RECORD}
    return on_disk.keys() == digests.keys() and all(hash_file(path)[0] == digests[name]
                                                    for name, path in on_disk.items())


def _copy(source: Path, dest: Path) -> None:
    """A copy of its own (not a link into the cache), on disk before the version appears."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    with open(dest, "rb+") as f:
        os.fsync(f.fileno())
    fsync_path(dest.parent)


def _set_config(model_dir: Path, config: str) -> bool:
    """Replace config.pbtxt by one rename when it differs; whether it did."""
    if _live(model_dir) == config:
        return False
    write_atomic(model_dir / "config.pbtxt", config.encode())
    return True


def _prune(model_dir: Path, keep: int) -> None:
    for number in versions(model_dir)[:-keep]:
        _remove(model_dir, model_dir / str(number))


def _remove(model_dir: Path, version: Path) -> None:
    """Rename away, then delete: the server never sees a half-deleted version."""
    gone = model_dir / f"{_GONE}{uuid.uuid4().hex[:12]}"
    os.rename(version, gone)
    shutil.rmtree(gone)


def _sweep(model_dir: Path) -> None:
    """What a killed publish or removal left: only our hidden folders and temporary files,
    under the lock; a symbolic link among them is unlinked, never followed."""
    ours = (_TEMP, _GONE, ".config.pbtxt.", f".{HIGHEST}.", f".{INTENT}.")
    for leftover in model_dir.iterdir():
        if not leftover.name.startswith(ours):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        elif leftover.name.startswith((_TEMP, _GONE)) or leftover.name.endswith(".tmp"):
            leftover.unlink()
