"""Paths optbuild writes or deletes, proven to stay where they belong.

Recipe and step names become folder names (``build/<recipe>/<step>``), and the build and
cache folders are emptied by ``optbuild clean``: a name like ``..`` or a folder setting like
``"."`` would otherwise let a build replace, or a clean delete, the project itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from optbuild.common.errors import OptbuildError

MAX_NAME = 100
# a plain name, or a matrix step's instance: name[value,value] (optbuild.project.matrix)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:\[[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*\])?")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a recipe or step name (None if it can): it must be one plain
    path component on every file system."""
    if len(name) <= MAX_NAME and _SAFE_NAME.fullmatch(name):
        return None
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    return "must be letters, digits, _ . - and must not start with '.' or '-'"


def _real(path: Path) -> Path:
    """``path`` absolute, with symlinks and '..' resolved in its folders but not in its last
    component: what an rmtree, rename or unlink of ``path`` would act on."""
    path = Path(path)
    if path.name in ("", ".."):
        return path.resolve()
    return path.parent.resolve() / path.name


def confined(path: Path, root: Path, what: str) -> Path:
    """``path`` as it really is on disk, proven to lie strictly inside ``root``; an
    OptbuildError naming both otherwise."""
    real, base = _real(path), Path(root).resolve()
    if real == base or not real.is_relative_to(base):
        raise OptbuildError(f"refusing to write {what} {path}: it is not inside {base}")
    return real


def folder_problem(folder: Path, root: Path, protected: Iterable[Path]) -> str | None:
    """Why ``folder`` (build or cache) must not be a folder optbuild empties (None if it may
    be): it is the project root or one of its parents, or it holds one of the project's files."""
    real, top = Path(folder).resolve(), Path(root).resolve()
    if top.is_relative_to(real):
        return f"is the project folder {top}" if real == top else f"contains the project folder {top}"
    inside = str(real).rstrip(os.sep) + os.sep
    folders: dict[str, str] = {}  # a folder -> its real path: the recipes of a project share a few
    for path in protected:
        if _real_file(str(path), folders).startswith(inside):
            return f"holds the project file {path}"
    return None


def _real_file(path: str, folders: dict[str, str]) -> str:
    """``os.path.realpath(path)``, with the real path of its folder taken from ``folders``
    (and kept there): a name that is not a symbolic link is where its folder really is."""
    parent, name = os.path.split(os.path.abspath(path))
    if (real_parent := folders.get(parent)) is None:
        real_parent = folders[parent] = os.path.realpath(parent)
    joined = os.path.join(real_parent, name)
    return os.path.realpath(joined) if os.path.islink(joined) else joined
