"""What a change reaches, read from the no-op stamp: when only some steps' own files changed
since the last ok build (an input file, an output, a cache entry, their recipe), a build loads
and decides the recipes those steps and their downstream steps are in, with the recipes they
read from, and reports the other steps as that build recorded them.

The stamp (``optbuild.common.noopstamp``) holds, per step, the signatures of the files that
step alone was decided from (its recipe file, key files and the folders deciding them, its cache entry,
blobs, step folder and outputs), the steps it reads, its recipe and what it said; and per
recipe, the recipes its steps read from. Everything else the answer was read from (the
configuration, the templates, the folders of recipes, the modules, the interpreter, the
environment, the host) is checked as the fast path checks it: any change there means a
full build. So does a recipe edited to read a recipe the record does not say it reads (its
load fails, and the whole project loads, reporting what is wrong in its own words), and a
build of targets that an edited recipe may select differently.

Standard library only: the fast path imports this.
"""

from __future__ import annotations

from collections.abc import Iterable

from optbuild.common.sigtable import Sig, SigTable

REPLAYED = ("cached", "unavailable", "skipped")  # what an ok build's step can be in the no-op after it


class Reach:
    """The steps whose own files changed (``dirty``, with why; ``changed``: those files' places
    in the stamp's table), in the stamp they were read from: the recipes to load, and the
    steps to replay. (A plain class: dataclasses imports inspect, 5 ms of every fast path.)"""

    def __init__(self, stamp: dict, table: SigTable, dirty: dict[str, str], root: str, changed: Iterable[int] = ()):
        self.stamp = stamp
        self.table = table  # the stamp's signatures
        self.dirty = dirty
        self.root = root
        self._changed = changed  # the places in the stamp's table of the steps' own files that changed
        steps: dict[str, dict] = stamp["steps"]
        dependents: dict[str, list[str]] = {}
        for sid, step in steps.items():
            for dep in step["deps"]:
                dependents.setdefault(dep, []).append(sid)
        reached, todo = set(dirty), list(dirty)
        while todo:
            for child in dependents.get(todo.pop(), ()):
                if child not in reached:
                    reached.add(child)
                    todo.append(child)
        upstream: dict[str, list[str]] = stamp["recipes"]  # every recipe, and those it reads
        recipes = {steps[sid]["recipe"] for sid in reached}
        todo = list(recipes)
        while todo:
            for recipe in upstream.get(todo.pop(), ()):
                if recipe not in recipes:
                    recipes.add(recipe)
                    todo.append(recipe)
        self.recipes = recipes  # what the change reaches, and what those read
        self.replayed = [sid for sid, step in steps.items() if step["recipe"] not in recipes]  # in recorded order
        if any(steps[sid]["status"] not in REPLAYED for sid in self.replayed):
            raise ValueError("a step of the record has a status no ok build leaves")

    @property
    def partial(self) -> bool:
        """Whether some recipe of the project is left out (else the build is a full one)."""
        return len(self.recipes) < len(self.stamp["recipes"])

    def events(self) -> list[dict]:
        """The replayed steps' events as the recorded build reported them, as a no-op (a
        step that build built or restored is cached)."""
        found: list[dict] = []
        for sid in self.replayed:
            said = self.stamp["steps"][sid]
            event = {"event": "step", "step": sid, "status": said["status"], "key": said["key"],
                     "reasons": list(said.get("reasons") or [])}
            if said.get("error"):
                event["error"] = said["error"]
            found.append(event)
            found.extend({"event": "warning", "message": m, "step": sid} for m in said.get("warnings") or [])
        return found

    def published(self) -> list[tuple[str, str]]:
        """(step, model name) of the replayed deploy steps, as recorded."""
        steps = self.stamp["steps"]
        return [(sid, steps[sid]["model"]) for sid in self.replayed if "model" in steps[sid]]

    def decided(self, loaded: list[str], recipe_files: dict[str, str], targets: list[str]) -> list[str] | None:
        """The steps a build decides, of ``loaded`` (those of the reached recipes, as loaded
        now; ``recipe_files``: every recipe's file): the ones the record has, unless one of
        those recipes may have been edited (its file changed, or a step of it was not vouched
        for); then every loaded step for a build of the whole project, and None (load the
        whole project) for a build of ``targets``, which may select other steps now."""
        steps = self.stamp["steps"]
        recorded = [sid for sid, step in steps.items() if step["recipe"] in self.recipes]
        edited = {step["recipe"] for step in steps.values() if "unusable" in step}
        changed = {self.table.paths[i] for i in self._changed}
        edited.update(name for name in self.recipes if recipe_files.get(name) in changed)
        if not edited:
            present = set(loaded)
            return recorded if all(sid in present for sid in recorded) else None
        return None if targets else loaded

    def global_paths(self) -> list[str]:
        """The paths whose signatures vouch for the whole answer (the first of the table)."""
        return self.table.paths[:self.stamp["shared"]]

    def checked(self) -> dict[str, str]:
        """The content digests of the whole answer's paths, each found unchanged by content
        when this stamp was read."""
        return {path: self.stamp["digests"][path] for path in self.global_paths() if path in self.stamp["digests"]}

    def step_files(self, sid: str) -> dict[str, Sig]:
        """The signatures of what ``sid`` alone was decided from, as recorded."""
        return self.table.sigs(self.stamp["steps"][sid]["paths"])

    def describe(self) -> str:
        """The first step decided again and why, for OPTBUILD_DEBUG_FASTPATH."""
        first = next(iter(self.dirty))
        more = f" and {len(self.dirty) - 1} more" if len(self.dirty) > 1 else ""
        return f"{first}{more}: {self.dirty[first]}"
