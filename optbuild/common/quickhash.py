"""blake2b for the paths that must start fast (the no-op check, the build server's names):
from the ``_blake2`` extension, which skips most of hashlib's import; hashlib's where
another Python lacks it. These digests name and salt things; the cache's are BLAKE3
(``optbuild.common.digest``)."""

from __future__ import annotations

from typing import Any


def blake2b() -> Any:
    """The blake2b constructor."""
    try:
        from _blake2 import blake2b as constructor
    except ImportError:  # another implementation of Python
        from hashlib import blake2b as constructor
    return constructor
