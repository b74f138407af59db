"""A build node: a Dask worker that offers its host fingerprint (``optbuild worker``).

The fingerprint (probed, or recorded with ``optbuild fingerprint -o FILE`` and given with
``--fingerprint FILE``) is offered twice: as Dask resources (``resources.offered``), by which
the scheduler routes host-keyed steps, and whole, through ``node_info``, from which the
coordinator computes each step's key for the node that will run it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.distributed.resources import offered


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


def node_info(dask_worker: Any) -> dict[str, Any] | None:
    """What the coordinator learns of a worker (``Client.run``): None for a worker that
    ``optbuild worker`` did not start (it offers no ``optbuild`` resource and runs no step)."""
    fields = getattr(dask_worker, "optbuild_fingerprint", None)
    if fields is None:
        return None
    return {"name": getattr(dask_worker, "optbuild_name", None) or socket.gethostname(),
            "fields": fields, "resources": dict(getattr(dask_worker, "state", dask_worker).total_resources)}


def make_worker(scheduler: str, fields: dict[str, Any], *, nthreads: int = 1, name: str | None = None,
                host: str | None = None, cache: NodeCache | None = None) -> Any:
    """A Dask worker (not started yet: ``await`` it) that offers ``fields`` and keeps its
    blobs in ``cache`` (none if None)."""
    from distributed import Worker

    worker = Worker(scheduler, nthreads=nthreads, resources=offered(fields, nthreads), name=name, host=host,
                    dashboard=False, validate=False)
    worker.optbuild_fingerprint = dict(fields)
    worker.optbuild_name = name or socket.gethostname()
    worker.optbuild_cache = cache
    return worker


async def serve(scheduler: str, fields: dict[str, Any], *, nthreads: int = 1, name: str | None = None,
                host: str | None = None, cache: NodeCache | None = None, started: Any = None) -> None:
    """Run a node until it is closed (by the scheduler, or a signal)."""
    from optbuild.distributed.task import node_pool
    from optbuild.workerpool import ONNX_TOOLS

    worker = make_worker(scheduler, fields, nthreads=nthreads, name=name, host=host, cache=cache)
    async with worker:
        node_pool().prewarm(ONNX_TOOLS)  # importing while the first steps are sent
        if started is not None:
            started(worker)
        await worker.finished()


def run_node(scheduler: str, fields: dict[str, Any], **options: Any) -> None:
    asyncio.run(serve(scheduler, fields, **options))
