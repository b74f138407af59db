"""The store layer imports nothing above it (issue #11): the cache (local, remote, entries,
locks, failures) knows blobs, entries and keys, never recipes, steps, reporters, the
executor, the API, the lock file or the CLI. What a whole run or a workspace does with the
caches lives above it (optbuild.builder.runstats, optbuild.cli.transfer)."""

from __future__ import annotations

import ast
from pathlib import Path

import optbuild

PACKAGE = Path(optbuild.__file__).resolve().parent
# what the store may use: itself, and the utilities every layer sits on
BELOW_THE_STORE = {"optbuild.store", "optbuild.common.digest", "optbuild.common.errors", "optbuild.common.atomic", "optbuild.common.units"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in it (functions and TYPE_CHECKING blocks
    included), as (line, absolute name)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found += [(node.lineno, f"{module}.{alias.name}") if module in ("optbuild", "optbuild.store")
                      else (node.lineno, module) for alias in node.names]
    return found


def test_the_store_imports_nothing_above_it():
    files = sorted((PACKAGE / "store").glob("*.py"))
    assert len(files) >= 5, files
    offending = []
    for path in files:
        for line, module in imported_modules(path):
            if module.split(".")[0] != "optbuild":
                continue
            if not any(module == allowed or module.startswith(allowed + ".") for allowed in BELOW_THE_STORE):
                offending.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not offending, "\n".join(offending)


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """The check above would pass vacuously if the walk missed imports; it does not."""
    sample = PACKAGE / "store" / "remote.py"
    modules = {module for _line, module in imported_modules(sample)}
    assert "optbuild.store.local" in modules  # under TYPE_CHECKING
    assert "fsspec" in modules  # inside a function
    assert "optbuild.store.entry" in modules


def test_the_flock_helper_is_the_only_caller_of_flock():
    """One file-locking helper: the cache's locks, optbuild.lock's lock and the build server's
    lock file all use it."""
    callers = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                     if "fcntl.flock(" in path.read_text())
    assert callers == ["optbuild/store/flock.py"], callers
