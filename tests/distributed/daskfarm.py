"""Helpers of the dask executor's tests: a Dask cluster on 127.0.0.1 (a scheduler in this
process, `optbuild worker` processes offering recorded fingerprints: two GPU generations
and a CPU-only host, each told its remote cache), and projects that use it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugins.projects import ProjectDir
from plugins.remote import Remote

HERE = Path(__file__).resolve().parent

_BASE = {"os.name": "Linux", "os.release": "6.1", "python.version": "3.11.7", "python.implementation": "cpython",
         "cpu.arch": "x86_64", "cpu.model": "Test CPU", "cpu.flags": "sse4_1,sse4_2,avx,avx2", "cpu.count": 8,
         "cuda.driver_version": None, "tensorrt.version": None, "tensorrt.distribution": None,
         "tensorrt_rtx.version": None, "tensorrt_rtx.distribution": None, "onnxruntime.version": None,
         "onnxruntime.distribution": None, "ort_providers.available": None}
FINGERPRINTS = {
    "ampere": {**_BASE, "gpu.count": 1, "gpu.driver": "570.1", "gpu.0.name": "NVIDIA A100-SXM4-80GB",
               "gpu.0.compute_capability": "8.0", "gpu.0.memory_mib": 81920, "cuda.driver_version": "12.8"},
    "hopper": {**_BASE, "gpu.count": 1, "gpu.driver": "570.1", "gpu.0.name": "NVIDIA H100 80GB HBM3",
               "gpu.0.compute_capability": "9.0", "gpu.0.memory_mib": 81559, "cuda.driver_version": "12.8"},
    "cpu": {**_BASE, "gpu.count": 0, "gpu.error": "no NVIDIA GPU (NVML library not found)"},
}


@dataclass
class Cluster:
    address: str
    folder: Path
    scheduler: object
    remote: Remote  # the nodes' (`optbuild worker --remote`)
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)
    security: Any = None  # a distributed.Security, for a cluster over TLS

    def fingerprint_file(self, name: str) -> Path:
        path = self.folder / f"{name}.json"
        path.write_text(json.dumps({"fields": FINGERPRINTS[name]}))
        return path

    def start_node(self, name: str, *, nthreads: int = 2, env: dict[str, str] | None = None,
                   fingerprint: str | None = None, args: tuple[str, ...] = ("--host", "127.0.0.1")) -> subprocess.Popen:
        """An `optbuild worker` process; its environment holds no signing key unless ``env`` gives one."""
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 (the node's for its life)
        remote = ["--remote", self.remote.url, *(["--remote-endpoint", self.remote.endpoint] if self.remote.endpoint else [])]
        base = {k: v for k, v in os.environ.items() if k != "OPTBUILD_SIGNING_KEY"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "optbuild", "worker", "--scheduler", self.address, *remote, "--fingerprint",
             str(self.fingerprint_file(fingerprint or name)), "--nthreads", str(nthreads), "--name", name, *args,
             "--cache", str(self.folder / f"cache-{name}")],
            stdout=log, stderr=subprocess.STDOUT, env={**base, **(env or {})}, cwd=self.folder)
        log.close()
        self.nodes[name] = proc
        return proc

    def wait_for_nodes(self, count: int, timeout: float = 30) -> None:
        from distributed import Client

        with Client(self.address, timeout=10, set_as_default=False, security=self.security) as client:
            deadline = time.monotonic() + timeout
            while len(client.scheduler_info(n_workers=-1)["workers"]) < count:
                dead = {n: p.returncode for n, p in self.nodes.items() if p.poll() is not None}
                assert not dead, f"nodes exited: {dead}: {self.logs()}"
                assert time.monotonic() < deadline, f"{count} nodes did not join: {self.logs()}"
                time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.folder.glob("*.log"))

    def stop_node(self, name: str) -> None:
        proc = self.nodes.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        for name in list(self.nodes):
            self.stop_node(name)
        self.scheduler.close()


def start_cluster(folder: Path, nodes: dict[str, int], remote: Remote, env: dict[str, str] | None = None,
                  fingerprints: dict[str, str] | None = None, security: Any = None) -> Cluster:
    """A scheduler and a node per ``nodes`` item (name: threads), offering the recorded
    fingerprint its name (or ``fingerprints[name]``) names and storing into ``remote``;
    over TLS with ``security`` (a ``distributed.Security``; the nodes need Dask's TLS
    settings in ``env`` then)."""
    folder.mkdir(parents=True, exist_ok=True)
    from distributed import LocalCluster

    scheduler = LocalCluster(n_workers=0, processes=False, host="127.0.0.1", scheduler_port=0,
                             dashboard_address="127.0.0.1:0", protocol="tls://" if security else "tcp://",
                             security=security)
    cluster = Cluster(scheduler.scheduler_address, folder, scheduler, remote, security=security)
    try:
        for name, nthreads in nodes.items():
            cluster.start_node(name, nthreads=nthreads, env=env, fingerprint=(fingerprints or {}).get(name))
        cluster.wait_for_nodes(len(nodes))
    except BaseException:
        cluster.stop()
        raise
    return cluster


KINDS = """\
[kinds]
text = "kinds.py:Text"
join = "kinds.py:Join"
bound = "hostkinds.py:Bound"
"""


def make_project(root: Path, *, build: str = "", remote: str = "", recipe: str = "") -> ProjectDir:
    proj = ProjectDir.with_test_kinds(root)
    shutil.copy(HERE / "hostkinds.py", proj.root / "hostkinds.py")
    proj.write("optbuild.toml", f'[project]\nrecipes = ["recipes/*.toml"]\n\n{KINDS}\n[build]\njobs = 6\n{build}\n{remote}')
    proj.write("recipes/farm.toml", recipe)
    return proj


def dask_project(tmp_path: Path, farm: Cluster, remote: Remote, recipe: str, name: str = "coordinator") -> ProjectDir:
    """A project at ``tmp_path/name`` that builds ``recipe`` on ``farm``, storing into ``remote``."""
    return make_project(tmp_path / name, build=f'executor = "dask"\nscheduler = "{farm.address}"\n',
                        remote=remote.section(), recipe=recipe)


def build(proj: ProjectDir, targets: list[str] | None = None, **options: Any) -> Any:
    """``api.build`` of ``proj`` in this process (an ``api.BuildResult``)."""
    from optbuild import api
    from optbuild.builder.report import Reporter

    ws = api.open_workspace(proj.root)
    try:
        return api.build(ws, targets, reporter=Reporter(), **options)
    finally:
        ws.close()
