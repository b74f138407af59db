"""optbuild worker --scheduler tcp://HOST:PORT --remote URL [--remote-endpoint URL]
[--signing-key-env NAME] [--fingerprint FILE] [--nthreads N] [--name NAME] [--host HOST]
[--cache DIR] [--cache-max-gb GB]

A build node for the dask executor: a Dask worker that offers this host's fingerprint (or
the one recorded in FILE) as resources, so that steps keyed by host fields run only where
their key holds. It stores what it builds in its own remote cache (--remote, else
$OPTBUILD_REMOTE), signed with the key in its own environment ($OPTBUILD_SIGNING_KEY), and
keeps the blobs it fetched and built in a cache of its own. Runs until interrupted. TLS:
Dask's own configuration. See docs/distributed.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

SIGNING_KEY_ENV = "OPTBUILD_SIGNING_KEY"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", required=True, metavar="tcp://HOST:PORT",
                        help="the Dask scheduler to join (tls://HOST:PORT with Dask's TLS settings)")
    parser.add_argument("--remote", default=None, metavar="URL",
                        help="the remote cache this node fetches from and stores into, the one the builds "
                             "use (default: $OPTBUILD_REMOTE); never taken from a task")
    parser.add_argument("--remote-endpoint", default=None, metavar="URL",
                        help="the endpoint of an S3-compatible server (MinIO, Ceph...): http://host:9000")
    parser.add_argument("--signing-key-env", default=None, metavar="NAME",
                        help=f"the environment variable that holds the key this node signs its entries with "
                             f"(default {SIGNING_KEY_ENV}, if set; when named here, it must be set)")
    parser.add_argument("--fingerprint", type=Path, default=None, metavar="FILE",
                        help="offer this recorded fingerprint (optbuild fingerprint -o FILE) instead of "
                             "probing this host")
    parser.add_argument("--nthreads", type=int, default=1, metavar="N", help="steps built at once (default 1)")
    parser.add_argument("--name", default=None,
                        help="the node's name, recorded with what it builds (default: the host name)")
    parser.add_argument("--host", default=None,
                        help="the address to listen on (default: that of the interface that reaches the scheduler)")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="where the node keeps the blobs it fetched and built, for the next tasks "
                             "(default: $XDG_CACHE_HOME/optbuild/node, else ~/.cache/optbuild/node)")
    parser.add_argument("--cache-max-gb", type=float, default=20.0, metavar="GB",
                        help="trim that cache to this size, least recently used first (default 20; "
                             "0: keep nothing, fetch every input of every task)")


def run(args: argparse.Namespace) -> int:
    import socket

    from optbuild.common.errors import OptbuildError
    from optbuild.distributed import require_distributed, require_tls_settings

    require_distributed()
    require_tls_settings(args.scheduler, "worker")
    if args.nthreads < 1:
        raise OptbuildError("--nthreads must be at least 1")
    if args.cache_max_gb < 0:
        raise OptbuildError("--cache-max-gb cannot be negative")
    from optbuild.distributed.node import reaching, run_node
    from optbuild.distributed.nodeconfig import NodeCache, NodeConfig

    remote = _remote(args)
    name = args.name or socket.gethostname()
    cache = NodeCache.at(args.cache, int(args.cache_max_gb * 1e9))
    node = NodeConfig(name, _fields(args.fingerprint), remote, cache)
    host = args.host or reaching(args.scheduler)
    signed = f"signing with ${remote.signing_key_env}" if remote.signing_key else "signing nothing (no key)"
    print(f"optbuild worker {name}: joining {args.scheduler} with {args.nthreads} thread(s); remote "
          f"{remote.display_url}, {signed}; {cache.describe()}", file=sys.stderr, flush=True)

    def started(worker: Any) -> None:
        print(f"optbuild worker {name}: listening on {worker.listen_address}", file=sys.stderr, flush=True)

    try:
        run_node(args.scheduler, node, nthreads=args.nthreads, host=host, started=started)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the steps it was building are retried elsewhere
        print(f"optbuild worker {name}: stopped", file=sys.stderr)
    return 0


def _fields(fingerprint: Path | None) -> dict[str, Any]:
    """The fingerprint the node offers: recorded in ``fingerprint``, else probed here."""
    import json

    from optbuild.common.errors import OptbuildError
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


def _remote(args: argparse.Namespace) -> Any:
    """The node's remote cache (``RemoteStore``), with the signing key of its own environment."""
    from optbuild.common.errors import OptbuildError
    from optbuild.store.remote import open_remote

    key_env = args.signing_key_env or SIGNING_KEY_ENV
    if args.signing_key_env and not os.environ.get(key_env):
        raise OptbuildError(f"--signing-key-env names ${key_env}, which is not set")
    remote = open_remote("", args.remote, endpoint_url=args.remote_endpoint,
                         signing_key_env=key_env if os.environ.get(key_env) else None)
    if remote is None:
        raise OptbuildError("a node needs the remote cache its builds use: --remote URL (or $OPTBUILD_REMOTE)")
    return remote
