"""Which folders are optbuild's own, and what optbuild made in them: what ``clean`` may delete.

A folder optbuild creates (the build folder, a cache folder) gets a marker file, so that
``optbuild clean`` can tell it from a folder a setting merely points at (``build_dir =
"../victim"``). Folders made before markers existed are recognised by what only optbuild
puts there: a cache by its ``cas/`` and ``ac/`` folders, a build folder by its
``.optbuild/`` or ``.logs/`` folder. Inside either, ``clean`` deletes only the names
listed here (and a build folder's recipe folders): a file a user put there stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Kind = Literal["build", "cache"]
MARKER = ".optbuild-folder"
_TEXT = "made by optbuild as a {kind} folder: `optbuild clean` deletes what optbuild made in it\n"

# The stat cache (optbuild.common.digest), its SQLite companions, and the copies of a damaged one set aside.
_STATCACHE = {f"statcache.sqlite{part}{aside}" for part in ("", "-journal", "-wal", "-shm")
              for aside in ("", ".damaged")}
# What optbuild itself makes at the top of each kind of folder, its marker aside (a build
# folder also holds one folder per recipe, which the caller names).
MADE_INSIDE: dict[Kind, frozenset[str]] = {
    "build": frozenset({".optbuild", ".logs", ".lockfile.lock"}),
    "cache": frozenset({"cas", "ac", "tmp", "locks", "failed", "state", "stats.jsonl", *_STATCACHE}),
}
# What only optbuild puts in such a folder, so that one made before markers existed is known:
# a cache holds all of these folders, a build folder at least one of them.
_EARLIER: dict[Kind, tuple[tuple[str, ...], str]] = {
    "build": ((".optbuild", ".logs"), "any"),
    "cache": (("cas", "ac"), "all"),
}


def make_folder(path: Path, kind: Kind) -> None:
    """Create ``path`` (and its parents) as optbuild's ``kind`` folder, marked as such.

    A folder that already exists is left as it is, unmarked: optbuild did not make it.
    OSError when it cannot be made.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        return
    (path / MARKER).write_text(_TEXT.format(kind=kind))


def ownership(path: Path, kind: Kind) -> str | None:
    """How ``path`` is known to be optbuild's ``kind`` folder (for messages), or None when it is not."""
    try:
        text: str | None = (path / MARKER).read_text(errors="replace")
    except OSError:
        text = None
    if text is not None:
        return "it carries optbuild's marker" if text == _TEXT.format(kind=kind) else None
    names, needed = _EARLIER[kind]
    found = [name for name in names if (path / name).is_dir() and not (path / name).is_symlink()]
    if found and (needed == "any" or len(found) == len(names)):
        return f"an earlier optbuild made it (it holds {' and '.join(name + '/' for name in found)})"
    return None
