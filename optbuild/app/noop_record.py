"""Recording the no-op stamp after an ok ``optbuild build`` (what ``optbuild.cli.noop``
reads back on the next build or plan): the signatures of everything the answer was read
from, and the answer itself. Imported only by a build that ran, never on the fast path."""

from __future__ import annotations

import os
import sys
import time

from optbuild.app.deploy import plan_warnings
from optbuild.common import signatures
from optbuild.common.noopstamp import (
    CACHED,
    FORMAT,
    HASH_MAX,
    NOT_RECORDED,
    build_path,
    content_digest,
    debug,
    env_digests,
    host_facts,
    invocation,
    python_identity,
    salt,
    salt_id,
    shown,
    split_build_args,
    stamp_path,
)
from optbuild.common.signatures import changed_within, module_files, signature
from optbuild.store.layout import blob_name, entry_name


def record(ws, result) -> None:
    """Write the stamp after an ok ``build`` (best effort: a stamp never fails a build)."""
    try:
        why_not = _record(ws, result)
    except Exception as exc:  # a stamp not written only costs speed
        why_not = f"{type(exc).__name__}: {exc}"
    if why_not:
        debug(f"not recorded: {why_not}")


def _glob_folders(root: str, pattern: str) -> list[str]:
    """The folders a recipe pattern's glob reads: its literal leading folder, and with a
    wildcard in a folder part, every folder beneath it."""
    parts = pattern.replace("\\", "/").split("/")
    literal = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        literal.append(part)
    base = os.path.join(root, *literal)
    folders = [base]
    if len(literal) < len(parts) - 1:
        for dirpath, dirnames, _files in os.walk(base):
            folders.extend(os.path.join(dirpath, d) for d in dirnames)
    return folders


def _left_to_remote(result) -> str | None:
    """The first selected step that did not end in the local cache, whose next lookup will
    ask the remote; None when every one did (``CACHED``)."""
    return next((sid for sid, outcome in sorted(result.outcomes.items()) if str(outcome.status) not in CACHED),
                None)


def _untouched(remote) -> dict | None:
    """The remote statistics of a no-op, which never asks the remote (None: none configured)."""
    if remote is None:
        return None
    from optbuild.store.remote import RemoteStats

    return {"url": remote.display_url, **RemoteStats().__dict__}


def _cache_line(local: dict, remote) -> str | None:
    """The statistics line a build prints after its summary when a remote is configured."""
    if remote is None:
        return None
    from optbuild.builder.runstats import describe_stats

    return describe_stats({"local": local, "remote": _untouched(remote)})


