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
import sys
from pathlib import Path


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", required=True, metavar="tcp://HOST:PORT",
                        help="the Dask scheduler to join (tls://HOST:PORT with Dask's TLS settings)")
    parser.add_argument("--remote", default=None, metavar="URL",
                        help="the remote cache this node fetches from and stores into, the one the builds "
                             "use (default: $OPTBUILD_REMOTE); never taken from a task")
    parser.add_argument("--remote-endpoint", default=None, metavar="URL",
                        help="the endpoint of an S3-compatible server (MinIO, Ceph...): http://host:9000")
    parser.add_argument("--signing-key-env", default=None, metavar="NAME",
                        help="the environment variable that holds the key this node signs its entries with "
                             "(default OPTBUILD_SIGNING_KEY, if set; when named here, it must be set)")
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
    from optbuild.app.worker import NodeOptions, serve_node

    options = NodeOptions(args.scheduler, remote=args.remote, remote_endpoint=args.remote_endpoint,
                          signing_key_env=args.signing_key_env, fingerprint=args.fingerprint,
                          nthreads=args.nthreads, name=args.name, host=args.host, cache=args.cache,
                          cache_max_gb=args.cache_max_gb)
    serve_node(options, say=lambda message: print(message, file=sys.stderr, flush=True))
    return 0
