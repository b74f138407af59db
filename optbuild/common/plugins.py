"""Third-party extensions declared as Python entry points (backends, step kinds).

``importlib.metadata`` is imported only when a group is first read: scanning installed
distributions costs more than the rest of a no-op build's lookups.
"""

from __future__ import annotations

from functools import cache


@cache
def declared(group: str) -> dict[str, str]:
    """The entry points of ``group``, name -> ``module:attr``, read once per process."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=group)}
