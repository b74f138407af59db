"""Project fixtures (a pytest plugin): throw-away optbuild projects on the real file system."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from optbuild import api
from optbuild.builder.report import Reporter
from optbuild.common.errors import ProjectError
from optbuild.project.recipe import load_project

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]

CONFIG = """\
[project]
recipes = ["recipes/*.toml"]

[kinds]
text = "kinds.py:Text"
join = "kinds.py:Join"
crash = "kinds.py:Crash"

[build]
jobs = 2
"""

PIPELINE = """\
# a three-step chain and a side branch
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.mid]
kind = "join"
input = "src"
suffix = "-mid"

[steps.out]
kind = "join"
input = "mid"
suffix = "-out"

[steps.side]
kind = "join"
input = "src"
suffix = "-side"
"""


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def steps(self, status: str) -> list[str]:
        return sorted(e["step"] for e in self.events if e.get("event") == "step" and e["status"] == status)


class ProjectDir:
    """A project on disk, driven through the API (in-process) or the CLI (subprocess)."""

    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def with_test_kinds(cls, root: Path) -> ProjectDir:
        """A new project folder with the fast test kinds (kinds.py) and data/input.txt;
        its optbuild.toml and recipes are the caller's."""
        proj = cls(root)
        proj.root.mkdir()
        shutil.copy(FIXTURES / "kinds.py", proj.root / "kinds.py")
        proj.write("data/input.txt", "hello")
        return proj

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def read(self, relative: str) -> str:
        return (self.root / relative).read_text()

    def build(self, targets: list[str] | None = None, **options) -> api.BuildResult:
        ws = api.open_workspace(self.root)
        try:
            return api.build(ws, targets, reporter=Reporter(), **options)
        finally:
            ws.close()

    def problems(self) -> list[str]:
        """What loading the project reports, one line per problem (it must not load)."""
        with pytest.raises(ProjectError) as info:
            load_project(self.root)
        return [str(p) for p in info.value.problems]

    def cli(self, *args: str, timeout: float = 300) -> CliRun:
        proc = subprocess.run(
            [sys.executable, "-m", "optbuild.cli", *args], cwd=self.root, capture_output=True,
            text=True, timeout=timeout, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=False,
        )
        return CliRun(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "optbuild.cli", *args], cwd=self.root, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
        )


@pytest.fixture
def project(tmp_path: Path) -> ProjectDir:
    """A project with the fast test kinds and one recipe `chain`: src -> mid -> out, src -> side."""
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("optbuild.toml", CONFIG)
    proj.write("recipes/chain.toml", PIPELINE)
    return proj


# A step kind no host can build ("needs" a unicorn), for tests of unavailable steps.
UNICORN = '''
from optbuild.steps.base import Step, StepParams, StepRef


class NeedsParams(StepParams):
    input: StepRef | None = None


class Needs(Step):
    """A step no host has what it needs for."""

    Params = NeedsParams
    primary_output = "data.txt"

    def unavailable(self, host):
        return "needs a unicorn (none here)"

    def run(self, ctx):
        (ctx.out_dir / "data.txt").write_text("horn")
'''

KINDS = '[kinds]\ntext = "kinds.py:Text"\njoin = "kinds.py:Join"\nneeds = "needs.py:Needs"\n'
