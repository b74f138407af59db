"""A Dask node offering a GPU's fingerprint, beside a CPU-only node (recorded): the node
offers the GPU's model and compute capability, and steps keyed by them build there only.

Run twice: with the node started on this host without --fingerprint, probing its GPU
(marked gpu: the model on onnxruntime CUDA, verified and measured there, joins the steps),
and with the node offering the H100 recorded in tests/fixtures/fingerprints/h100.json (CPU
CI: the GPU-keyed steps are the test kind ``bound``, keyed by one field as an engine is)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from daskfarm import FINGERPRINTS, Cluster, make_project, start_cluster
from plugins.gpu import GPU_KEYED, H100, cuda_here, cuda_steps
from plugins.remote import Remote

from optbuild.builder import lockfile
from optbuild.common.fingerprint import Fingerprint

pytestmark = pytest.mark.timeout(120)

RECIPE = GPU_KEYED + """
[steps.on_cpu]
kind = "bound"
input = "src"
field = "gpu.count"
value = "0"
"""

ON_CUDA = """
[steps.model]
kind = "onnx"
path = "../models/convnet.onnx"
""" + cuda_steps(runs=10, warmup=2)


@dataclass
class GpuFarm:
    cluster: Cluster
    remote: Remote
    gpu: dict  # the fingerprint the GPU node offers
    real: bool  # the node probed this host


@pytest.fixture(params=[pytest.param("recorded", id="h100-recorded"),
                        pytest.param("real", id="this-gpu", marks=pytest.mark.gpu)])
def gpu_farm(request: pytest.FixtureRequest, tmp_path: Path, file_remote: Remote) -> Iterator[GpuFarm]:
    """A scheduler, a CPU-only node ("cpu", recorded) and a GPU node ("gpu"): this host
    without --fingerprint, or --fingerprint h100.json."""
    pytest.importorskip("distributed")
    real = request.param == "real"
    gpu = cuda_here().as_dict() if real else Fingerprint.load(H100).as_dict()
    cluster = start_cluster(tmp_path / "farm", {"cpu": 1}, file_remote)
    try:
        offer = [] if real else ["--fingerprint", str(H100)]
        with open(cluster.folder / "gpu.log", "ab") as log:
            cluster.nodes["gpu"] = subprocess.Popen(
                [sys.executable, "-m", "optbuild", "worker", "--scheduler", cluster.address, "--remote",
                 file_remote.url, *offer, "--nthreads", "2", "--name", "gpu", "--host", "127.0.0.1",
                 "--cache", str(cluster.folder / "cache-gpu")],
                stdout=log, stderr=subprocess.STDOUT, cwd=cluster.folder)
        cluster.wait_for_nodes(2, timeout=60)
        yield GpuFarm(cluster, file_remote, gpu, real)
    finally:
        cluster.stop()


def offers(cluster: Cluster) -> dict[str, dict]:
    """What each node tells a coordinator of itself (its name, fingerprint and resources)."""
    from distributed import Client

    from optbuild.distributed.node import node_info

    with Client(cluster.address, timeout=10, set_as_default=False) as client:
        return {info["name"]: info for info in client.run(node_info).values() if info}


def test_a_node_offers_its_gpu_and_the_steps_keyed_by_that_gpu_build_there(tmp_path, gpu_farm):
    name, capability = gpu_farm.gpu["gpu.0.name"], gpu_farm.gpu["gpu.0.compute_capability"]
    said = offers(gpu_farm.cluster)
    assert sorted(said) == ["cpu", "gpu"]
    gpu = said["gpu"]
    assert gpu["fields"]["gpu.0.name"] == name and gpu["fields"]["gpu.0.compute_capability"] == capability
    assert gpu["fields"]["gpu.count"] >= 1 and gpu["fields"]["gpu.driver"] == gpu_farm.gpu["gpu.driver"]
    wanted = {f"gpu.0.name={name}", f"gpu.0.compute_capability={capability}"}
    assert wanted <= gpu["resources"].keys(), gpu["resources"]
    assert not wanted & said["cpu"]["resources"].keys()
    assert said["cpu"]["fields"] == FINGERPRINTS["cpu"]

    recipe = RECIPE.format(name=name, capability=capability) + (ON_CUDA if gpu_farm.real else "")
    dask = f'executor = "dask"\nscheduler = "{gpu_farm.cluster.address}"\n'
    proj = make_project(tmp_path / "coordinator", build=dask, remote=gpu_farm.remote.section(), recipe=recipe)
    if gpu_farm.real:
        from plugins.models import make_convnet

        make_convnet(proj.root / "models" / "convnet.onnx")
    result = proj.build()
    assert result.ok, (result.reporter.events, gpu_farm.cluster.logs())
    lock = lockfile.read(proj.root / "optbuild.lock")
    nodes = {sid: record["node"] for sid, record in lock.items()}
    on_gpu = {"farm:for_model", "farm:for_capability"}
    if gpu_farm.real:  # the CUDA model: the CPU-only node cannot run it
        on_gpu |= {"farm:engine_cuda", "farm:verify_cuda", "farm:bench_cuda"}
    assert {sid: nodes[sid] for sid in on_gpu} == dict.fromkeys(on_gpu, "gpu"), nodes
    assert nodes["farm:on_cpu"] == "cpu"
    assert lock["farm:for_model"]["host"] == {"gpu.0.name": name}
    if gpu_farm.real:
        assert lock["farm:bench_cuda"]["host"]["gpu.0.name"] == name
        bench = proj.read("build/farm/bench_cuda/benchmark.json")
        assert "(CUDA" in bench and name in bench
