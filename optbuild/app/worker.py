"""A build node for the dask executor (``optbuild worker``), as a function a Python user can
call too: its remote cache and signing key from its own environment, the fingerprint it
offers (recorded, or probed here), its blob cache, then the Dask worker until interrupted."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.common.errors import OptbuildError

SIGNING_KEY_ENV = "OPTBUILD_SIGNING_KEY"


@dataclass(frozen=True)
class NodeOptions:
    scheduler: str  # tcp://HOST:PORT (tls:// with Dask's TLS settings)
    remote: str | None = None  # the remote cache's URL (None: $OPTBUILD_REMOTE)
    remote_endpoint: str | None = None  # an S3-compatible server's endpoint
    signing_key_env: str | None = None  # where the signing key is (None: $OPTBUILD_SIGNING_KEY, if set)
    fingerprint: Path | None = None  # a recorded fingerprint to offer (None: this host's)
    nthreads: int = 1
    name: str | None = None  # None: the host name
    host: str | None = None  # the address to listen on (None: the one that reaches the scheduler)
    cache: Path | None = None  # the blob cache (None: $XDG_CACHE_HOME/optbuild/node)
    cache_max_gb: float = 20.0


def serve_node(options: NodeOptions, say: Callable[[str], None] = lambda message: None) -> None:
    """Join the Dask scheduler as a build node and serve until interrupted (Ctrl-C or
    SIGTERM: the steps it was building are retried elsewhere). ``say`` hears what it does."""
    from optbuild.distributed import require_distributed, require_tls_settings

    require_distributed()
    require_tls_settings(options.scheduler, "worker")
    if options.nthreads < 1:
        raise OptbuildError("--nthreads must be at least 1")
    if options.cache_max_gb < 0:
        raise OptbuildError("--cache-max-gb cannot be negative")
    from optbuild.distributed.node import reaching, run_node
    from optbuild.distributed.nodeconfig import NodeCache, NodeConfig

    remote = _remote(options)
    name = options.name or socket.gethostname()
    cache = NodeCache.at(options.cache, int(options.cache_max_gb * 1e9))
    node = NodeConfig(name, _fields(options.fingerprint), remote, cache)
    host = options.host or reaching(options.scheduler)
    signed = f"signing with ${remote.signing_key_env}" if remote.signing_key else "signing nothing (no key)"
    say(f"optbuild worker {name}: joining {options.scheduler} with {options.nthreads} thread(s); remote "
        f"{remote.display_url}, {signed}; {cache.describe()}")

    def started(worker: Any) -> None:
        say(f"optbuild worker {name}: listening on {worker.listen_address}")

    try:
        run_node(options.scheduler, node, nthreads=options.nthreads, host=host, started=started)
    except KeyboardInterrupt:
        say(f"optbuild worker {name}: stopped")


def _fields(fingerprint: Path | None) -> dict[str, Any]:
    """The fingerprint the node offers: recorded in ``fingerprint``, else probed here."""
    import json

    from optbuild.common.fingerprint import Fingerprint

    if fingerprint is None:
        fields = Fingerprint().as_dict()
    else:
        try:
            fields = Fingerprint.load(fingerprint).as_dict()
        except (OSError, ValueError, AttributeError) as exc:
            raise OptbuildError(f"cannot read the fingerprint {fingerprint}: {exc}") from None
    json.dumps(fields)  # offered to the coordinator as JSON
    return fields


def _remote(options: NodeOptions) -> Any:
    """The node's remote cache (``RemoteStore``), with the signing key of its own environment."""
    from optbuild.store.remote import open_remote

    key_env = options.signing_key_env or SIGNING_KEY_ENV
    if options.signing_key_env and not os.environ.get(key_env):
        raise OptbuildError(f"--signing-key-env names ${key_env}, which is not set")
    remote = open_remote("", options.remote, endpoint_url=options.remote_endpoint,
                         signing_key_env=key_env if os.environ.get(key_env) else None)
    if remote is None:
        raise OptbuildError("a node needs the remote cache its builds use: --remote URL (or $OPTBUILD_REMOTE)")
    return remote
