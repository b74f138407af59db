"""optbuild worker --scheduler tcp://HOST:PORT [--fingerprint FILE] [--nthreads N] [--name NAME] [--host HOST]
[--cache DIR] [--cache-max-gb GB]

A build node for the dask executor: a Dask worker that offers this host's fingerprint (or
the one recorded in FILE) as resources, so that steps keyed by host fields run only where
their key holds. It keeps the blobs it fetched and built in a cache of its own. Runs until
interrupted. See docs/distributed.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", required=True, metavar="tcp://HOST:PORT",
                        help="the Dask scheduler to join")
    parser.add_argument("--fingerprint", type=Path, default=None, metavar="FILE",
                        help="offer this recorded fingerprint (optbuild fingerprint -o FILE) instead of "
                             "probing this host")
    parser.add_argument("--nthreads", type=int, default=1, metavar="N", help="steps built at once (default 1)")
    parser.add_argument("--name", default=None,
                        help="the node's name, recorded with what it builds (default: the host name)")
    parser.add_argument("--host", default=None,
                        help="the address to listen on (default: the one that reaches the scheduler)")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="where the node keeps the blobs it fetched and built, for the next tasks "
                             "(default: $XDG_CACHE_HOME/optbuild/node, else ~/.cache/optbuild/node)")
    parser.add_argument("--cache-max-gb", type=float, default=20.0, metavar="GB",
                        help="trim that cache to this size, least recently used first (default 20; "
                             "0: keep nothing, fetch every input of every task)")


def run(args: argparse.Namespace) -> int:
    import json

    from optbuild.distributed import require_distributed
    from optbuild.errors import OptbuildError
    from optbuild.fingerprint import Fingerprint

    require_distributed()
    if args.nthreads < 1:
        raise OptbuildError("--nthreads must be at least 1")
    if args.cache_max_gb < 0:
        raise OptbuildError("--cache-max-gb cannot be negative")
    if args.fingerprint is not None:
        try:
            fields = Fingerprint.load(args.fingerprint).as_dict()
        except (OSError, ValueError, AttributeError) as exc:
            raise OptbuildError(f"cannot read the fingerprint {args.fingerprint}: {exc}") from None
    else:
        fields = Fingerprint().as_dict()
    json.dumps(fields)  # offered to the coordinator as JSON
    from optbuild.distributed.node import NodeCache, run_node

    cache = NodeCache.at(args.cache, int(args.cache_max_gb * 1e9))
    print(f"optbuild worker {args.name or ''}: joining {args.scheduler} with {args.nthreads} thread(s); "
          f"{cache.describe()}", file=sys.stderr, flush=True)
    try:
        run_node(args.scheduler, fields, nthreads=args.nthreads, name=args.name, host=args.host, cache=cache)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the steps it was building are retried elsewhere
        print(f"optbuild worker {args.name or ''}: stopped", file=sys.stderr)
    return 0
