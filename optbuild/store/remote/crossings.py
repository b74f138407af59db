"""How many times each blob crossed the network, per host: the measure of "build without the
bytes" (a Dask build sends each artifact up once, and down only to the hosts that read it).

A session counts its own transfers (host ""); the Dask coordinator adds each node's, which a
node reports with its task's answer."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

UP, DOWN = 0, 1


@dataclass
class Crossings:
    # host ("" for this one) -> blob digest -> [times uploaded, times downloaded]
    hosts: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, digest: str, direction: int, host: str = "", times: int = 1) -> None:
        with self._lock:
            self.hosts.setdefault(host, {}).setdefault(digest, [0, 0])[direction] += times

    def own(self) -> dict[str, list[int]]:
        """This host's counts, as a node reports them."""
        with self._lock:
            return {digest: list(counts) for digest, counts in self.hosts.get("", {}).items()}

    def add(self, host: str, counts: dict[str, list[int]]) -> None:
        """A node's counts (``own`` there) under its name."""
        for digest, (up, down) in counts.items():
            self.count(digest, UP, host, up)
            self.count(digest, DOWN, host, down)

    def per_blob(self) -> dict[str, dict[str, int]]:
        """Per blob: ``up`` (uploads by every host), ``down_here`` (downloads to this host),
        ``down_nodes`` (to the other hosts) and ``down_max`` (the most one host downloaded it)."""
        with self._lock:
            digests = {d for counts in self.hosts.values() for d in counts}
            table = {}
            for digest in sorted(digests):
                per_host = {host: counts.get(digest, [0, 0]) for host, counts in self.hosts.items()}
                table[digest] = {
                    "up": sum(c[UP] for c in per_host.values()),
                    "down_here": per_host.get("", [0, 0])[DOWN],
                    "down_nodes": sum(c[DOWN] for host, c in per_host.items() if host),
                    "down_max": max(c[DOWN] for c in per_host.values()),
                }
            return table
