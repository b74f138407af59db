"""The dask executor against local builds (issue #13), on one machine: a Dask scheduler and
3 `optbuild worker` nodes x 4 threads on 127.0.0.1, a file:// remote cache.

    python benchmarks/dask_vs_local.py [--sleepy 40] [--instant 24]

Prints, each a cold build (fresh caches, fresh remote):
  1. --sleepy steps that each sleep 1 s (so that 2 cores do not cap them): local -j 2
     against the dask executor with -j 12 (the farm's slots);
  2. --instant steps that do nothing: local -j 2 against dask -j 12, and the dask
     executor's overhead per step (wall time over the steps: a fork from the node's
     fork server per step, plus the transfers).
All nodes share this host, so the figures show the executor's overhead and its parallelism,
not a farm's network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "tests" / "fixtures" / "kinds.py"
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
       "OPTBUILD_SERVER": "0"}  # cold builds in-process: no build server left in the temporary projects
NODES, THREADS = 3, 4


def project(root: Path, steps: int, sleep: float, *, executor: str, scheduler: str, remote: Path) -> Path:
    """``steps`` independent steps off one source, each sleeping ``sleep`` seconds."""
    (root / "recipes").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "input.txt").write_text("hello\n")
    shutil.copy(KINDS, root / "kinds.py")
    (root / "optbuild.toml").write_text(
        '[project]\nrecipes = ["recipes/*.toml"]\n[kinds]\ntext = "kinds.py:Text"\njoin = "kinds.py:Join"\n'
        f'[build]\nexecutor = "{executor}"\nscheduler = "{scheduler}"\n'
        f'[remote]\nurl = "file://{remote}"\n')
    lines = ['[steps.src]\nkind = "text"\npath = "../data/input.txt"\n']
    lines += [f'[steps.s{i}]\nkind = "join"\ninput = "src"\nsuffix = "-{i}"\nsleep = {sleep}\n' for i in range(steps)]
    (root / "recipes" / "bench.toml").write_text("\n".join(lines))
    return root


def timed_build(root: Path, jobs: int) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "optbuild", "build", "-j", str(jobs)], cwd=root, env=ENV,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"the build in {root} failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def start_nodes(address: str, folder: Path, remote: Path, count: int = NODES,
                threads: int = THREADS) -> list[subprocess.Popen]:
    """``count`` build nodes of ``threads`` each, with their own cold blob caches and the farm's
    one remote (a node takes its remote from its own command line, never from a task)."""
    nodes = []
    for i in range(count):
        log = open(folder / f"node{i}.log", "wb")  # noqa: SIM115 (the node's, for its life)
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "optbuild", "worker", "--scheduler", address, "--nthreads", str(threads),
             "--name", f"node{i}", "--host", "127.0.0.1", "--cache", str(folder / f"cache{i}"),
             "--remote", f"file://{remote}"],
            stdout=log, stderr=subprocess.STDOUT, env=ENV))
        log.close()
    from distributed import Client

    with Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(count, timeout=120)
    return nodes


def compare(tmp: Path, address: str, steps: int, sleep: float) -> tuple[float, float]:
    label = f"{steps}x{sleep:g}s"
    local_remote, farm_remote = tmp / f"remote-local-{label}", tmp / "remote-dask"
    local_remote.mkdir()
    shutil.rmtree(farm_remote)  # the nodes' remote, emptied: every build is cold
    farm_remote.mkdir()
    local = project(tmp / f"local-{label}", steps, sleep, executor="local", scheduler="", remote=local_remote)
    farm = project(tmp / f"dask-{label}", steps, sleep, executor="dask", scheduler=address, remote=farm_remote)
    return timed_build(local, 2), timed_build(farm, NODES * THREADS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sleepy", type=int, default=40, help="steps that sleep 1 s")
    parser.add_argument("--instant", type=int, default=24, help="steps that do nothing")
    args = parser.parse_args()
    from distributed import LocalCluster

    with tempfile.TemporaryDirectory() as tmp_name, \
            LocalCluster(n_workers=0, processes=False, host="127.0.0.1", scheduler_port=0,
                         dashboard_address="127.0.0.1:0", protocol="tcp://") as scheduler:
        tmp = Path(tmp_name)
        (tmp / "remote-dask").mkdir()
        nodes = start_nodes(scheduler.scheduler_address, tmp, tmp / "remote-dask")
        try:
            sleepy = compare(tmp, scheduler.scheduler_address, args.sleepy, 1.0)
            instant = compare(tmp, scheduler.scheduler_address, args.instant, 0.0)
        finally:
            for node in nodes:
                node.terminate()
            for node in nodes:
                node.wait(10)
    print(f"cold builds, {os.cpu_count()} CPUs; dask: {NODES} nodes x {THREADS} threads on this host, file:// remote")
    print(f"{'scenario':<28} {'local -j 2':>11} {'dask -j ' + str(NODES * THREADS):>11} {'local/dask':>11}")
    for name, (local, farm) in ((f"{args.sleepy} steps sleeping 1 s", sleepy), (f"{args.instant} instant steps", instant)):
        print(f"{name:<28} {local:>10.2f}s {farm:>10.2f}s {local / farm:>10.2f}x")
    per_step = (instant[1] - instant[0]) / args.instant
    print(f"dask overhead per instant step, beyond a local build's: {per_step * 1000:.0f} ms of wall time")


if __name__ == "__main__":
    main()
