"""Distributed builds on Dask (``[build] executor = "dask"``, ``optbuild worker``).

The machine that runs ``optbuild build`` (the coordinator) keeps the scheduling, the keys,
the cache lookups and the lock file; only the building of a step moves to a Dask worker
(``builder.DaskBuilder``). Artifacts travel through the remote cache's CAS, never through
Dask's memory: the coordinator makes sure that a step's input files and upstream outputs are
there, the task (``task.run_task``) materializes them on its node, runs the step in a worker
process, uploads the outputs and returns the action entry, which the coordinator validates
as it validates any remote entry.

A node (``node.serve``, ``optbuild worker``) offers Dask resources made from its host
fingerprint (``resources``): steps whose key depends on host fields ask for the values
their key was computed with, so they run only where the key holds. A node trusts no task:
it recomputes the task's key from what it fetches, and stores into its own remote cache
with its own signing key (``nodeconfig.NodeConfig``).

``distributed`` is an extra (``pip install 'optbuild[dask]'``), imported only here.
"""

from __future__ import annotations

from optbuild.common.errors import OptbuildError


def require_distributed() -> None:
    """OptbuildError, saying how to install it, when ``distributed`` is missing."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise OptbuildError("the dask executor and `optbuild worker` need Dask's distributed: "
                            "pip install 'optbuild[dask]'") from None


def require_tls_settings(address: str, role: str) -> None:
    """OptbuildError when ``address`` is a TLS address and Dask's configuration (the one place
    TLS is set, for the scheduler, the nodes and the coordinator alike) gives this host no
    certificate for ``role`` ("client": the coordinator, "worker": a node); Dask itself
    would fail with a TypeError."""
    if not address.startswith("tls://"):
        return
    from distributed.security import Security

    security = Security()
    # Security sets its tls_* attributes from Dask's configuration at run time: not in its stubs
    if not (security.tls_ca_file and getattr(security, f"tls_{role}_cert")):  # type: ignore[attr-defined]
        raise OptbuildError(f"{address} is a TLS address, and Dask's configuration gives this host no "
                            f"certificate: set distributed.comm.tls.ca-file, distributed.comm.tls.{role}.cert "
                            f"and distributed.comm.tls.{role}.key (or DASK_DISTRIBUTED__COMM__TLS__CA_FILE, "
                            f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__CERT, ...__KEY); see docs/distributed.md")
