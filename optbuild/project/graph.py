"""The step graph across all recipes: order, target selection, cycles, DOT / Mermaid.

The hot path (every build) uses the standard library's graphlib: importing networkx costs
~0.2 s, most of a no-op build's budget. networkx is imported where its algorithms pay
for themselves: naming every cycle of a broken project, and ``to_networkx()`` for users.
"""

from __future__ import annotations

import difflib
import graphlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from optbuild.common.errors import OptbuildError, Problem, ProjectError
from optbuild.project import matrix
from optbuild.project.recipe import StepSpec

if TYPE_CHECKING:
    import networkx


@dataclass(frozen=True)
class Target:
    """A build target as written (``text``): the steps it names, in the recipes' order, without
    their ancestors; ``recipe`` when it names a whole recipe."""

    text: str
    steps: tuple[str, ...]
    recipe: bool = False


class StepGraph:
    def __init__(self, steps: dict[str, StepSpec]):
        self.steps = steps
        self.deps: dict[str, list[str]] = {
            sid: sorted(set(spec.deps.values())) for sid, spec in steps.items()
        }
        self.dependents: dict[str, list[str]] = {sid: [] for sid in steps}
        for sid, deps in self.deps.items():
            for dep in deps:
                self.dependents[dep].append(sid)
        self.order = self._topological_order()

    def _topological_order(self) -> list[str]:
        rank = {sid: i for i, sid in enumerate(self.steps)}
        sorter = graphlib.TopologicalSorter(self.deps)
        try:
            sorter.prepare()
        except graphlib.CycleError:
            raise ProjectError(self._cycle_problems()) from None
        order: list[str] = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready(), key=rank.__getitem__)
            order.extend(ready)
            sorter.done(*ready)
        return order

    def _cycle_problems(self) -> list[Problem]:
        import networkx as nx

        problems = []
        for cycle in sorted(nx.simple_cycles(self.to_networkx()), key=len):
            first = self.steps[cycle[0]]
            # networkx walks dependency -> dependent; show the data flow direction.
            path = " -> ".join([*cycle, cycle[0]])
            problems.append(first.problem(f"dependency cycle: {path}"))
        return problems

    def step(self, target: str) -> str:
        """``target`` as one step id: a target (``target``) naming one step, or a step name
        one recipe has; else an error that suggests the closest step and lists the steps it
        may have meant."""
        try:
            named: Target | None = self.target(target)
        except ProjectError:
            named = None
        if named is not None and not named.recipe and len(named.steps) == 1:
            return named.steps[0]
        matches = [sid for sid in self.steps if sid.endswith(":" + target)]
        if len(matches) == 1:
            return matches[0]
        names: dict[str, list[str]] = {}  # recipe -> its step names, in recipe order
        for spec in self.steps.values():
            names.setdefault(spec.recipe, []).append(spec.name)
        if target in names:
            raise OptbuildError(f"{target} is a recipe: name one of its steps: {', '.join(names[target])}")
        if named is not None:  # a matrix step
            raise OptbuildError(f"{target} is a matrix step: name one of its instances: {', '.join(named.steps)}")
        if matches:
            raise OptbuildError(f"{target!r} is a step of several recipes: use one of {', '.join(matches)}")
        recipe, colon, _ = target.partition(":")
        candidates = list(self.steps) if colon else list(dict.fromkeys(spec.name for spec in self.steps.values()))
        hint = difflib.get_close_matches(target, candidates, n=1)
        listed = [recipe] if recipe in names else list(names)
        raise OptbuildError("\n".join([f"unknown step {target!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""),
                                       *(f"steps of {r}: {', '.join(names[r])}" for r in listed)]))

    def target(self, text: str) -> Target:
        """``text`` as a build target: the one grammar of the commands' TARGET arguments
        ("recipe", "recipe:step", or a matrix step's "recipe:step" naming all its instances);
        else ProjectError suggesting the closest target."""
        recipes = {spec.recipe for spec in self.steps.values()}
        if text in self.steps:
            named = [text]
        elif text in recipes:
            named = [s for s, spec in self.steps.items() if spec.recipe == text]
        elif not (named := [s for s in self.steps if "[" in s and matrix.base_name(s) == text]):
            hint = difflib.get_close_matches(text, [*recipes, *self.steps], n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ProjectError([Problem(f"unknown target {text!r}{suggestion}")])
        return Target(text, tuple(named), recipe=text in recipes)

    def select(self, targets: list[str]) -> list[str]:
        """Steps needed for ``targets`` (see ``target``), in build order."""
        if not targets:
            return list(self.order)
        wanted = {sid for text in targets for sid in self.target(text).steps}
        stack = list(wanted)
        while stack:
            for dep in self.deps[stack.pop()]:
                if dep not in wanted:
                    wanted.add(dep)
                    stack.append(dep)
        return [sid for sid in self.order if sid in wanted]

    def wanted(self, targets: list[str], selected: list[str]) -> set[str]:
        """The steps whose outputs a build of ``targets`` (``selected``: ``select(targets)``)
        is for: those a target names as ``recipe:step``, and the ends of the selection (the
        steps no selected step reads). Steps that build elsewhere (Dask) come back to this
        host for these only, unless the build asks for all."""
        named: set[str] = set()
        for text in targets:
            target = self.target(text)
            if not target.recipe:
                named.update(target.steps)
        chosen = set(selected)
        return named | {sid for sid in selected if not any(d in chosen for d in self.dependents[sid])}

    def descendants(self, step_id: str) -> set[str]:
        seen: set[str] = set()
        stack = [step_id]
        while stack:
            for child in self.dependents[stack.pop()]:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        return seen

    def to_networkx(self) -> networkx.DiGraph:
        """A networkx DiGraph (edges dependency -> dependent) with step attributes."""
        import networkx as nx

        graph = nx.DiGraph()
        for sid, spec in self.steps.items():
            graph.add_node(sid, recipe=spec.recipe, kind=spec.kind)
        for sid, deps in self.deps.items():
            graph.add_edges_from((dep, sid) for dep in deps)
        return graph

    def dot(self, selected: list[str] | None = None) -> str:
        nodes = selected or self.order
        lines = ["digraph optbuild {", "  rankdir=LR;", "  node [shape=box, style=rounded];"]
        by_recipe: dict[str, list[str]] = {}
        for sid in nodes:
            by_recipe.setdefault(self.steps[sid].recipe, []).append(sid)
        for i, (recipe, sids) in enumerate(by_recipe.items()):
            lines.append(f'  subgraph cluster_{i} {{ label="{recipe}";')
            for sid in sids:
                spec = self.steps[sid]
                lines.append(f'    "{sid}" [label="{spec.name}\\n({spec.kind})"];')
            lines.append("  }")
        for sid in nodes:
            lines.extend(f'  "{dep}" -> "{sid}";' for dep in self.deps[sid] if dep in nodes)
        lines.append("}")
        return "\n".join(lines) + "\n"

    def mermaid(self, selected: list[str] | None = None) -> str:
        nodes = selected or self.order
        ident = {sid: f"n{i}" for i, sid in enumerate(nodes)}
        lines = ["flowchart LR"]
        for sid in nodes:
            spec = self.steps[sid]
            lines.append(f'  {ident[sid]}["{sid}<br/>{spec.kind}"]')
        for sid in nodes:
            lines.extend(f"  {ident[dep]} --> {ident[sid]}" for dep in self.deps[sid] if dep in nodes)
        return "\n".join(lines) + "\n"
