"""A loopback Dask farm for the fault suite's `dask-forged` category (benchmarks/faults.py).

A `dask scheduler` and `optbuild worker` nodes run as subprocesses on 127.0.0.1, each in a
process group of its own, so that stopping one also ends the fork servers it started. The
nodes take the remote cache from their command line and the signing key from their own
environment, as docs/distributed.md says a farm's nodes do. The forged tasks are the JSON the
coordinator submits (optbuild/distributed/builder.py, `_task`), rebuilt from the honest
remote entries and then altered in one way each, and sent straight to the scheduler as an
attacker who reaches it would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT = 60.0  # seconds for the scheduler to write its file and the nodes to join


@dataclass
class Farm:
    """A running scheduler and its nodes (each the leader of its own process group)."""

    address: str
    folder: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def logs(self) -> str:
        """The tail of every log: what to show when the farm misbehaves."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        """SIGTERM each process (nodes first), then SIGKILL its whole group: no node, fork
        server or scheduler outlives the category."""
        for proc in reversed(self.procs):
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _spawn(farm: Farm, name: str, argv: list[str], env: dict[str, str]) -> None:
    with open(farm.folder / f"{name}.log", "wb") as log:
        farm.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=farm.folder,
                                           start_new_session=True))


def start_farm(folder: Path, remote_url: str, nodes: int, env: dict[str, str], node_env: dict[str, str]) -> Farm:
    """A scheduler and ``nodes`` build nodes storing into ``remote_url``; ``node_env`` is
    added to the nodes' environment only (the signing key: a node's own, never a task's)."""
    folder.mkdir(parents=True)
    file = folder / "scheduler.json"
    farm = Farm("", folder)
    try:
        _spawn(farm, "scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                   "--port", "0", "--no-dashboard", "--scheduler-file", str(file)], env)
        deadline = time.monotonic() + START_TIMEOUT
        while not file.exists() or not file.read_text().strip():
            if farm.procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Dask scheduler did not start:\n{farm.logs()}")
            time.sleep(0.1)
        farm.address = json.loads(file.read_text())["address"]
        for i in range(nodes):
            _spawn(farm, f"node{i}", [sys.executable, "-m", "optbuild", "worker", "--scheduler", farm.address,
                                      "--remote", remote_url, "--host", "127.0.0.1", "--name", f"node{i}",
                                      "--nthreads", "1", "--cache", str(folder / f"cache{i}")], {**env, **node_env})
        _wait_for_nodes(farm, nodes)
    except BaseException:
        farm.stop()
        raise
    return farm


def _wait_for_nodes(farm: Farm, count: int) -> None:
    from distributed import Client

    with Client(farm.address, timeout=20, set_as_default=False) as client:
        deadline = time.monotonic() + START_TIMEOUT
        while len(client.scheduler_info(n_workers=-1)["workers"]) < count:
            if any(p.poll() is not None for p in farm.procs) or time.monotonic() > deadline:
                raise RuntimeError(f"{count} build nodes did not join:\n{farm.logs()}")
            time.sleep(0.2)


def send(farm: Farm, task: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Submit ``task`` to the scheduler as the coordinator does (optbuild's own task
    function, on a node), without any coordinator: what a stranger who reaches it can do."""
    from distributed import Client

    from optbuild.distributed.task import run_task

    with Client(farm.address, timeout=20, set_as_default=False) as client:
        return client.submit(run_task, task, pure=False, resources={"optbuild": 1}).result(timeout=timeout)


# --- forged tasks --------------------------------------------------------------------------
def deps_of(recipe: str, recipe_name: str) -> dict[str, dict[str, str]]:
    """step id -> {field: upstream step id}: the step references of a recipe's text."""
    steps = tomllib.loads(recipe)["steps"]
    return {f"{recipe_name}:{sid}": {f: f"{recipe_name}:{v}" for f, v in spec.items() if f in ("input", "other")}
            for sid, spec in steps.items()}


def honest_task(entry: dict[str, Any], entries: dict[str, dict[str, Any]], deps: dict[str, str],
                project: Path, remote_url: str) -> dict[str, Any]:
    """The task the coordinator sent for ``entry``'s step (its remote entry: key, key
    material, primary output), its upstream outputs those of ``entries`` (step id -> entry);
    the key material names the project file and class of the step's kind."""
    implementation = f"project:{entry['ingredients']['class']}"
    files = {name: {"digest": digest, "size": (project / name).stat().st_size}
             for name, digest in entry["ingredients"]["files"].items()}
    inputs = {f: {"step": up, "key": entries[up]["key"], "primary": entries[up]["primary"],
                  "outputs": entries[up]["outputs"]} for f, up in deps.items()}
    return {"key": entry["key"], "step": entry["step"], "implementation": implementation, "base_dir": "recipes",
            "files": files, "inputs": inputs, "primary_output": entry["primary"], "ingredients": entry["ingredients"],
            "preload": [], "remote": remote_url, "signed": True}


@dataclass(frozen=True)
class Forged:
    """A forged task, what was changed, and what a node's refusal must name (it proves the
    check that caught it was the one meant; a task refused for another reason proved nothing)."""

    task: dict[str, Any]
    what: str
    because: str


# each: (honest task, digest and size of the attacker's blob, already in the remote) -> Forged, or
# None where the step has nothing of that sort (no input file, no upstream step...)
Forgery = Callable[[dict[str, Any], str, int], "Forged | None"]


def other_input_bytes(task: dict[str, Any], digest: str, size: int) -> Forged | None:
    data = sorted(n for n in task["files"] if not n.endswith(".py"))
    if not data:
        return None
    files = {**task["files"], data[0]: {"digest": digest, "size": size}}
    return Forged({**task, "files": files}, f"other bytes for {data[0]}", f"input file {data[0]} changed")


def other_upstream_output(task: dict[str, Any], digest: str, size: int) -> Forged | None:
    if not task["inputs"]:
        return None
    field_name = min(task["inputs"])
    upstream = task["inputs"][field_name]
    name = upstream["primary"]
    outputs = {**upstream["outputs"], name: {"digest": digest, "size": size}}
    return Forged({**task, "inputs": {**task["inputs"], field_name: {**upstream, "outputs": outputs}}},
                  f"other bytes for upstream {upstream['step']} {name}", "the task is not what its key")


def other_upstream_primary(task: dict[str, Any], digest: str, size: int) -> Forged | None:
    """The step pointed at another output of its upstream (blob.bin, not data.txt): the key
    holds the upstream's outputs, not which one is the main one (issue 30, item 7)."""
    for field_name, upstream in sorted(task["inputs"].items()):
        others = sorted(n for n in upstream["outputs"] if n != upstream["primary"])
        if others:
            inputs = {**task["inputs"], field_name: {**upstream, "primary": others[0]}}
            return Forged({**task, "inputs": inputs}, f"{others[0]} as {upstream['step']}'s main output",
                          "as the main output of")
    return None


def other_key_material(task: dict[str, Any], digest: str, size: int) -> Forged | None:
    params = task["ingredients"]["params"]
    changed = ({"path": "../data/extra.txt"} if "path" in params else {"megabytes": 0.5} if "megabytes" in params
               else {"suffix": "-forged"})
    material = {**task["ingredients"], "params": {**params, **changed}}
    return Forged({**task, "ingredients": material}, f"key material with {changed}",
                  "its key is not that of its key material")


def other_class(task: dict[str, Any], digest: str, size: int) -> Forged | None:
    """The same kind file, another class in it (blob.py's Shadow writes other bytes)."""
    if not task["implementation"].endswith(":Blob"):
        return None
    implementation = task["implementation"].rpartition(":")[0] + ":Shadow"
    return Forged({**task, "implementation": implementation}, f"implementation {implementation}", "Shadow")


def builtin_implementation(task: dict[str, Any], digest: str, size: int) -> Forged | None:
    """A built-in kind's implementation for a project kind's step: the node's registry decides."""
    implementation = "optbuild.steps.export:Export"
    return Forged({**task, "implementation": implementation}, f"implementation {implementation}", "step kind")


FORGERIES: dict[str, Forgery] = {
    "input bytes": other_input_bytes, "upstream output": other_upstream_output,
    "upstream main output": other_upstream_primary,
    "key material": other_key_material, "kind class": other_class, "built-in kind": builtin_implementation,
}