def _record(ws, result) -> str | None:
    import json

    from optbuild.builder.status import Status

    argv, started = invocation()
    if argv is None or started is None or (split := split_build_args(argv)) is None:
        return "not run as `optbuild build`"
    build_args = split[1]
    if flag := next((a for a in build_args for f in NOT_RECORDED if a == f or a.startswith(f + "=")), None):
        return f"{flag} is never taken by the fast path"
    if ws.remote is not None and (missed := _left_to_remote(result)):
        return f"a remote cache is configured and {missed} is not in the local cache: the next build asks the remote"
    try:
        key = salt(create=True)
    except (OSError, ValueError) as exc:
        return f"no private salt for the environment's digests: {exc}"
    project, store = ws.project, ws.store
    root = os.path.abspath(project.root)
    build_dir = os.path.abspath(project.build_dir)
    cache_root = os.path.abspath(store.root)
    product_roots = (build_dir + os.sep, os.path.abspath(project.cache_dir) + os.sep)

    inputs: set[str] = {os.path.abspath(project.config_file), sys.executable}
    inputs.update(os.path.abspath(p) for p in project.recipes.values())
    inputs.update(os.path.abspath(spec.doc.path) for spec in project.steps.values())  # templates
    for pattern in project.config.project.recipes:
        inputs.update(_glob_folders(root, pattern))
    for target in project.config.kinds.values():
        inputs.add(os.path.abspath(os.path.join(root, target.rpartition(":")[0])))
    inputs.update(build_path())
    products: set[str] = {os.path.abspath(project.lock_file)}
    for path in getattr(ws.hasher, "consulted", ()):
        (products if path.startswith(product_roots) else inputs).add(path)
    inputs.update({os.path.dirname(p) for p in inputs if os.path.isfile(p)})
    inputs.update(module_files())

    lines: list[str] = []
    counts: dict[str, int] = {}
    local = {"hits": 0, "misses": 0, "unavailable": 0}
    for event in result.reporter.events:
        if event.get("event") != "step" or event.get("status") == Status.RUNNING:
            continue
        sid, status = event["step"], str(event["status"])
        outcome = result.outcomes.get(sid)
        line: str | None
        if status in CACHED:
            status = "cached"
            line = f"  {'cached':<8} {sid}"
        else:
            from optbuild.builder.report import event_line

            line = event_line(event)
        if line is not None:
            lines.append(line)
        counts[status] = counts.get(status, 0) + 1
        if outcome is None:
            continue
        if outcome.key:
            local["hits" if status == "cached" else "unavailable" if status == "unavailable" else "misses"] += 1
            products.add(f"{cache_root}/{entry_name(outcome.key)}")  # paths as text: 10,000 steps add up
        entry = outcome.entry
        if entry is not None and status == "cached":
            folder = f"{build_dir}/{project.step_folder(sid)}"
            products.add(folder)
            for name in entry.outputs:
                products.add(os.path.join(folder, name))
                parent = os.path.dirname(name)
                while parent:
                    products.add(os.path.join(folder, parent))
                    parent = os.path.dirname(parent)
            products.update(f"{cache_root}/{blob_name(d)}" for d in entry.blob_digests())  # digests checked in the entry
    from optbuild.builder.report import summary_lines

    lines.extend(summary_lines(result.reporter.events))  # the reasons, grouped, as the build showed them

    # Inputs: older than the build's start (less the margin), or the stamp is unusable.
    # Products: older than now (less the margin), or content-checked, or unusable.
    sigs: dict[str, list[int] | str] = {}
    racy = []
    for path in sorted(inputs):
        sig = sigs[path] = signature(path)
        if changed_within(sig, started):
            racy.append(shown(path, root))
    unusable = None
    if racy:
        more = f" and {len(racy) - 3} more" if len(racy) > 3 else ""
        unusable = f"{', '.join(racy[:3])}{more} changed within {signatures.RACY_NS / 1e9:g} s of the build's start"
    recorded_ns = time.time_ns()
    digests: dict[str, str] = {}
    for path in sorted(products):
        sig = sigs[path] = signature(path)
        if unusable is not None or not changed_within(sig, recorded_ns):
            continue
        if isinstance(sig, list) and os.path.isfile(path) and sig[2] <= HASH_MAX:
            digests[path] = content_digest(path)
            if signature(path) == sig:
                continue
        unusable = f"{shown(path, root)} was written within {signatures.RACY_NS / 1e9:g} s of recording"
    stamp = {
        "format": FORMAT, "root": root, "build_dir": build_dir, "argv": build_args,
        "salt": salt_id(key), "env": env_digests(key), "python": python_identity(), "host": host_facts(), "unusable": unusable,
        "sigs": sigs, "digests": digests, "lines": lines, "counts": counts,
        "cache_dir": os.path.abspath(project.cache_dir),
        "stats": {"command": "build", "ok": True, "counts": counts, "local": local,
                  "remote": _untouched(ws.remote), "fast_path": True},
        "cache_line": _cache_line(local, ws.remote), "plan_warnings": plan_warnings(ws.project, list(result.outcomes)),
    }
    from pathlib import Path

    from optbuild.common.atomic import write_atomic

    path = stamp_path(build_dir)
    write_atomic(Path(path), json.dumps(stamp, separators=(",", ":")).encode())
    debug(f"recorded {len(sigs)} signatures" + (f"; unusable: {unusable}" if unusable else ""))
    return None
