"""What differs, per step, between the project's optbuild.lock and another (``optbuild
diff``): the lock file at a git revision, or one named by its path. Reads the lock files
only: a diff still works while a recipe does not validate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.common.errors import OptbuildError


@dataclass(frozen=True)
class LockDiff:
    base_label: str  # what the base is, for a person: "optbuild.lock at HEAD (1a2b3c4)"
    base_source: dict[str, Any]  # the same, for a program (--json)
    current: Path  # the lock file of the working tree
    result: dict[str, Any]  # lockdiff.diff's: per step, its changes
    lines: list[str]  # the table a person reads

    @property
    def differs(self) -> bool:
        return bool(self.result["steps"])

    def as_json(self) -> dict[str, Any]:
        from optbuild.builder.lockdiff import FORMAT

        return {"format": FORMAT, "base": self.base_source, "current": str(self.current),
                "differs": self.differs, **self.result}


def lock_file(directory: Path | None) -> Path:
    """The project's lock file (optbuild.toml's [project] lock_file), found without loading
    the recipes."""
    from optbuild.common.projectroot import CONFIG_NAME, project_root
    from optbuild.common.tomlfile import config_table

    root = project_root(directory)
    if root is None:
        start = (directory or Path.cwd()).resolve()
        raise OptbuildError(f"no {CONFIG_NAME} in {start} or any parent directory: not an optbuild project")
    name = (config_table(root, "project") or {}).get("lock_file")
    return Path(root) / (name if isinstance(name, str) and name else "optbuild.lock")


def lock_diff(directory: Path | None, base: str | None = None) -> LockDiff:
    """The lock file of the project at or above ``directory`` against ``base``: a lock file's
    path (relative to ``directory``), else a git revision (default HEAD)."""
    from optbuild.builder import lockdiff, lockfile

    lock = lock_file(directory)
    if not lock.exists():
        raise OptbuildError(f"{lock} does not exist: build first, then compare")
    state = lockfile.load(lock)
    if state.damage is not None:
        raise OptbuildError(f"{lock} is damaged: {state.damage}")
    if base is not None and (path := (directory or Path.cwd()) / base).is_file():
        other = lockdiff.from_file(path)
    else:
        other = lockdiff.from_git(lock, base or "HEAD")
    result = lockdiff.diff(other.steps, state.steps)
    return LockDiff(other.label, other.source, lock, result, lockdiff.table(result))
