"""Edits that CPython's bytecode cache cannot see: same size, same whole-second mtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def edit_within_the_same_second(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (same length) keeping the file's size and mtime: what an
    editor's save within the second of an import looks like to CPython's .pyc check."""
    assert len(old) == len(new)
    stat = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def compile_to_pycache(directory: Path, *modules: str) -> None:
    """Import ``modules`` in another interpreter, as a REPL or a test run would, leaving
    their bytecode in ``__pycache__``."""
    code = "; ".join(f"import {m}" for m in modules)
    subprocess.run([sys.executable, "-c", code], cwd=directory, check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    assert list((directory / "__pycache__").glob("*.pyc"))
