"""The use cases the CLI offers beyond ``optbuild.api`` (the cache's ls, verify, audit, gc,
push, pull and stats; deploy's selection and its switch of a model repository; a build
node; the step kinds; the graph; lock file diffs), as functions (most over a ``Workspace``)
that return typed results.

``cli/`` parses arguments and prints these results; a Python user calls the same functions
and gets the same behaviour without the CLI. A refusal (no remote, a read-only remote) is an
``OptbuildError`` whose message is the CLI's.
"""

from optbuild.app.cache import CacheStats, GcPolicy, GcResult, audit, entries, gc, gc_policy, stats, verify
from optbuild.app.deploy import DeployOutput, DeploySelection, select_deploys
from optbuild.app.transfer import TransferProgress, TransferReport, TransferResult, pull, push

__all__ = ["CacheStats", "DeployOutput", "DeploySelection", "GcPolicy", "GcResult", "TransferProgress", "TransferReport", "TransferResult",
           "audit", "entries", "gc", "gc_policy", "pull", "push", "select_deploys", "stats", "verify"]
