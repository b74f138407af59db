"""Recording the no-op stamp after an ok ``optbuild build`` (what ``optbuild.cli.noop``
reads back on the next build or plan): the signatures of everything the answer was read
from, and the answer itself. Imported only by a build that ran, never on the fast path."""

from __future__ import annotations

import os
import sys

from optbuild.app.deploy import deploy_models, plan_warnings
from optbuild.app.noop_sign import Signer
from optbuild.builder.memo import folder_paths
from optbuild.common.noopreach import Reach
from optbuild.common.noopstamp import (
    CACHED,
    FORMAT,
    NOT_RECORDED,
    build_path,
    debug,
    env_digests,
    host_facts,
    invocation,
    python_identity,
    salt,
    salt_id,
    split_build_args,
    stamp_path,
    steps_path,
)
from optbuild.common.signatures import module_files
from optbuild.common.sigtable import SigTable, grouped, names_signature
from optbuild.store.layout import ENTRIES, blob_name, entry_name


def record(ws, result, reach: Reach | None = None) -> None:
    """Write the stamp after an ok ``build`` (best effort: a stamp never fails a build);
    ``reach``: what this build loaded, when it loaded only what a change reached (the other
    steps keep their records)."""
    try:
        why_not = _record(ws, result, reach)
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


def _record(ws, result, reach: Reach | None) -> str | None:
    import json

    argv, started = invocation()
    if argv is None or started is None or (split := split_build_args(argv)) is None:
        return "not run as `optbuild build`"
    build_args = split[1]
    if flag := next((a for a in build_args if _not_recorded(a)), None):
        return f"{flag} is never taken by the fast path"
    if ws.remote is not None and (missed := _left_to_remote(result)):
        return f"a remote cache is configured and {missed} is not in the local cache: the next build asks the remote"
    try:
        key = salt(create=True)
    except (OSError, ValueError) as exc:
        return f"no private salt for the environment's digests: {exc}"
    project = ws.project
    root = os.path.abspath(project.root)
    build_dir = os.path.abspath(project.build_dir)
    steps, attributed = _steps(ws, result, reach)
    inputs, products = _global_paths(ws, attributed)
    lock = os.path.abspath(project.lock_file)
    if reach is not None:  # checked unchanged by this build's start, with the recipes not loaded
        for path in reach.global_paths():
            (products if path == lock or path.startswith(_product_roots(ws)) else inputs).add(path)

    signer = Signer(ws, started, root, reach.checked() if reach is not None else {})  # reads the clocks first
    sigs, digests, unusable = signer.sign(inputs, products, folders=_recipe_folders(project))
    shared = len(sigs)  # the signatures of the whole answer come first; then the steps' own
    _sign_steps(steps, signer, sigs, digests, reach, result.outcomes)
    entries = os.path.join(os.path.abspath(ws.store.root), ENTRIES) + os.sep
    sigs, groups = grouped(sigs, steps, first=shared, under=entries, clock_ns=signer.clock_of(entries))
    lines, counts, local = _answer(result)
    racy = sum(1 for step in steps.values() if "unusable" in step)
    part = os.urandom(8).hex()  # names the steps' file this stamp goes with
    stamp = {
        "format": FORMAT, "root": root, "build_dir": build_dir, "argv": build_args,
        "salt": salt_id(key), "env": env_digests(key), "python": python_identity(), "host": host_facts(),
        "unusable": unusable, "table": SigTable.of(sigs, groups).to_json(), "shared": shared, "digests": digests, "part": part, "racy_steps": racy,
        "incremental": _incremental(ws, build_args),
        "lines": lines, "counts": counts, "cache_dir": os.path.abspath(project.cache_dir),
        "stats": {"command": "build", "ok": True, "counts": counts, "local": local,
                  "remote": _untouched(ws.remote), "fast_path": True},
        "cache_line": _cache_line(local, ws.remote),
        "plan_warnings": plan_warnings(project, list(result.outcomes), reach.published() if reach is not None else ()),
    }
    from pathlib import Path

    from optbuild.common.atomic import write_atomic

    steps_doc = {"format": FORMAT, "part": part, "steps": steps, "recipes": _recipe_reads(project, reach)}
    write_atomic(Path(steps_path(build_dir)), json.dumps(steps_doc, separators=(",", ":")).encode())
    write_atomic(Path(stamp_path(build_dir)), json.dumps(stamp, separators=(",", ":")).encode())
    debug(f"recorded {len(sigs)} signatures ({sum(g.end - g.start for g in groups)} vouched for by "
          f"{len(groups)} folders of entries) and {len(steps)} steps" + (f"; unusable: {unusable}" if unusable else "")
          + (f"; {racy} steps not vouched for" if racy else ""))
    return None


