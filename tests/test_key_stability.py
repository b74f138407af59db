"""Cache keys outlive refactors of the code that computes them. The keys below were recorded
with the package's old flat layout (before 47c8366) and are what this code computes: the
project's kinds name no tool version and no host field, so nothing of this machine enters
them. A change here means every user's cache is rebuilt on upgrade: it must be deliberate
(raise ``keys.KEY_FORMAT``, and record the new keys here)."""

from __future__ import annotations

from plugins.projects import ProjectDir

KINDS = '''"""Two step kinds whose keys name no tool version and no host field."""

from optbuild.steps.base import InputPath, Step, StepContext, StepParams, StepRef


class ReadParams(StepParams):
    path: InputPath


class Read(Step):
    Params = ReadParams
    primary_output = "data.txt"

    def run(self, ctx: StepContext) -> None:
        (ctx.out_dir / "data.txt").write_text(ctx.path(self.params.path).read_text())


class ShoutParams(StepParams):
    input: StepRef
    times: int = 1


class Shout(Step):
    Params = ShoutParams
    primary_output = "data.txt"

    def run(self, ctx: StepContext) -> None:
        text = ctx.inputs["input"].primary.read_text()
        (ctx.out_dir / "data.txt").write_text(text.upper() * self.params.times)
'''
RECORDED = {
    "r:read": "776eb7575b98ce324964e2694aa06c41b78ce5b8ecb6bc6ee79655ce7260a5a2",
    "r:shout": "9f70c59ed58b45c56d8893568ba6f5e45b9fdfa4013168b52fa63e68781b9abf",
}


def _project(tmp_path) -> ProjectDir:
    """A project of the two kinds above: read, then shout it twice."""
    proj = ProjectDir(tmp_path / "p")
    proj.write("kinds.py", KINDS)
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[kinds]\nread = "kinds.py:Read"\n'
                                'shout = "kinds.py:Shout"\n')
    proj.write("data/input.txt", "hello\n")
    proj.write("recipes/r.toml", '[steps.read]\nkind = "read"\npath = "../data/input.txt"\n\n'
                                 '[steps.shout]\nkind = "shout"\ninput = "read"\ntimes = 2\n')
    return proj


def test_keys_are_those_the_old_layout_computed(tmp_path):
    proj = _project(tmp_path)
    result = proj.build()
    assert result.ok
    assert {sid: outcome.key for sid, outcome in result.outcomes.items()} == RECORDED
    assert proj.read("build/r/shout/data.txt") == "HELLO\nHELLO\n"


def test_the_lock_file_holds_each_step_s_action_whose_digest_is_its_key(tmp_path):
    """The action is what is keyed, recorded and shipped: read back from optbuild.lock (as a
    Dask node reads it from a task), it gives the key it was filed under."""
    from optbuild.builder import lockfile
    from optbuild.process.action import Action

    proj = _project(tmp_path)
    assert proj.build().ok
    records = lockfile.read(proj.root / "optbuild.lock")
    assert {sid: Action.from_material(r["ingredients"]).key for sid, r in records.items()} == RECORDED
    shout = Action.from_material(records["r:shout"]["ingredients"])
    assert shout.params["input"] is None  # the upstream's name is not content
    assert shout.run_params({"input": "r:read"}) == {"input": "r:read", "times": 2}
