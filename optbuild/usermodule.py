"""Import a user's Python file by path: a model builder (export), a data callable
(calibrate, verify, engines), a project-local step kind.

The file becomes a fresh module, named after its path, so two files of the same name in
different folders never share one. Its folder is first on ``sys.path`` while it imports and
for as long as the caller's ``with`` block runs (a data callable's generator may import its
siblings lazily while it is iterated); then ``sys.path`` is restored, and the module and the
siblings it imported from that folder are forgotten, so a later import in the same process
(another project, an edited file) does not reuse them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType


class ImportFailed(ImportError):
    """Running the user's file raised ``cause`` (an ImportError, so a caller that expects
    ImportError from an import still catches it)."""

    def __init__(self, path: Path, cause: BaseException):
        super().__init__(f"importing {path} failed: {type(cause).__name__}: {cause}")
        self.path, self.cause = path, cause


@contextmanager
def imported(path: Path, *, keep: bool = False) -> Iterator[ModuleType]:
    """``path`` imported as a fresh module, its folder first on ``sys.path`` until the block
    ends. ``keep``: the module and its siblings stay in ``sys.modules`` afterwards (a step
    kind's class lives as long as the process); ``sys.path`` is restored either way. Raises
    ImportFailed, chained to the file's own exception, when running the file fails."""
    path = Path(path).resolve()
    directory = path.parent
    name = f"optbuild_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    saved_path, before = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()  # see files written since the last import
    ok = False
    try:
        loader = importlib.machinery.SourceFileLoader(name, str(path))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
        sys.modules[name] = module
        try:
            loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            raise ImportFailed(path, exc) from exc
        ok = True
        yield module
    finally:
        sys.path[:] = saved_path
        if not (ok and keep):
            for key in set(sys.modules) - before:
                if key == name or _from_directory(sys.modules.get(key), key, directory):
                    sys.modules.pop(key, None)


@contextmanager
def imported_or(path: Path, failed: Callable[[ImportFailed], Exception]) -> Iterator[ModuleType]:
    """``imported(path)``, raising ``failed(exc)`` (chained to the file's own exception) when
    running the file fails; what the ``with`` block itself raises passes unchanged."""
    with ExitStack() as stack:
        try:
            module = stack.enter_context(imported(path))
        except ImportFailed as exc:
            raise failed(exc) from exc.cause
        yield module


def load(path: Path) -> ModuleType:
    """``path`` imported for good (see ``imported`` with ``keep``)."""
    with imported(path, keep=True) as module:
        return module


def _from_directory(module: ModuleType | None, key: str, directory: Path) -> bool:
    """Was ``module`` imported through ``directory`` (a sibling of the user's file)?"""
    file = getattr(module, "__file__", None)
    top = key.partition(".")[0]
    if not file or not ((directory / f"{top}.py").exists() or (directory / top).is_dir()):
        return False
    try:
        return Path(file).resolve().is_relative_to(directory)
    except OSError:
        return False
