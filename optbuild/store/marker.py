"""Which folders are optbuild's own, and what optbuild made in them: what ``clean`` may delete.

A folder optbuild creates (the build folder, a cache folder) gets a marker file, so that
``optbuild clean`` can tell it from a folder a setting merely points at (``build_dir =
"../victim"``). A build never takes an existing folder that holds anything but what optbuild
makes there as its build folder (``take_build_folder``). A cache made before markers existed
is recognised by its ``cas/`` and ``ac/`` folders; inside it ``clean`` deletes only the names
listed here. Inside a build folder it deletes what ``store.written`` recorded, and its own
state (``BUILD_STATE``): a file a user put there stays.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from optbuild.common.errors import OptbuildError

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
# optbuild's own state in a build folder, deleted whole by `clean` (the outputs and logs go
# by their records, store.written).
BUILD_STATE = frozenset({".optbuild", ".lockfile.lock"})
# What only optbuild puts in a cache, so that one made before markers existed is known.
_EARLIER_CACHE = ("cas", "ac")
# What only optbuild puts in a build folder, so that one made before markers existed is known
# (when, besides, it holds nothing but folders named after recipes).
_EARLIER_BUILD = (".optbuild", ".logs")


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
    if kind == "cache" and all((path / n).is_dir() and not (path / n).is_symlink() for n in _EARLIER_CACHE):
        return "an earlier optbuild made it (it holds cas/ and ac/)"
    return None


def take_build_folder(path: Path, recipes: Iterable[str]) -> None:
    """Make ``path`` the build folder, marked; an existing one only when it is already
    optbuild's: marked, empty, or holding only what an earlier optbuild made there (its
    ``.optbuild/`` or ``.logs/``, and folders named after this project's recipes).

    A build replaces step folders whole: taking a user's folder (``build_dir =
    "../Documents"``) would put their files in reach. OptbuildError naming it otherwise;
    OSError when it cannot be made.
    """
    path = Path(os.path.normpath(path))  # as people write it: no "proj/../Documents"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        if ownership(path, "build") is not None:
            return
        if (why := _foreign(path, frozenset(recipes))) is not None:
            raise OptbuildError(
                f"the build folder {path} already exists and optbuild did not make it ({why}): optbuild "
                "builds only into a folder of its own. Set [project] build_dir to a new or empty folder, "
                f"or move what {path} holds elsewhere") from None
    (path / MARKER).write_text(_TEXT.format(kind="build"))


def _foreign(path: Path, recipes: frozenset[str]) -> str | None:
    """Why the existing unmarked folder ``path`` is not one optbuild made (None: it is)."""
    if not path.is_dir():
        return "it is not a folder"
    if (path / MARKER).exists():
        return f"its {MARKER} says another kind of folder"
    names = sorted(os.listdir(path))
    if not names:
        return None
    others = [n for n in names if n not in MADE_INSIDE["build"] and not (n in recipes and (path / n).is_dir())]
    if not others and any((path / n).is_dir() and not (path / n).is_symlink() for n in _EARLIER_BUILD):
        return None  # an earlier optbuild's (or the build server's log, written before the first build)
    shown = others or names
    return f"it holds {', '.join(shown[:3])}{' and more' if len(shown) > 3 else ''}"

