"""The no-op fast path of ``optbuild build``: a build that nothing can have changed settles
from a stamp, without loading the project (no pydantic, rich, NVML, plugin scan).

Importing this module costs only the standard library's os, sys and time (and
optbuild.common.projectroot, which needs only os); json (and a blake2b hasher) are imported when
a stamp is read or written.

What a stamp records, and when it is unusable: ``optbuild.common.noopstamp``.

**Fast path.** ``try_fast_path`` runs first in ``optbuild.cli.main``. When the command is
``build`` and the stamp matches in every respect above, it prints the recorded step lines
and the summary, appends the cache-statistics record (marked ``"fast_path": true``) as a
normal no-op does, and returns 0. ``-j/--jobs`` and ``-k/--keep-going`` are not compared (a
no-op runs no step, and has no failure to go past: ``noopstamp.answer_args``). ``plan`` with
the arguments of the recorded build (those two aside: a plan has neither) takes it too: a
plan's answer then is the no-op's (each step cached, or unavailable and skipped for
the reasons recorded), its lines and summary on stdout as a plan's are, with the warnings a
plan gives before them (deploy steps that publish one model name, recorded with the stamp),
and no statistics. Its step lines come in the recorded build's order. Anything else, including an unreadable stamp, returns
None: the normal path. What the fast path does not do, unlike a normal no-op: refresh the
cache entries' last-use time (gc keeps the entries the lock file names anyway), sweep
stale scratch folders, or trim the statistics file (the next normal run does).

**Part of the project changed.** When everything but some steps' own files is as recorded
(an input file or a recipe edited, an output or a cache entry removed, a step's file too
young to vouch for itself), the fast path is declined but leaves what the change reaches
(``optbuild.common.noopreach.Reach``, ``take_reach``) for the build or plan that follows in
this process: it loads only the recipes reached and replays the other steps as recorded
(``optbuild.cli.build.open_reached``). A build server finds the reach itself (``find_reach``).

``OPTBUILD_DEBUG_FASTPATH=1`` prints on stderr why the fast path was declined (or that it
was taken), and what the recording said.
"""

from __future__ import annotations

import os
import sys
import time

from optbuild.common.noopreach import Reach
from optbuild.common.noopstamp import (
    FORMAT,
    answer_args,
    build_dir_of,
    content_digest,
    debug,
    env_digests,
    host_facts,
    python_identity,
    salt,
    salt_id,
    salt_path,
    shown,
    split_command_args,
    stamp_path,
    steps_path,
)
from optbuild.common.projectroot import CONFIG_NAME, project_root
from optbuild.common.sigtable import SigTable

_reach: Reach | None = None  # what ``try_fast_path`` found a change reaches (``take_reach``)


def try_fast_path(argv: list[str]) -> int | None:
    """0 after printing the recorded answer, when nothing changed since the last ok build;
    None (the normal path must run) otherwise, or on any error."""
    started, why = time.perf_counter(), None
    try:
        found = _check(argv)
    except Exception as exc:  # never a crash, never a false no-op
        found, why = None, f"{type(exc).__name__}: {exc}"
    else:
        if isinstance(found, Reach):
            global _reach
            _reach, why = found, f"partial: {found.describe()}; loading {len(found.recipes)} recipes"
            found = None
        elif isinstance(found, str):
            found, why = None, found
    if found is None:
        if why:
            debug(f"declined: {why}")
        return None
    debug("taken: nothing changed since the last build")
    plan = found["command"] == "plan"
    answer = sys.stdout if plan else sys.stderr  # a plan's answer is its output (optbuild.cli.plan)
    for line in found.get("plan_warnings", []) if plan else []:
        print(line, file=sys.stderr)
    if found["lines"]:  # one write: stderr is line-buffered, and 10,000 writes cost 30 ms
        answer.write("\n".join(found["lines"]) + "\n")
    counts = ", ".join(f"{n} {status}" for status, n in found["counts"].items() if n)
    print(f"ok: {counts or 'nothing to do'} in {time.perf_counter() - started:.2f}s "
          "(nothing changed since the last build: fast path)", file=answer)
    if isinstance(cache_line := found.get("cache_line"), str):  # a remote is configured
        print(cache_line, file=sys.stderr)
    if not plan:  # a plan, a dry run, keeps no statistics
        _append_stats(found)
    return 0


def find_reach(argv: list[str]) -> Reach | None:
    """For a build server, which runs the builds its clients' fast path declined: what the
    change since the last ok build reaches, found here as the fast path finds it (nothing of
    it is taken from the client), kept for ``take_reach``; None when the build loads all."""
    global _reach
    _reach = None
    try:
        found = _check(argv)
    except Exception:  # as the fast path: never a crash
        return None
    if isinstance(found, Reach):
        _reach = found
    return _reach


