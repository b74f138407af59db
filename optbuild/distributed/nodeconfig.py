"""What a build node is told by its operator, never by a task: its name and fingerprint, its
remote cache (with the signing key, from the node's own environment) and its blob cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optbuild.store.remote import RemoteStore


@dataclass(frozen=True)
class NodeCache:
    """Where a node keeps the blobs it fetched and built (a ``LocalStore`` of blobs only),
    and the size it is trimmed to after each task; ``max_bytes`` 0: no cache, every task
    fetches into its own scratch folder."""

    root: Path
    max_bytes: int

    @classmethod
    def at(cls, root: Path | None, max_bytes: int) -> NodeCache:
        if root is None:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            root = Path(base) / "optbuild" / "node"
        return cls(Path(root).absolute(), max(0, max_bytes))

    def describe(self) -> str:
        if not self.max_bytes:
            return "no blob cache"
        return f"blob cache {self.root} (up to {self.max_bytes / 1e9:g} GB)"


@dataclass(frozen=True)
class NodeConfig:
    """What a node is told by its operator (``optbuild worker``'s options and environment):
    a task can name none of it. ``remote`` holds the signing key, read from the node's own
    environment."""

    name: str
    fields: dict[str, Any]
    remote: RemoteStore
    cache: NodeCache | None = None
