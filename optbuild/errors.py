"""Deprecated: ``optbuild.errors`` moved to ``optbuild.common.errors`` (internal) when
optbuild's modules went into packages. Kept for one release, so that a step kind written
against it still loads and its author is told where to go: ``StepError`` from
``optbuild.plugin``, the stable API for step kinds."""

from __future__ import annotations

import warnings

from optbuild.common.errors import (
    DISK_FULL_ERRNOS,
    CacheError,
    DiskFullError,
    OptbuildError,
    Problem,
    ProjectError,
    StepError,
    StepUnavailable,
    describe_os_error,
    first_line,
    is_disk_full,
)

warnings.warn("optbuild.errors is deprecated and goes in the next release: import StepError from "
              "optbuild.plugin (the API for step kinds)", DeprecationWarning, stacklevel=2)

__all__ = ["DISK_FULL_ERRNOS", "CacheError", "DiskFullError", "OptbuildError", "Problem", "ProjectError",
           "StepError", "StepUnavailable", "describe_os_error", "first_line", "is_disk_full"]
