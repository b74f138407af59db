"""Versions of the Python distributions that steps declare as tools.

Injected into planning so that tests (and `--fingerprint` staging) can pose as another
toolchain without editing installed packages.
"""

from __future__ import annotations

from collections.abc import Mapping


class Toolchain:
    """Installed distribution versions, looked up once each; ``overrides`` win."""

    def __init__(self, overrides: Mapping[str, str | None] | None = None):
        self._versions: dict[str, str | None] = dict(overrides or {})

    def version(self, distribution: str) -> str | None:
        """The installed version, or None when the distribution is not installed."""
        if distribution not in self._versions:
            from importlib.metadata import PackageNotFoundError, version

            try:
                self._versions[distribution] = version(distribution)
            except PackageNotFoundError:
                self._versions[distribution] = None
        return self._versions[distribution]
