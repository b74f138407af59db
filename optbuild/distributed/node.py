"""A build node: a Dask worker that offers its host fingerprint (``optbuild worker``).

The fingerprint (probed, or recorded with ``optbuild fingerprint -o FILE`` and given with
``--fingerprint FILE``) is offered twice: as Dask resources (``resources.offered``), by which
the scheduler routes host-keyed steps, and whole, through ``node_info``, from which the
coordinator computes each step's key for the node that will run it.

What a node trusts comes from its operator (``nodeconfig.NodeConfig``: the remote cache, the signing
key, the fingerprint), never from the tasks it is sent (``task``).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from optbuild.distributed.nodeconfig import NodeConfig
from optbuild.distributed.resources import offered


def node_info(dask_worker: Any) -> dict[str, Any] | None:
    """What the coordinator learns of a worker (``Client.run``): None for a worker that
    ``optbuild worker`` did not start (it offers no ``optbuild`` resource and runs no step)."""
    node = getattr(dask_worker, "optbuild_node", None)
    if node is None:
        return None
    return {"name": node.name, "fields": node.fields,
            "resources": dict(getattr(dask_worker, "state", dask_worker).total_resources)}


def reaching(scheduler: str) -> str | None:
    """The address of this host's interface that routes to ``scheduler``'s host (a UDP
    socket connected there sends nothing, but is bound to that interface); None for an
    address that names no IP host (inproc://, ucx://)."""
    protocol, _, location = scheduler.rpartition("://")
    if protocol not in ("", "tcp", "tls", "ws", "wss"):
        return None
    host, _, port = location.rpartition(":")
    host = host.strip("[]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, int(port or 0), type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


def make_worker(scheduler: str, node: NodeConfig, *, nthreads: int = 1, host: str | None = None) -> Any:
    """A Dask worker (not started yet: ``await`` it) that builds as ``node`` and listens on
    ``host`` only (its tasks, and its HTTP server)."""
    from distributed import Worker

    worker = Worker(scheduler, nthreads=nthreads, resources=offered(node.fields, nthreads), name=node.name,
                    host=host, dashboard=False, dashboard_address=f"{_bracketed(host)}:0" if host else None,
                    validate=False)
    worker.optbuild_node = node  # type: ignore[attr-defined]  # ours, read back by getattr in node_info and task
    return worker


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def serve(scheduler: str, node: NodeConfig, *, nthreads: int = 1, host: str | None = None,
                started: Any = None) -> None:
    """Run a node until it is closed (by the scheduler, or a signal)."""
    from optbuild.distributed.task import node_pool
    from optbuild.steps.base import ONNX_TOOLS

    worker = make_worker(scheduler, node, nthreads=nthreads, host=host)
    async with worker:
        node_pool(node).prewarm(ONNX_TOOLS)  # importing while the first steps are sent
        if started is not None:
            started(worker)
        await worker.finished()


def run_node(scheduler: str, node: NodeConfig, **options: Any) -> None:
    asyncio.run(serve(scheduler, node, **options))