def take_reach(root: str) -> Reach | None:
    """What the change since the last ok build reaches, when the fast path found that only
    some steps' own files changed in the project at ``root`` (once: the build takes it)."""
    global _reach
    found, _reach = _reach, None
    return found if found is not None and found.root == root else None


def _check(argv: list[str]) -> dict | Reach | str | None:
    """The stamp when it holds; what the change reaches when only some steps' own files
    changed; else why not (a string), or None when not a build at all."""
    split = split_command_args(argv)
    if split is None:
        return None
    command, directory, build_args = split
    root = project_root(directory)
    if root is None:
        return f"no {CONFIG_NAME} found"
    build_dir = build_dir_of(root)
    try:
        with open(stamp_path(build_dir), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return "no record of an earlier ok build"
    import json

    try:
        stamp = json.loads(data)
    except ValueError:
        return "the record is damaged"
    if not isinstance(stamp, dict) or stamp.get("format") != FORMAT:
        return "the record is of another format"
    if stamp.get("root") != root or stamp.get("build_dir") != build_dir:
        return "the record is of another project folder"
    recorded = stamp.get("argv")
    if not isinstance(recorded, list) or answer_args("build", recorded) != answer_args(command, build_args):
        return f"other arguments (last: {' '.join(['build', *recorded]) if isinstance(recorded, list) else 'unknown'})"
    if stamp.get("unusable"):
        return f"the last build could not vouch for its files: {stamp['unusable']}"
    if stamp.get("python") != python_identity():
        return "another Python interpreter or sys.path (python -c and -m put the current folder on it)"
    try:
        key = salt(create=False)
    except (OSError, ValueError) as exc:
        return f"no private salt for the environment's digests: {exc}"
    if stamp.get("salt") != salt_id(key):
        return f"the record was keyed with another salt than {salt_path()} (another user, or it was renewed)"
    env = env_digests(key)
    if stamp.get("env") != env:
        old = stamp.get("env") or {}
        names = sorted(n for n in set(env) | set(old) if env.get(n) != old.get(n))
        return f"environment variable {', '.join(names)} changed"
    if stamp.get("host") != host_facts():
        return "the host changed (reboot, GPU devices or driver)"
    lines = stamp.get("lines")
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines) \
            or not isinstance(stamp.get("counts"), dict):
        return "the record is damaged"
    try:
        table = SigTable.from_json(stamp["table"])
    except (KeyError, TypeError, ValueError):
        return "the record is damaged"
    changed: dict[int, str] = {}  # a step's own file, by its place in the table: why it is not as recorded
    for i in table.changed():
        if i < stamp["shared"]:
            return f"{shown(table.paths[i], root)} changed"
        changed[i] = f"{shown(table.paths[i], root)} changed"
    if stamp["digests"]:
        place = {path: i for i, path in enumerate(table.paths)}
        for path, digest in stamp["digests"].items():
            try:
                why = None if content_digest(path) == digest else f"{shown(path, root)} changed"
            except OSError:
                why = f"{shown(path, root)} cannot be read"
            if why is not None:
                if place[path] < stamp["shared"]:
                    return why
                changed[place[path]] = why
    if not changed and stamp["racy_steps"] == 0:
        return {**stamp, "command": command}
    if not _with_steps(stamp, build_dir):
        return "the record of the steps is damaged or of another build"
    dirty = {}
    for sid, step in stamp["steps"].items():
        why = step.get("unusable")
        if why is None and changed:  # else none of its files changed: 10,000 steps' paths spared
            why = next((changed[i] for i in step["paths"] if i in changed), None)
        if why:
            dirty[sid] = why
    if dirty:
        reach = Reach(stamp, table, dirty, root, changed)
        return reach if stamp.get("incremental") and reach.partial else f"step {reach.describe()}"
    return {**stamp, "command": command}


def _with_steps(stamp: dict, build_dir: str) -> bool:
    """Add the steps' records (their own files' places in the table, recipes, what each said)
    to ``stamp``, from the file written with it; False when that is missing, damaged or another
    build's. Kept apart, a fast path with nothing changed never parses them (2 of 6 MB at
    10,000 steps)."""
    import json

    try:
        with open(steps_path(build_dir), "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or doc.get("part") != stamp.get("part") or doc.get("format") != FORMAT:
        return False
    stamp["steps"], stamp["recipes"] = doc["steps"], doc["recipes"]
    return True


def _append_stats(stamp: dict) -> None:
    """The line a normal no-op appends to cache/stats.jsonl (best effort, as there)."""
    import json

    try:
        line = json.dumps({"time": time.time(), **stamp["stats"]}, separators=(",", ":")) + "\n"
        with open(os.path.join(stamp["cache_dir"], "stats.jsonl"), "a", encoding="utf-8") as f:
            f.write(line)
    except (OSError, TypeError, ValueError, KeyError):
        pass
