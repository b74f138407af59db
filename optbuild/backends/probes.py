"""What each runtime reports about this host (its version, its distribution, the providers
or devices it can use), as sections of the host fingerprint.

Each runtime's package has a ``probe`` module with ``SECTIONS``: section name -> (probe,
the words that name its fields in messages). ``register_builtin`` adds them to
``optbuild.common.fingerprint`` (which sits below backends and cannot import them); the
package's ``__init__`` calls it, so importing anything of ``optbuild.backends`` registers
them. Probes import nothing heavy until called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optbuild.common.fingerprint import RuntimeProbe, register_section
from optbuild.common.toolchain import loaded_distribution

if TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint

# section name -> (probe, field -> words)
Sections = Mapping[str, tuple[RuntimeProbe, Mapping[str, str]]]


def distribution_section(module: str) -> RuntimeProbe:
    """A probe of "<module>.version" and "<module>.distribution": the distribution whose files
    ``import module`` loads, read from metadata (the module is not imported)."""

    def probe(host: Fingerprint) -> dict[str, Any]:
        distribution, version = loaded_distribution(module)
        return {f"{module}.version": version, f"{module}.distribution": distribution}

    probe.__name__ = f"probe_{module}"
    return probe


def builtin_sections() -> Sections:
    """The built-in runtimes' sections, by name."""
    from optbuild.backends.onnxruntime import probe as onnxruntime
    from optbuild.backends.tensorrt import probe as tensorrt

    return {**onnxruntime.SECTIONS, **tensorrt.SECTIONS}


def register_builtin() -> None:
    """Add the built-in runtimes' sections to every live fingerprint of this process."""
    for section, (probe, words) in builtin_sections().items():
        register_section(section, probe, words)