def _not_recorded(arg: str) -> str | None:
    """The option of ``NOT_RECORDED`` that ``arg`` is, as written or abbreviated as argparse
    takes it (``--rem URL`` is ``--remote URL``: its URL must not be written in a stamp)."""
    name = arg.partition("=")[0]
    if not name.startswith("--") or len(name) < 3:
        return None
    return next((flag for flag in NOT_RECORDED if flag.startswith(name)), None)


def _sign_steps(steps: dict[str, dict], signer: Signer, sigs: dict[str, list[int] | str], digests: dict[str, str],
                reach: Reach | None, decided: dict) -> None:
    """Add each step's own files to the table (``sigs``, ``digests``), the step naming them by
    their place in it (``paths``; a file several steps share is there once), and say which
    steps cannot vouch for theirs (``unusable``). A step this build replayed (not in
    ``decided``) keeps the signatures the stamp had: this build's start checked them."""
    position = {path: i for i, path in enumerate(sigs)}
    for sid, step in steps.items():
        if reach is not None and sid not in decided:
            step_sigs, why = reach.step_files(sid), None
            step_digests = {p: reach.stamp["digests"][p] for p in step_sigs if p in reach.stamp["digests"]}
        else:
            step_sigs, step_digests, why = signer.sign(step.pop("inputs"), step.pop("products"))
            for blob in signer.linked(step_sigs):
                del step_sigs[blob]
        index = []
        for path, sig in step_sigs.items():
            if (i := position.get(path)) is None:
                i = position[path] = len(sigs)
                sigs[path] = sig
            index.append(i)
        digests.update(step_digests)
        step["paths"] = index
        if why is not None:
            step["unusable"] = why


def _recipe_folders(project) -> dict[str, str]:
    """The names signatures of the folders the recipe patterns scan, when the patterns find
    there the recipes the build loaded (the names listed before and after the search): what
    the build read of them, even if they changed just before it. Empty otherwise."""
    from pathlib import Path

    root = os.path.abspath(project.root)
    folders = {folder for pattern in project.config.project.recipes for folder in _glob_folders(root, pattern)}
    before = {folder: names_signature(folder) for folder in folders}
    found = {os.path.abspath(p) for pattern in project.config.project.recipes for p in Path(root).glob(pattern)}
    if found != {os.path.abspath(p) for p in project.recipes.values()}:
        return {}
    return before if all(names_signature(folder) == sig for folder, sig in before.items()) else {}


def _product_roots(ws) -> tuple[str, str]:
    """Where optbuild's own products lie: the build folder and the cache."""
    return (os.path.abspath(ws.project.build_dir) + os.sep, os.path.abspath(ws.project.cache_dir) + os.sep)


def _steps(ws, result, reach: Reach | None) -> tuple[dict[str, dict], set[str]]:
    """Per step, in the order the build reported them: its recipe, the steps it reads, what
    it said (``_said``), and what it was decided from alone (its key files and the folders
    whose names decide them, ``StepSpec.key_folders``; its entry, blobs, step folder and
    outputs). A step the build replayed keeps what it said.
    Also every path given to a step."""
    project, store = ws.project, ws.store
    build_dir = os.path.abspath(project.build_dir)
    cache_root = os.path.abspath(store.root)
    events: dict[str, list[dict]] = {}
    for event in result.reporter.events:
        sid = event.get("step")
        if sid is None or event.get("event") not in ("step", "warning") or event.get("status") == "running":
            continue
        events.setdefault(sid, []).append(event)
    steps: dict[str, dict] = {}
    attributed: set[str] = set()
    published = dict(deploy_models(project, list(result.outcomes)))  # a deploy step's model name
    for sid, said in events.items():
        if reach is not None and sid not in result.outcomes:
            old = reach.stamp["steps"][sid]
            steps[sid] = {k: v for k, v in old.items() if k not in ("paths", "unusable")}
            attributed.update(reach.step_files(sid))  # its recipe file, say, is still its own
            continue
        outcome, spec = result.outcomes[sid], project.steps[sid]
        own = {str(path) for path in (*(spec.key_files or ()), *(spec.key_folders or ()))}  # set together on load
        inputs = own | {os.path.abspath(project.recipes[spec.recipe])}
        products: set[str] = set()
        if outcome.key:
            products.add(f"{cache_root}/{entry_name(outcome.key)}")  # paths as text: 10,000 steps add up
        entry = outcome.entry
        if entry is not None and str(outcome.status) in CACHED:
            products.update(folder_paths(f"{build_dir}/{project.step_folder(sid)}", entry.outputs))
            products.update(f"{cache_root}/{blob_name(d)}" for d in entry.blob_digests())  # digests checked in the entry
        attributed |= inputs | products
        steps[sid] = {"recipe": spec.recipe, "deps": sorted(spec.deps.values()), **_said(said),
                      **({"model": published[sid]} if sid in published else {}),
                      "inputs": inputs, "products": products}
    return steps, attributed


