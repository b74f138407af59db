"""optbuild bench shows PyTorch eager on CUDA beside the variants where torch sees a GPU
(issue 23): the export step's module and inputs on the GPU, each timed call synchronized.
On a host without one, nothing changes: the CPU eager row alone, and no note."""

from __future__ import annotations

import json

import pytest
from plugins.projects import ProjectDir

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow

FAST = ("--runs", "3", "--warmup", "1", "--threads", "1", "--json")

MODEL = """\
import torch


def build():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return net, (torch.zeros(2, 16),)
"""


def _bench(root) -> tuple[dict, ProjectDir]:
    proj = ProjectDir(root)
    root.mkdir()
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n')
    proj.write("recipes/net.py", MODEL)
    proj.write("recipes/r.toml", '[steps.export]\nkind = "export"\nmodel = "net.py:build"\n')
    run = proj.cli("bench", "r", *FAST)
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(run.stdout)["recipes"]
    return result, proj


def _rows(result: dict) -> dict[str, dict]:
    return {row["runtime"]: row for row in result["rows"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU: the gpu test covers it")
def test_without_a_gpu_the_eager_rows_are_as_before_and_no_note_mentions_cuda(tmp_path):
    result, _ = _bench(tmp_path / "proj")
    rows = _rows(result)
    assert sorted(rows) == ["onnxruntime", "torch"]
    assert rows["torch"]["label"] == "PyTorch eager" and rows["torch"]["runner"] == ""
    assert not any("CUDA" in note for note in result["notes"]), result["notes"]


@pytest.mark.gpu
def test_on_a_gpu_host_bench_lists_pytorch_eager_on_cuda_beside_the_cpu_rows(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and an NVIDIA GPU")
    result, proj = _bench(tmp_path / "proj")
    rows = _rows(result)
    assert sorted(rows) == ["onnxruntime", "torch", "torch-cuda"]
    cuda = rows["torch-cuda"]
    assert cuda["label"] == "PyTorch eager (CUDA)" and cuda["step"] == "r:export"
    assert cuda["runner"].startswith(f"torch {torch.__version__} (CUDA ")
    assert torch.cuda.get_device_name(0) in cuda["runner"]
    assert cuda["inputs"] == rows["torch"]["inputs"] == rows["onnxruntime"]["inputs"]  # the same inputs
    assert cuda["latency_ms"]["p50"] > 0 and cuda["speedup"] > 0
    assert result["baseline"] == {"step": "r:export", "runtime": "onnxruntime"}  # a model, never eager
    assert cuda["runner"] in result["host"]["runtimes"]
    table = proj.cli("bench", "r", "--runs", "3", "--warmup", "1", "--no-build")
    assert table.returncode == 0 and "PyTorch eager (CUDA)" in table.stdout, table.stderr
