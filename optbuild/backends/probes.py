"""What each runtime reports about this host (its version, its distribution, the providers
or devices it can use), as sections of the host fingerprint.

Each runtime's package has a ``probe`` module with ``SECTIONS`` (``base.Sections``: section
name -> (probe, the words that name its fields in messages)). ``register_builtin`` adds them to
``optbuild.common.fingerprint`` (which sits below backends and cannot import them); the
package's ``__init__`` calls it, so importing anything of ``optbuild.backends`` registers
them. Probes import nothing heavy until called.
"""

from __future__ import annotations

from optbuild.backends.base import Sections
from optbuild.common.fingerprint import register_section


def builtin_sections() -> Sections:
    """The built-in runtimes' sections, by name."""
    from optbuild.backends.onnxruntime import probe as onnxruntime
    from optbuild.backends.tensorrt import probe as tensorrt

    return {**onnxruntime.SECTIONS, **tensorrt.SECTIONS}


def register_builtin() -> None:
    """Add the built-in runtimes' sections to every live fingerprint of this process."""
    for section, (probe, words) in builtin_sections().items():
        register_section(section, probe, words)