def _said(events: list[dict]) -> dict:
    """What a step's events say, as the no-op after it reports them (``Reach.events``): its
    status (a step built or restored then is cached now), key, reasons and error, and the
    warnings it gave."""
    said: dict = {}
    for event in events:
        if event["event"] == "warning":
            said.setdefault("warnings", []).append(event["message"])
            continue
        status = str(event["status"])
        said.update(status="cached" if status in CACHED else status, key=event.get("key"))
        if status not in CACHED and event.get("reasons"):
            said["reasons"] = list(event["reasons"])
        if status not in CACHED and event.get("error"):
            said["error"] = event["error"]
    return said


def _global_paths(ws, attributed: set[str]) -> tuple[set[str], set[str]]:
    """What the whole answer was read from, beyond the steps' own files: the inputs
    (optbuild.toml, the recipes and templates, the folders the recipe patterns scan, the
    project's kind files, the interpreter and sys.path, the modules loaded, any other file
    the build hashed, and the folders holding them) and the products (the lock file, and
    whatever the build hashed in the build folder or the cache that no step owns)."""
    project = ws.project
    root = os.path.abspath(project.root)
    inputs: set[str] = {os.path.abspath(project.config_file), sys.executable}
    recipes = {os.path.abspath(p) for p in project.recipes.values()}
    inputs.update(recipes - attributed)  # a recipe with a step recorded is that step's own (``_steps``)
    inputs.update(os.path.dirname(p) for p in recipes)
    inputs.update({os.path.abspath(spec.doc.path) for spec in project.steps.values()} - recipes)  # templates
    for pattern in project.config.project.recipes:
        inputs.update(_glob_folders(root, pattern))
    for target in project.config.kinds.values():
        inputs.add(os.path.abspath(os.path.join(root, target.rpartition(":")[0])))
    inputs.update(build_path())
    products: set[str] = {os.path.abspath(project.lock_file)}
    product_roots = _product_roots(ws)
    for path in getattr(ws.hasher, "consulted", ()):
        if path not in attributed:
            (products if path.startswith(product_roots) else inputs).add(path)
    inputs.update({os.path.dirname(p) for p in inputs if os.path.isfile(p)})
    inputs.update(module_files())
    return inputs - products, products


def _answer(result) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """What the build said, as the fast path prints it (its step lines and the reasons it
    grouped), its counts, and its local cache statistics."""
    from optbuild.builder.report import event_line, summary_lines

    lines: list[str] = []
    counts: dict[str, int] = {}
    local = {"hits": 0, "misses": 0, "unavailable": 0}
    for event in result.reporter.events:
        if event.get("event") != "step" or event.get("status") == "running":
            continue
        sid, status = event["step"], str(event["status"])
        if status in CACHED:
            status = "cached"
            line: str | None = f"  {'cached':<8} {sid}"
        else:
            line = event_line(event)
        if line is not None:
            lines.append(line)
        counts[status] = counts.get(status, 0) + 1
        if event.get("key"):
            local["hits" if status == "cached" else "unavailable" if status == "unavailable" else "misses"] += 1
    lines.extend(summary_lines(result.reporter.events))  # the reasons, grouped, as the build showed them
    return lines, counts, local


def _recipe_reads(project, reach: Reach | None) -> dict[str, list[str]]:
    """Per recipe of the project, the other recipes its steps read from (a build loads those
    with it); a build that loaded some recipes keeps what the stamp said of the others."""
    reads: dict[str, set[str]] = {name: set() for name in project.recipes}
    for spec in project.steps.values():
        reads[spec.recipe].update(
            project.steps[dep].recipe for dep in spec.deps.values() if project.steps[dep].recipe != spec.recipe)
    if reach is not None:
        reads = {**{n: set(r) for n, r in reach.stamp["recipes"].items() if n not in reach.recipes}, **{
            n: r for n, r in reads.items() if n in reach.recipes}}
    return {name: sorted(names) for name, names in reads.items()}


def _incremental(ws, build_args: list[str]) -> bool:
    """Whether a later build may load only what a change reaches: a build on this host (the
    Dask builder's downloads depend on the whole selection)."""
    build = ws.project.config.build
    local = build.executor == "local" or (build.executor == "auto" and not build.scheduler)
    return local and not any(a.startswith(("--executor", "--scheduler")) for a in build_args)
