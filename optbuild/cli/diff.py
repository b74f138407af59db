"""optbuild diff [REV|LOCKFILE]: per step, what differs between the lock file and another.

The other is the lock file at a git revision (HEAD when none is named), or a lock file
named by its path (a path that exists is taken as one before a revision of that name).
Exit status 0 whether or not anything differs, as ``git diff``; with ``--exit-code`` 1
when something does.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", nargs="?", default=None, metavar="REV|LOCKFILE",
                        help="a git revision (default HEAD), or the path of a lock file")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.add_argument("--exit-code", action="store_true", help="exit with 1 when something differs")


def _lock_file(directory: Path | None) -> Path:
    """The project's lock file (optbuild.toml's [project] lock_file), found without loading
    the recipes: a diff still works while a recipe does not validate."""
    import tomllib

    from optbuild.common.errors import OptbuildError
    from optbuild.common.projectroot import CONFIG_NAME, project_root

    root = project_root(directory)
    if root is None:
        start = (directory or Path.cwd()).resolve()
        raise OptbuildError(f"no {CONFIG_NAME} in {start} or any parent directory: not an optbuild project")
    config = Path(root) / CONFIG_NAME
    try:
        name = tomllib.loads(config.read_text(encoding="utf-8")).get("project", {}).get("lock_file")
    except (OSError, ValueError, AttributeError):
        name = None
    return config.parent / (name if isinstance(name, str) and name else "optbuild.lock")


def run(args: argparse.Namespace) -> int:
    import json

    from optbuild.builder import lockdiff, lockfile
    from optbuild.common.errors import OptbuildError

    lock = _lock_file(args.directory)
    if not lock.exists():
        raise OptbuildError(f"{lock} does not exist: build first, then compare")
    state = lockfile.load(lock)
    if state.damage is not None:
        raise OptbuildError(f"{lock} is damaged: {state.damage}")
    named = args.base
    if named is not None and (path := (args.directory or Path.cwd()) / named).is_file():
        base = lockdiff.from_file(path)
    else:
        base = lockdiff.from_git(lock, named or "HEAD")
    result = lockdiff.diff(base.steps, state.steps)
    differs = bool(result["steps"])
    if args.json:
        print(json.dumps({"format": lockdiff.FORMAT, "base": base.source, "current": str(lock),
                          "differs": differs, **result}, indent=1, sort_keys=False, default=str))
    else:
        print(f"--- {base.label}")
        print(f"+++ {lock.name} (working tree)")
        print("\n".join(lockdiff.table(result)))
    return 1 if differs and args.exit_code else 0
