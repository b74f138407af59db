"""A step is keyed on the upstream outputs it reads (``Step.outputs_read``), and is given only
those: a select that chose the same model again, with other timings in its report, leaves the
step that serves its choice cached (#33 item 9)."""

from __future__ import annotations

import shutil
from pathlib import Path

from plugins.projects import CONFIG, FIXTURES, ProjectDir

from optbuild.steps.deploy import REPORTS, Deploy, DeployParams

SERVE = '''
from optbuild.plugin import Step, StepContext, StepParams, StepRef


class ServeParams(StepParams):
    input: StepRef


class Serve(Step[ServeParams]):
    """Serves its input's model: reads that file only."""

    Params = ServeParams
    primary_output = "served.txt"

    def outputs_read(self, field, outputs):
        return {name: digest for name, digest in outputs.items() if name == "model.onnx"}

    def run(self, ctx: StepContext) -> None:
        given = ctx.inputs["input"]
        assert sorted(given.files) == ["model.onnx"], given.files  # what is not keyed is not given
        (ctx.out_dir / "served.txt").write_bytes(given.primary.read_bytes()[:8])
'''


def _project(root: Path) -> ProjectDir:
    """Candidates a (3 ms) and b (1.5 ms), figures as given; best selects (by the figures), serve
    reads the model it chose, echo (join) reads every output of it."""
    proj = ProjectDir.with_test_kinds(root)
    shutil.copy(FIXTURES / "figures.py", root / "figures.py")
    proj.write("serve.py", SERVE)
    proj.write("optbuild.toml", CONFIG.replace("[kinds]\n", '[kinds]\nfigures = "figures.py:Figures"\n'
                                                            'serve = "serve.py:Serve"\n'))
    proj.write("recipes/m.toml", '[steps.a]\nkind = "figures"\np50_ms = 3.0\n\n[steps.b]\nkind = "figures"\n'
                                 'p50_ms = 1.5\n\n[steps.best]\nkind = "select"\nmeasure = "cached"\n'
                                 'candidates = ["a", "b"]\n\n[steps.serve]\nkind = "serve"\ninput = "best"\n\n'
                                 '[steps.echo]\nkind = "join"\ninput = "best"\n')
    return proj


def test_the_same_choice_with_other_timings_leaves_the_step_that_reads_only_the_model_cached(tmp_path):
    proj = _project(tmp_path / "p")
    assert proj.build().ok
    proj.write("recipes/m.toml", proj.read("recipes/m.toml").replace("p50_ms = 3.0", "p50_ms = 2.5"))
    result = proj.build()
    assert result.ok
    assert "m:best" in result.steps("built")  # its report changed: a's figure
    assert "m:serve" in result.steps("cached")  # the model it reads did not
    assert "m:echo" in result.steps("built")  # a kind that reads every output is keyed on the report too


def test_deploy_reads_the_model_not_a_select_or_benchmark_report(tmp_path):
    step = Deploy(DeployParams(input="best"), tmp_path, tmp_path)
    outputs = {"model.onnx": "1", "model.onnx.data": "2", "selection.json": "3", "selection.txt": "4",
               "benchmark.json": "5"}
    assert step.outputs_read("input", outputs) == {"model.onnx": "1", "model.onnx.data": "2"}
    assert REPORTS == {"selection.json", "selection.txt", "benchmark.json"}
