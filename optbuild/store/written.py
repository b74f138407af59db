"""What optbuild wrote into the build folder: the records ``optbuild clean`` deletes by.

Each step folder optbuild fills (``<build>/<recipe>/<step>/``) and each failed step's log
it keeps (``<build>/.logs/<recipe>/<step>.log``) gets a small record under
``<build>/.optbuild/written/``, naming every file written there with the digest and size of
its bytes. ``clean`` deletes exactly the recorded files that still hold those bytes, then
the folders left empty: a file a user put there, or changed since, stays. No name read from
anywhere else (the lock file, the recipes, a folder listing) chooses what is deleted, and a
recorded path is deleted only inside the build folder, through no symbolic link.

One record per step folder, replaced whole without an fsync (a build of 10,000 steps must
not pay 10,000 fsyncs): a record lost or torn in a crash only makes ``clean`` keep files,
never delete others.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from optbuild.common.digest import hash_file
from optbuild.common.errors import OptbuildError
from optbuild.common.paths import confined

RECORDS = Path(".optbuild") / "written"  # under the build folder
_RECORDS_TEXT = RECORDS.as_posix()
_SUFFIX = ".json"


@dataclass
class Deleted:
    """What deleting by the records did: files and emptied folders removed, files kept and why."""

    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)
    touched: set[Path] = field(default_factory=set)  # folders that held a recorded file


def record_path(build_dir: Path, written: str) -> Path:
    """Where the record of ``written`` (``recipe/step`` or ``.logs/recipe/step.log``) lies,
    through no symbolic link below the build folder (a linked ``.optbuild`` must not carry a
    write out of it); OptbuildError otherwise. A few lstats, not a realpath: once per step."""
    parts = (*RECORDS.parts, *written.split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise OptbuildError(f"refusing to write the record of {written}: not a plain path")
    folder = build_dir
    for part in parts[:-1]:
        folder = folder / part
        if os.path.islink(folder):
            raise OptbuildError(f"refusing to write the record of {written} through {folder}: "
                                "it is a symbolic link")
    return folder / (parts[-1] + _SUFFIX)


def write(build_dir: Path, written: str, files: Mapping[str, tuple[str, int]]) -> None:
    """Record that ``files`` (path under the build folder -> (digest, size)) were written.

    Replaces the record whole (temp file, rename); no fsync, see the module's note. An
    OSError names the record, not its temp file.
    """
    path = record_path(build_dir, written)
    data = json.dumps({"files": {name: {"digest": d, "size": s} for name, (d, s) in sorted(files.items())}})
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileNotFoundError:  # the recipe's first record
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(OSError):  # on a read-only file system even a missing file's unlink fails
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def is_recorded(build_dir: Path, written: str) -> bool:
    """Whether optbuild recorded writing the folder ``written`` (read only: no need to confine;
    a path as text, as a no-op asks 10,000 times)."""
    return os.path.isfile(f"{build_dir}/{_RECORDS_TEXT}/{written}{_SUFFIX}")


def recorded_files(build_dir: Path, written: str) -> dict[str, tuple[str, int]] | None:
    """The files a record names (path under the build folder -> (digest, size)); None when
    there is no record, or one that cannot be read (a torn one names nothing)."""
    try:
        data = json.loads(record_path(build_dir, written).read_text())
        return {str(name): (str(f["digest"]), int(f["size"])) for name, f in data["files"].items()}
    except (OptbuildError, OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def is_intact(build_dir: Path, written: str) -> bool:
    """Whether a record of ``written`` is there and every file it names that is there still
    holds the bytes recorded: optbuild may replace them."""
    files = recorded_files(build_dir, written)
    return files is not None and all(_deletable(build_dir, name, digest, size)[1] is None
                                     for name, (digest, size) in files.items())


def unrecorded(build_dir: Path, written: str, names: Mapping[str, object] | None, *,
               known: Callable[[Path], bool]) -> list[Path]:
    """The files in the folder ``written`` that its record (``names``, from ``recorded_files``)
    does not name, which a build that replaces the folder whole would delete. With no record
    (a folder an earlier optbuild filled), a file counts as optbuild's when ``known`` says so
    (its bytes are in the cache)."""
    folder = build_dir / written
    if not folder.is_dir() or folder.is_symlink():
        return [folder] if folder.is_symlink() else []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        found.extend(Path(dirpath, name) for name in dirnames if os.path.islink(os.path.join(dirpath, name)))
        for name in filenames:
            path = Path(dirpath, name)
            ours = (path.relative_to(build_dir).as_posix() in names if names is not None
                    else path.is_file() and not path.is_symlink() and known(path))
            if not ours:
                found.append(path)
    return sorted(found)


def delete(build_dir: Path, written: str, deleted: Deleted) -> None:
    """Delete the files the record of ``written`` names that still hold the bytes optbuild
    wrote, then the folders this left empty (up to the build folder), then the record."""
    try:
        record = record_path(build_dir, written)
    except OptbuildError:
        return
    files = recorded_files(build_dir, written)
    for name, (digest, size) in sorted((files or {}).items()):
        path, why = _deletable(build_dir, name, digest, size)
        if path is None:
            continue
        deleted.touched.update(p for p in path.parents if p.is_relative_to(build_dir) and p != build_dir)
        if why is not None:
            deleted.kept.append((path, why))
            continue
        try:
            path.unlink()
        except OSError as exc:
            deleted.kept.append((path, f"kept: could not delete it ({exc.strerror})"))
            continue
        deleted.removed.append(path)
        _prune(path.parent, build_dir, deleted)
    record.unlink(missing_ok=True)
    _prune(record.parent, build_dir / RECORDS, deleted, report=False)


def delete_all(build_dir: Path) -> Deleted:
    """Delete by every record in the build folder (``clean``)."""
    deleted = Deleted()
    root = build_dir / RECORDS
    if root.is_symlink() or not root.is_dir() or not root.resolve().is_relative_to(build_dir.resolve()):
        return deleted
    for dirpath, _dirnames, filenames in sorted(os.walk(root)):
        for name in sorted(filenames):
            if name.endswith(_SUFFIX) and not name.startswith("."):
                written = (Path(dirpath, name).relative_to(root)).as_posix()[: -len(_SUFFIX)]
                delete(build_dir, written, deleted)
    return deleted


def _deletable(build_dir: Path, name: str, digest: str, size: int) -> tuple[Path | None, str | None]:
    """The recorded file at ``name`` and why it must stay (None: it may go); no path when
    it is gone, or when the name does not lead to a file inside the build folder."""
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or any(p in ("", ".", "..") for p in parts):
        return None, None
    path = build_dir / name
    try:
        confined(path, build_dir, "a recorded file")
        st = os.lstat(path)
    except (OptbuildError, OSError):
        return None, None
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return path, "kept: changed since optbuild wrote it"
    try:
        same = hash_file(path)[0] == digest
    except OSError as exc:
        return path, f"kept: could not read it ({exc.strerror})"
    return path, None if same else "kept: changed since optbuild wrote it"


def _prune(folder: Path, top: Path, deleted: Deleted, *, report: bool = True) -> None:
    """Remove ``folder`` and its parents below ``top`` while they are empty."""
    while folder != top and folder.is_relative_to(top) and not folder.is_symlink():
        try:
            folder.rmdir()
        except OSError:
            return
        if report:
            deleted.removed.append(folder)
        folder = folder.parent
