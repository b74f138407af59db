"""The remote cache as configured: its URL from the project, the command line or the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optbuild.store.remote.filesystem import RemoteStore

ENV_URL = "OPTBUILD_REMOTE"
_OFF = {"off", "none", "no", "false", "0"}


# --- configuration ---------------------------------------------------------------------
def open_remote(url: str, override: str | bool | None = None, *, project_root: Path | None = None,
                environ: Mapping[str, str] | None = None, **settings: Any) -> RemoteStore | None:
    """The remote for this run, or None: ``--no-remote`` (False) > ``--remote URL`` (str) >
    $OPTBUILD_REMOTE (a URL, or off/none/0 to disable) > ``url`` (``[remote] url``).

    ``settings`` are RemoteStore's keyword arguments (``[remote]``'s other fields).
    Nothing is imported or contacted here.
    """
    environ = os.environ if environ is None else environ
    if override is False:
        return None
    chosen = override if isinstance(override, str) and override else None
    if chosen is None:
        env = environ.get(ENV_URL, "").strip()
        if env.lower() in _OFF:
            return None
        chosen = env or url
    if not chosen:
        return None
    if "://" not in chosen and not chosen.startswith("/") and project_root is not None:
        chosen = str((project_root / chosen).resolve())  # a plain relative path: from the project root
    return RemoteStore(chosen, environ=environ, **settings)


