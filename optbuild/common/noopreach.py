"""What a change reaches, read from the no-op stamp: when only some steps' own files changed
since the last ok build (an input file, an output, a cache entry), a build loads and decides
the recipes those steps and their downstream steps are in, with the recipes they read from,
and reports the other steps as that build recorded them.

The stamp (``optbuild.common.noopstamp``) holds, per step, the signatures of the files that
step alone was decided from (its key files and their folders, its cache entry, blobs, step
folder and outputs), the steps it reads, its recipe and the events it was reported with; and
per recipe, the recipes its steps read from. Everything else the answer was read from (the
configuration, every recipe, the modules, the interpreter, the environment, the host) is
checked as the fast path checks it: any change there means a full build.

Standard library only: the fast path imports this.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reach:
    """The steps whose own files changed (``dirty``, with why), in the stamp they were read from."""

    stamp: dict
    dirty: dict[str, str]  # step -> why it is decided again
    root: str
    recipes: set[str] = field(init=False)  # the recipes to load: what the change reaches, and what those read
    replayed: list[str] = field(init=False)  # the steps reported as recorded, in recorded order

    def __post_init__(self) -> None:
        steps: dict[str, dict] = self.stamp["steps"]
        dependents: dict[str, list[str]] = {}
        for sid, step in steps.items():
            for dep in step["deps"]:
                dependents.setdefault(dep, []).append(sid)
        reached, todo = set(self.dirty), list(self.dirty)
        while todo:
            for child in dependents.get(todo.pop(), ()):
                if child not in reached:
                    reached.add(child)
                    todo.append(child)
        upstream: dict[str, list[str]] = self.stamp["recipes"]  # every recipe, and those it reads
        recipes = {steps[sid]["recipe"] for sid in reached}
        todo = list(recipes)
        while todo:
            for recipe in upstream.get(todo.pop(), ()):
                if recipe not in recipes:
                    recipes.add(recipe)
                    todo.append(recipe)
        self.recipes = recipes
        self.replayed = [sid for sid, step in steps.items() if step["recipe"] not in recipes]

    @property
    def partial(self) -> bool:
        """Whether some recipe of the project is left out (else the build is a full one)."""
        return len(self.recipes) < len(self.stamp["recipes"])

    def events(self, *, plan: bool) -> list[dict]:
        """The replayed steps' events as the recorded build reported them (to a plan, a step
        that build built or restored is cached)."""
        found = []
        for sid in self.replayed:
            for event in self.stamp["steps"][sid]["events"]:
                found.append({**event, "status": "cached"} if plan and event.get("status") in ("built", "restored")
                             else event)
        return found

    def describe(self) -> str:
        first = next(iter(self.dirty))
        more = f" and {len(self.dirty) - 1} more" if len(self.dirty) > 1 else ""
        return f"{first}{more}: {self.dirty[first]}"
