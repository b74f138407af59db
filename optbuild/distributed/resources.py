"""Dask resources from host fingerprints: what a node offers, what a step asks for.

A node offers ``optbuild`` (every task asks for it, so only ``optbuild worker`` nodes run
steps) and one resource per fingerprint field, named ``FIELD=VALUE`` ("gpu.0.compute_capability=8.0",
"gpu.0.name=NVIDIA A100-SXM4-80GB", "cpu.flags=sse4_1,...,avx2", "os.name=Linux"), each with
as many units as the node runs tasks at once. A step asks for one unit of each field of
its key's host part (``Step.host_key``): Dask then runs it only on nodes where every one of
those fields has the value its key was computed with.
"""

from __future__ import annotations

from typing import Any

MARKER = "optbuild"  # offered by every node that `optbuild worker` started


def resource_name(field: str, value: Any) -> str:
    return f"{field}={value}"


def offered(fields: dict[str, Any], slots: int) -> dict[str, float]:
    """The resources a node with fingerprint ``fields`` offers, ``slots`` units each."""
    resources = {MARKER: float(slots)}
    for field, value in fields.items():
        if value is not None and not isinstance(value, (dict, list)):
            resources[resource_name(field, value)] = float(slots)
    return resources


def requested(host_key: dict[str, Any]) -> dict[str, float]:
    """What a step whose key holds ``host_key`` asks for. A field whose value is None (absent
    on the node) cannot be asked for as a resource; the backend pins such steps to nodes."""
    resources = {MARKER: 1.0}
    for field, value in sorted(host_key.items()):
        if value is not None and not isinstance(value, (dict, list)):
            resources[resource_name(field, value)] = 1.0
    return resources


def satisfies(offer: dict[str, float], request: dict[str, float]) -> bool:
    return all(offer.get(name, 0) >= amount for name, amount in request.items())
