"""What a module remembers for the rest of its process (the warnings it gave once), declared
where it lives, so that a long-lived process (the build server) can start each build as a
fresh process would: ``reset`` forgets all of it. The functools caches of optbuild's modules
are found by the server itself (each has ``cache_clear``); this is for the plain state."""

from __future__ import annotations

from collections.abc import Callable

_RESETS: list[Callable[[], None]] = []


def fresh_set() -> set:
    """An empty set that ``reset`` empties again."""
    remembered: set = set()
    _RESETS.append(remembered.clear)
    return remembered


def fresh_dict() -> dict:
    """An empty dict that ``reset`` empties again."""
    remembered: dict = {}
    _RESETS.append(remembered.clear)
    return remembered


def reset() -> None:
    """Forget what every module remembered for this process."""
    for forget in _RESETS:
        forget()
