"""Deprecated: ``optbuild.pyimports`` moved to ``optbuild.common.pyimports`` (internal) when
optbuild's modules went into packages. Kept for one release, so that a step kind written
against it still loads and its author is told where to go: ``local_imports`` from
``optbuild.plugin``, the stable API for step kinds."""

from __future__ import annotations

import warnings

from optbuild.common.pyimports import file_signature, local_imports, parsed

warnings.warn("optbuild.pyimports is deprecated and goes in the next release: import local_imports "
              "from optbuild.plugin (the API for step kinds)", DeprecationWarning, stacklevel=2)

__all__ = ["file_signature", "local_imports", "parsed"]
