"""blake2b for the paths that must start fast (the no-op check, the build server's names):
from the ``_blake2`` extension, which skips most of hashlib's import; hashlib's where
another Python lacks it. These digests name and salt things; the cache's are BLAKE3
(``optbuild.common.digest``)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported for it: 2 ms of a no-op's 80
if TYPE_CHECKING:
    from collections.abc import Callable


def blake2b() -> Callable:
    """The blake2b constructor."""
    try:
        from _blake2 import blake2b as constructor
    except ImportError:  # another implementation of Python
        from hashlib import blake2b as constructor
    return constructor
