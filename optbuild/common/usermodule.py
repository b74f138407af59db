"""Import a user's Python file by path: a model builder (export), a data callable
(calibrate, verify, engines), a project-local step kind.

The file becomes a fresh module, named after its path, so two files of the same name in
different folders never share one. Its folder is first on ``sys.path`` while it imports and
for as long as the caller's ``with`` block runs (a data callable's generator may import its
siblings lazily while it is iterated); then ``sys.path`` is restored, and the module and the
siblings it imported from that folder are forgotten, so a later import in the same process
(another project, an edited file) does not reuse them.

Inside the block, the file and every module imported from outside the installed environment
(the project's own modules) are compiled from their current source, never from
``__pycache__``: CPython trusts a ``.pyc`` whose recorded mtime (whole seconds) and size match
the source, so a module imported once (a test run, a REPL, a warm server) and then edited
within the same second at the same size would run its old code under a key that names the new.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from optbuild.common.digest import digest_bytes


class ImportFailed(ImportError):
    """Running the user's file raised ``cause`` (an ImportError, so a caller that expects
    ImportError from an import still catches it)."""

    def __init__(self, path: Path, cause: BaseException):
        super().__init__(f"importing {path} failed: {type(cause).__name__}: {cause}", path=str(path))
        self.cause = cause


@contextmanager
def imported(path: Path, *, keep: bool = False) -> Iterator[ModuleType]:
    """``path`` imported as a fresh module, its folder first on ``sys.path`` until the block
    ends. ``keep``: the module and its siblings stay in ``sys.modules`` afterwards (a step
    kind's class lives as long as the process), and so does the loading from source (what the
    kind imports as it runs is the project's code as it is now); ``sys.path`` is restored either
    way. Raises ImportFailed, chained to the file's own exception, when running the file fails."""
    path = Path(path).resolve()
    directory = path.parent
    name = f"optbuild_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    saved_path, before = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()  # see files written since the last import
    inserted = _SOURCE_FINDER not in sys.meta_path
    if inserted:
        sys.meta_path.insert(_path_finder_index(), _SOURCE_FINDER)
    ok = False
    try:
        loader = SourceOnlyLoader(name, str(path))
        spec = importlib.util.spec_from_loader(name, loader)
        assert spec is not None  # a loader with a file name always makes a spec
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            raise ImportFailed(path, exc) from exc
        ok = True
        yield module
    finally:
        if inserted and not (ok and keep):
            sys.meta_path.remove(_SOURCE_FINDER)
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


@contextmanager
def callable_at(ref: str, base_dir: Path, error: Callable[[str], Exception]) -> Iterator[Any]:
    """The callable ``ref`` ("file.py:name", "file.py:Class.method"; the file relative to
    ``base_dir``) names, its file imported from source as ``imported`` does, for the block;
    ``error(message)`` raised for a missing file, a failed import, a missing attribute or one
    that is not callable."""
    file, _, name = ref.rpartition(":")
    path = (base_dir / file).resolve()
    if not path.is_file():
        raise error(f"file not found: {path}")
    with imported_or(path, lambda exc: error(str(exc))) as module:
        target: Any = module
        for part in name.split("."):
            target = getattr(target, part, None)
            if target is None:
                raise error(f"{path} has no attribute {name!r}")
        if not callable(target):
            raise error(f"{ref} is not callable")
        yield target


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


# The digest of the source each project module was last compiled from, by path: what the
# no-op stamp vouches for by content when the file changed just before the build.
compiled: dict[str, str] = {}


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles the file's bytes as they are now; never reads nor writes ``__pycache__``."""

    def get_code(self, fullname: str):
        path = self.get_filename(fullname)
        source = self.get_data(path)
        compiled[os.path.abspath(path)] = digest_bytes(source)
        return self.source_to_code(source, path)


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds modules as sys.path does, and loads those from outside the installed
    environment (the project's own) with ``SourceOnlyLoader``."""

    def find_spec(self, fullname, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if type(loader) is importlib.machinery.SourceFileLoader and not _installed(loader.path):
            spec.loader = SourceOnlyLoader(loader.name, loader.path)
        return spec


_SOURCE_FINDER = _SourceFinder()


def _path_finder_index() -> int:
    """Where the finder goes: just before sys.path's own finder, after the built-in and
    frozen ones (``os`` stays frozen)."""
    for index, finder in enumerate(sys.meta_path):
        if finder is importlib.machinery.PathFinder:
            return index
    return len(sys.meta_path)


@cache
def _installed_roots() -> tuple[str, ...]:
    """Folders whose modules are installed, not the project's: the standard library,
    site-packages, optbuild itself. Their bytecode is theirs to manage."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.add(str(Path(__file__).resolve().parents[1]))  # the optbuild package (this is optbuild/common/)
    return tuple(str(Path(root).resolve()) + "/" for root in roots)


def _installed(file: str) -> bool:
    return str(Path(file).resolve()).startswith(_installed_roots())
