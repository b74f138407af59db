"""What differs between two lock files, per step: for ``optbuild diff``.

A lock record (see optbuild.builder.lockfile and Scheduler._write_lock) holds a step's key, kind,
outputs, the ingredients of its key (params, files, inputs, tools, host...) and, since
metrics were added to it, its metrics. ``diff`` compares two sets of records and says, per
step, which of these changed; nested values are flattened to dotted paths (``calibration.
method``), so each change is one line. Records written before metrics were recorded have
none: their metrics are unknown, not absent, and are not compared.

The base lock file comes from a file, or from a git revision (``git cat-file``: optbuild
adds no dependency for it).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.common.errors import OptbuildError

FORMAT = 1  # of the JSON document ``optbuild diff --json`` prints
_DIGEST = re.compile(r"[0-9a-f]{64}")
_SHORT = 12  # hex digits a digest is shown with
_WIDTH = 60  # characters a value is shown with, at most

# (section, label): the ingredients compared, in the order changes are listed
_SCALARS = (("kind", "kind"), ("version", "version"), ("salt", "salt"), ("format", "key format"),
            ("hash", "hash"))
_SECTIONS = (("params", "param"), ("files", "file"), ("inputs", "input"), ("tools", "tool"),
             ("host", "host"))


@dataclass
class Base:
    """The lock file compared with: its records and where they come from."""

    steps: dict[str, dict[str, Any]]
    label: str  # for people: "optbuild.lock at HEAD (1a2b3c4)"
    source: dict[str, Any] = field(default_factory=dict)  # for --json


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {"a.b": leaf}; lists and other values are leaves, an empty dict too."""
    if not isinstance(value, dict) or (not value and prefix):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for name in sorted(value, key=str):
        flat.update(flatten(value[name], f"{prefix}.{name}" if prefix else str(name)))
    return flat


def _mapping(record: dict[str, Any], name: str) -> dict[str, Any]:
    """``record[name]`` when it is a table, else {}: a lock file edited by hand may hold anything."""
    value = record.get(name)
    return value if isinstance(value, dict) else {}


def _section(record: dict[str, Any], section: str) -> dict[str, Any]:
    ingredients = _mapping(record, "ingredients")
    value = record.get(section) if section in ("tools", "host") and section in record else ingredients.get(section)
    return flatten(value) if isinstance(value, dict) else {}


def _change(what: str, name: str, old: Any, new: Any, *, missing: object = None) -> dict[str, Any]:
    change: dict[str, Any] = {"what": what, "name": name}
    if old is not missing:
        change["old"] = old
    if new is not missing:
        change["new"] = new
    return change


_ABSENT = object()


def step_changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """The changes between two records of one step: [{"what", "name", "old", "new"}], with
    "old" or "new" left out where that record has no such value."""
    changes: list[dict[str, Any]] = []
    old_ing, new_ing = _mapping(old, "ingredients"), _mapping(new, "ingredients")
    for section, label in _SCALARS:
        a = old.get(section, old_ing.get(section, _ABSENT)) if section == "kind" else old_ing.get(section, _ABSENT)
        b = new.get(section, new_ing.get(section, _ABSENT)) if section == "kind" else new_ing.get(section, _ABSENT)
        if a != b:
            changes.append(_change(label, "", a, b, missing=_ABSENT))
    sections = [(_section(old, s), _section(new, s), label) for s, label in _SECTIONS]
    if isinstance(old.get("metrics"), dict) and isinstance(new.get("metrics"), dict):
        sections.append((flatten(old["metrics"]), flatten(new["metrics"]), "metric"))
    sections.append(({"": old.get("key")}, {"": new.get("key")}, "key"))
    sections.append((_mapping(old, "outputs"), _mapping(new, "outputs"), "output"))
    for before, after, label in sections:
        for name in sorted(set(before) | set(after)):
            a, b = before.get(name, _ABSENT), after.get(name, _ABSENT)
            if a != b:
                changes.append(_change(label, name, a, b, missing=_ABSENT))
    return changes


