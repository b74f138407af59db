"""Which project-local Python files a module imports, found by reading, never running, it.

The export key covers these files, so editing a model class in an imported module
rebuilds the export (a cache keyed on the entry file alone would reuse a stale model).
"""

from __future__ import annotations

import ast
from pathlib import Path


def _candidates(module: str, base: Path) -> list[Path]:
    parts = module.split(".") if module else []
    target = base.joinpath(*parts)
    return [target.with_suffix(".py") if parts else base / "__init__.py", target / "__init__.py"]


def _imported(path: Path, roots: list[Path]) -> list[Path]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return []
    found: list[Path] = []

    def add(module: str, base_dirs: list[Path], names: list[str]) -> None:
        for base in base_dirs:
            parts = module.split(".") if module else []
            # each package on the way contributes its __init__.py
            for i in range(1, len(parts)):
                init = base.joinpath(*parts[:i]) / "__init__.py"
                if init.is_file():
                    found.append(init)
            hits = [c for c in _candidates(module, base) if c.is_file()]
            found.extend(hits[:1])
            for name in names:  # `from pkg import submodule`
                sub = base.joinpath(*parts, name)
                for candidate in (sub.with_suffix(".py"), sub / "__init__.py"):
                    if candidate.is_file():
                        found.append(candidate)
                        break
            if hits:
                return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, roots, [])
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names if a.name != "*"]
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                add(node.module or "", [base], names)
            else:
                add(node.module or "", roots, names)
    return found


def local_imports(entry: Path, root: Path) -> list[Path]:
    """Project-local files imported by ``entry``, transitively, in discovery order.

    Modules resolve against the entry's own directory (it is put first on sys.path when
    the callable runs) and ``root``; anything outside ``root`` is not ours to track.
    """
    entry, root = entry.resolve(), root.resolve()
    roots = [entry.parent, root]
    seen: dict[Path, None] = {}
    stack = [entry]
    while stack:
        current = stack.pop()
        for path in _imported(current, roots):
            path = path.resolve()
            if path != entry and path not in seen and path.is_relative_to(root):
                seen[path] = None
                stack.append(path)
    return list(seen)
