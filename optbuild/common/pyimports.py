"""Which project-local Python files a module imports, found by reading, never running, it.

The export key covers these files, so editing a model class in an imported module
rebuilds the export (a cache keyed on the entry file alone would reuse a stale model).

What is found (conservatively: an import that may never run still counts):
- ``import a.b`` -> ``a/__init__.py``, ``a/b.py``; ``from a import b`` -> ``a``'s file and
  ``a/b.py`` when ``b`` is a submodule; relative imports (``from . import x``,
  ``from ..pkg import y``) against the importing file's package;
  ``importlib.import_module("a.b")`` / ``__import__("a")`` with a literal name.
- imports anywhere in a file (inside functions, ``try``, ``if TYPE_CHECKING``).
Absolute imports resolve against the entry's own directory (first on ``sys.path`` when the
export runs it) and then the project root. Files outside the root (stdlib, site-packages,
other checkouts) are not ours to track. Not found: names built at run time
(``import_module(f"models.{name}")``): list such files in the step's ``extra_files``.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path


def _resolve(parts: list[str], base: Path) -> tuple[list[Path], Path | None] | None:
    """Files run by importing the dotted module ``parts`` from the directory ``base``, and
    the package directory it names (None for a plain module); None if ``base`` lacks it.

    Mirrors one sys.path entry's finder: a regular package (dir with ``__init__.py``) wins
    over ``name.py``, which wins over a namespace package (a dir without ``__init__.py``).
    """
    files: list[Path] = []
    current = base
    for i, part in enumerate(parts):
        directory, module = current / part, current / f"{part}.py"
        if (directory / "__init__.py").is_file():
            files.append(directory / "__init__.py")
            current = directory
        elif module.is_file():
            files.append(module)
            return files, None  # a module has no submodules: the rest cannot import
        elif directory.is_dir():
            current = directory  # namespace package: no file of its own
        else:
            return None if i == 0 else (files, None)
    return files, current


def _absolute(module: str, roots: list[Path]) -> tuple[list[Path], Path | None]:
    parts = module.split(".")
    for base in roots:
        if (found := _resolve(parts, base)) is not None:
            return found
    return [], None


def _literal_import(node: ast.Call) -> str | None:
    """The module of ``importlib.import_module("x")`` / ``__import__("x")``, if a literal."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value and not arg.value.startswith("."):
        return arg.value
    return None


Signature = tuple[int, int, int]  # (inode, size, mtime): a file's identity for the caches here


def file_signature(path: Path) -> Signature | None:
    """``path``'s (inode, size, mtime), None when it cannot be stat'ed."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


@lru_cache(maxsize=512)
def parsed(path: Path, signature: Signature) -> ast.Module | None:
    """``path`` parsed, never run; None when it cannot be read or parsed. Cached by its
    signature: planning reads the same few model and data files for their imports (here)
    and their callables (optbuild.common.callables), and parsing is most of what that costs."""
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
        return None


@lru_cache(maxsize=512)
def _import_nodes(path: Path, signature: Signature) -> tuple[ast.Import | ast.ImportFrom | ast.Call, ...]:
    """The import statements and calls of ``path``, in source order."""
    tree = parsed(path, signature)
    if tree is None:
        return ()  # the file itself still keys the step; nothing inside it can be followed
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom | ast.Call)]
    return tuple(sorted(nodes, key=lambda n: (n.lineno, n.col_offset)))


def _imported(path: Path, roots: list[Path]) -> list[Path]:
    """The local files ``path`` imports directly, in source order (may repeat)."""
    if (signature := file_signature(path)) is None:
        return []
    nodes = _import_nodes(path, signature)
    found: list[Path] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.extend(_absolute(alias.name, roots)[0])
        elif isinstance(node, ast.Call):
            if (module := _literal_import(node)) is not None:
                found.extend(_absolute(module, roots)[0])
        else:
            directory: Path | None
            if node.level:
                package = path.parent
                for _ in range(node.level - 1):
                    package = package.parent
                init = package / "__init__.py"
                files, directory = ([init] if init.is_file() else []), package
                if node.module:
                    resolved = _resolve(node.module.split("."), package)
                    inner, directory = resolved if resolved is not None else ([], None)
                    files += inner
            else:
                files, directory = _absolute(node.module or "", roots)
            found.extend(files)
            if directory is not None:  # `from pkg import name`: name may be a submodule
                for alias in node.names:
                    if alias.name != "*" and (sub := _resolve([alias.name], directory)) is not None:
                        found.extend(sub[0])
    return found


def local_imports(entry: Path, root: Path) -> list[Path]:
    """Project-local ``.py`` files that ``entry`` imports, transitively: absolute paths,
    in order of discovery (breadth first, source order within a file), each once, without
    ``entry`` itself. Cycles are harmless. Files with syntax errors are listed but not read
    further.
    """
    entry, root = entry.resolve(), root.resolve()
    roots = [entry.parent, root] if entry.parent != root else [root]
    seen: dict[Path, None] = {}
    queue = [entry]
    while queue:
        current = queue.pop(0)
        for path in _imported(current, roots):
            path = path.resolve()
            if path == entry or path in seen or not path.is_relative_to(root):
                continue
            seen[path] = None
            queue.append(path)
    return list(seen)