def diff(base: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{"steps": {step: {"status": added|removed|changed, "kind", "changes"}}, "unchanged":
    [steps]}; steps in name order."""
    steps: dict[str, dict[str, Any]] = {}
    unchanged: list[str] = []
    for sid in sorted(set(base) | set(current)):
        old, new = base.get(sid), current.get(sid)
        if old is None or new is None:
            record = new if old is None else old
            assert record is not None  # sid is in base or in current
            steps[sid] = {"status": "added" if old is None else "removed", "kind": record.get("kind"),
                          "key": record.get("key")}
            continue
        changes = step_changes(old, new)
        if changes:
            steps[sid] = {"status": "changed", "kind": new.get("kind"), "changes": changes}
        else:
            unchanged.append(sid)
    return {"steps": steps, "unchanged": unchanged}


def show(value: Any) -> str:
    """A value as one short cell: a digest shortened, text unquoted, the rest as JSON."""
    if value is _ABSENT:
        return "(none)"
    if isinstance(value, str) and _DIGEST.fullmatch(value):
        return value[:_SHORT]
    if isinstance(value, str) and value and value.strip() == value and "\n" not in value:
        text = value
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + "..."


def table(result: dict[str, Any]) -> list[str]:
    """The differences as lines: per changed step its id and kind, then one line a change
    (what, name, old -> new); added and removed steps one line each; then a count of the
    steps unchanged."""
    lines: list[str] = []
    rows = [(c["what"], c["name"]) for s in result["steps"].values() for c in s.get("changes", ())]
    what_w = max((len(w) for w, _ in rows), default=0)
    name_w = max((len(n) for _, n in rows), default=0)
    for sid, step in result["steps"].items():
        kind = f"  ({step['kind']})" if step.get("kind") else ""
        if step["status"] != "changed":
            sign = "+" if step["status"] == "added" else "-"
            lines.append(f"{sign} {sid}{kind}  {step['status']}")
            continue
        lines.append(f"~ {sid}{kind}")
        for c in step["changes"]:
            old, new = show(c.get("old", _ABSENT)), show(c.get("new", _ABSENT))
            lines.append(f"    {c['what']:<{what_w}}  {c['name']:<{name_w}}  {old} -> {new}".rstrip())
    n = len(result["unchanged"])
    if not result["steps"]:
        lines.append(f"no differences ({n} step{'' if n == 1 else 's'})")
    elif n:
        lines.append(f"{n} step{'' if n == 1 else 's'} unchanged")
    return lines


# -- where the base lock file comes from ------------------------------------------------

def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except FileNotFoundError:
        raise OptbuildError("git is not installed: name a lock file to compare with instead") from None


def _parse(text: bytes, where: str) -> dict[str, dict[str, Any]]:
    from optbuild.builder import lockfile

    state = lockfile.parse(text)
    if state.damage is not None:
        raise OptbuildError(f"{where} is damaged: {state.damage}")
    return state.steps


def from_file(path: Path) -> Base:
    from optbuild.builder import lockfile

    state = lockfile.load(path)
    if state.damage is not None:
        raise OptbuildError(f"{path} is damaged: {state.damage}")
    return Base(state.steps, str(path), {"file": str(path)})


def from_git(lock_file: Path, rev: str) -> Base:
    """The lock file as it is at git revision ``rev`` (the project may be a subfolder of
    the repository: the path is taken relative to the lock file's folder)."""
    folder = lock_file.parent
    if not folder.is_dir():
        raise OptbuildError(f"{folder} is not a folder")
    top = _git(["rev-parse", "--show-toplevel"], folder)
    if top.returncode != 0:
        raise OptbuildError(f"{folder} is not in a git repository: name a lock file to compare with "
                            "instead (optbuild diff PATH)")
    commit = None if rev.startswith("-") else _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], folder)
    if commit is None or commit.returncode != 0:
        raise OptbuildError(f"unknown revision {rev!r} (and no file of that name)")
    sha = commit.stdout.decode().strip()
    prefix = _git(["rev-parse", "--show-prefix"], folder).stdout.decode().strip()
    relative = f"{prefix}{lock_file.name}"
    blob = _git(["cat-file", "blob", f"{sha}:{relative}"], folder)
    where = f"{relative} at {rev} ({sha[:7]})"
    if blob.returncode != 0:
        raise OptbuildError(f"{relative} is not in {rev} ({sha[:7]}): no lock file was committed there")
    return Base(_parse(blob.stdout, where), where, {"git": rev, "commit": sha, "path": relative})
