"""Where a project is: the folder of the nearest optbuild.toml at or above a start folder.

Standard library only (os), so that the no-op fast path and ``optbuild diff`` can find the
project before, or without, loading it; ``recipe.find_config`` finds it the same way.
"""

from __future__ import annotations

import os

CONFIG_NAME = "optbuild.toml"


def project_root(start: str | os.PathLike[str] | None = None) -> str | None:
    """The real path of the folder of the nearest optbuild.toml at or above ``start``
    (relative to the current folder; default: it); None when there is none."""
    folder = os.path.realpath(os.path.join(os.getcwd(), start) if start else os.getcwd())
    while True:
        if os.path.isfile(os.path.join(folder, CONFIG_NAME)):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
