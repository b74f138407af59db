"""How the executor orders builds: steps run side by side up to -j, except an exclusive
step (a benchmark), which builds with nothing else building beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from plugins.projects import CONFIG, FIXTURES, ProjectDir

KINDS = CONFIG.replace("[kinds]\n", '[kinds]\nprobe = "probekinds.py:Probe"\n'
                                   'exclusive = "probekinds.py:ExclusiveProbe"\n')


def project(root: Path, steps: str) -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    shutil.copy(FIXTURES / "probekinds.py", root / "probekinds.py")
    proj.write("optbuild.toml", KINDS)
    proj.write("recipes/p.toml", steps)
    return proj


def step(name: str, kind: str = "probe", sleep: float = 0.6) -> str:
    return f'[steps.{name}]\nkind = "{kind}"\ntag = "{name}"\nsleep = {sleep}\n\n'


def window(proj: ProjectDir, name: str) -> tuple[float, float]:
    seen = json.loads(proj.read(f"build/p/{name}/seen.json"))
    return seen["started"], seen["ended"]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_independent_steps_build_side_by_side_up_to_jobs(tmp_path):
    proj = project(tmp_path / "proj", step("a") + step("b"))
    assert proj.build(jobs=2).ok
    assert overlap(window(proj, "a"), window(proj, "b"))


def test_an_exclusive_step_builds_with_nothing_beside_it(tmp_path):
    proj = project(tmp_path / "proj", step("a") + step("measure", "exclusive") + step("b") + step("c"))
    assert proj.build(jobs=3).ok
    measured = window(proj, "measure")
    others = [window(proj, name) for name in ("a", "b", "c")]
    assert not any(overlap(measured, other) for other in others)
    assert overlap(others[1], others[2])  # the others still share the jobs
