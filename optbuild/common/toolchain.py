"""Versions of the Python distributions that steps declare as tools.

Injected into planning so that tests (and `--fingerprint` staging) can pose as another
toolchain without editing installed packages.

Some modules are installed by more than one distribution (onnxruntime by "onnxruntime" and
"onnxruntime-gpu"). Both can be installed at once, and then the version that keys a result is
that of the distribution whose files ``import`` loads, which is not the first one metadata
finds: ``loaded_distribution`` reads it from the file the module would load and the
distributions' RECORDs, without importing the module, and warns when several are installed.
"""

from __future__ import annotations

import logging
import re
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path

if typing.TYPE_CHECKING:
    from importlib.metadata import Distribution

log = logging.getLogger(__name__)

# Modules several distributions install, and those distributions, as pip spells them. The
# CUDA-flavoured wheel ("tensorrt-cu12") carries TensorRT's code; the meta-package does not.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "tensorrt": ("tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11", "tensorrt"),
    "tensorrt_rtx": ("tensorrt-rtx-cu13", "tensorrt-rtx-cu12", "tensorrt-rtx"),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino"),
}
_MODULE_OF = {name: module for module, names in DISTRIBUTIONS.items() for name in names}


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them: "onnxruntime_gpu" is "onnxruntime-gpu"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _origin(module: str) -> Path | None:
    """The file ``import module`` would execute, found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return Path(spec.origin).resolve()


def _file_hash(path: Path, mode: str) -> str:
    """``path``'s digest as RECORD writes it (urlsafe base64, no padding)."""
    import base64
    import hashlib

    digest = hashlib.new(mode, path.read_bytes()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _owns(dist: Distribution, origin: Path) -> bool:
    """Whether ``dist``'s RECORD lists ``origin`` with the hash of the file there now: two
    distributions installed into one folder both list it; the one installed last wrote it."""
    for entry in dist.files or ():
        if entry.name != origin.name or entry.parent.name != origin.parent.name:
            continue
        if Path(str(entry.locate())).resolve() == origin:
            return entry.hash is None or entry.hash.value == _file_hash(origin, entry.hash.mode)
    return False


def _installs(dist: Distribution, module: str) -> bool:
    """Whether ``dist`` has files of ``module`` (a meta-package such as "tensorrt" has none)."""
    return any(entry.parts[0] == module or (len(entry.parts) == 1 and entry.name.split(".")[0] == module)
               for entry in dist.files or ())


def _installed(module: str, names: typing.Iterable[str]) -> list[Distribution]:
    """The installed distributions of these names that install ``module``, in sys.path order,
    each folder once."""
    from importlib.metadata import distributions

    found: dict[tuple[str, str], Distribution] = {}
    for name in names:
        for dist in distributions(name=name):
            if _installs(dist, module):
                found.setdefault((normalized(dist.metadata["Name"]), str(dist.locate_file(""))), dist)
    return list(found.values())


def _described(dist: Distribution) -> str:
    return f"{normalized(dist.metadata['Name'])} {dist.version}"


@cache
def loaded_distribution(module: str) -> tuple[str | None, str | None]:
    """(distribution, version) whose files ``import module`` loads; (None, None) when the
    module is not importable or no installed distribution wrote the file it loads.

    Candidates are the distributions ``DISTRIBUTIONS`` names for ``module`` (others, such as a
    nightly build, are looked for among all installed ones only when none of those owns the
    file). Logs a warning when several are installed, or when none owns what is loaded.
    """
    origin = _origin(module)
    names = DISTRIBUTIONS.get(module, (module,))
    candidates = _installed(module, names)
    owner = next((dist for dist in candidates if origin is not None and _owns(dist, origin)), None)
    if owner is None and origin is not None:
        from importlib.metadata import packages_distributions

        others = [name for name in packages_distributions().get(module, ()) if normalized(name) not in names]
        candidates += _installed(module, others)
        owner = next((dist for dist in candidates if _owns(dist, origin)), None)
    installed = " and ".join(f"{_described(d)} (in {d.locate_file('')})" for d in candidates)
    if owner is None:
        if candidates:
            log.warning("%s installed, but `import %s` loads %s, which none of them wrote: keys "
                        "name no version of it", installed, module, origin or "nothing")
        return None, None
    if len(candidates) > 1:
        log.warning("%s are installed side by side, each with the module %s: `import %s` loads %s "
                    "(%s), and keys name that one. Keep one (pip uninstall the others, then "
                    "reinstall the one you mean)", installed, module, module, _described(owner), origin)
    return normalized(owner.metadata["Name"]), owner.version


class Toolchain:
    """Installed distribution versions, looked up once each; ``overrides`` win."""

    def __init__(self, overrides: Mapping[str, str | None] | None = None):
        self._versions: dict[str, str | None] = dict(overrides or {})

    def version(self, distribution: str) -> str | None:
        """The installed version, or None when the distribution is not installed. A
        distribution of a module that several install ("onnxruntime") gives the version of the
        one ``import`` loads ("onnxruntime-gpu" 1.31.1 over "onnxruntime" 1.30.0)."""
        if distribution not in self._versions:
            from importlib.metadata import PackageNotFoundError, version

            module = _MODULE_OF.get(normalized(distribution))
            if module is not None:
                self._versions[distribution] = loaded_distribution(module)[1]
            else:
                try:
                    self._versions[distribution] = version(distribution)
                except PackageNotFoundError:
                    self._versions[distribution] = None
        return self._versions[distribution]
