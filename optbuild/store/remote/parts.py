"""What ``RemoteSession``'s mixins (``Writing``, ``Auditing``, ``Listing``) use of the session,
declared once so that a type checker checks the mixins against it; ``session`` defines each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from concurrent.futures import Future, ThreadPoolExecutor
    from contextlib import AbstractContextManager

    from optbuild.store.entry import ActionEntry
    from optbuild.store.remote.crossings import Crossings
    from optbuild.store.remote.filesystem import RemoteStore


class SessionParts:
    """The session's fields and methods its mixins call: annotations only at run time (the
    session, a dataclass, takes its fields from its own annotations, not from here)."""

    store: RemoteStore
    crossings: Crossings
    _lock: threading.Lock
    _suspect: set[str]
    _uploads: list[Future[str]]
    _pool: ThreadPoolExecutor | None
    _prefetched: dict[str, bytes | None]
    _listed: set[str] | None
    _absent: set[str]
    _blobs: dict[str, int] | None
    _blobs_lock: threading.Lock

    if TYPE_CHECKING:
        def warn(self, message: str, *, step: str | None = None, key: str | None = None,
                 error: str | None = None) -> None: ...

        def _usable(self, writing: bool = False) -> bool: ...

        def _call(self, what: str, fn: Callable[..., Any], *args: Any, upload_size: int | None = None,
                  missing_ok: bool = False, requests: int = 1) -> Any: ...

        def _count(self, **deltas: int) -> None: ...

        def _read(self, key: str, slot: str | None, step: str = "") -> bytes: ...

        def _note_absent(self, key: str) -> None: ...

        def _decode(self, data: bytes, key: str) -> ActionEntry: ...

        def _progress(self, direction: str, label: str,
                      size: int | None) -> AbstractContextManager[Callable[..., Any]]: ...
