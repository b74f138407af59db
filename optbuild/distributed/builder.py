"""The dask builder: each step that must build is one Dask task on a node.

The coordinator (``optbuild.builder.scheduler.Scheduler``) schedules, keys, looks up the caches and
writes the lock file as for a local build; this builder (``builder.site.Builder``) only

* places a step (``place``): among the nodes that ``optbuild worker`` started, those whose
  fingerprint can run it (``Step.unavailable``), grouped by the host part of the key they
  would give (``Step.host_key``). One group: the key is computed with its fingerprint.
  Several (a step keyed by the GPU model, nodes of two models): the group that matches the
  coordinator's own fingerprint (or the one given as ``host``), else the largest group,
  then the first by its fields, so the choice does not depend on timing. None: the step is
  unavailable, naming what each node lacks. The task then asks for that group's field
  values as Dask resources (``resources.requested``), so Dask runs it only where its key holds;
* builds a step (``build``): makes sure the remote CAS holds its input files (a snapshot,
  checked against the digests its key was made of) and its upstream outputs, submits
  ``task.run_task`` with a small ``taskspec.Task``, and accepts the entry it returns only as the
  remote cache accepts a fetched one (``decode_entry``: its key, digests, output names,
  signature), plus its key material, step and kind must be the ones asked for. The outputs
  are then fetched into the local store (each blob checked) and restored as for a remote hit.

A node that dies mid-step: Dask runs the task again on another node that offers the same
resources (``distributed.scheduler.allowed-failures`` times, 3 by default); the dead node
wrote no entry (a node writes its entry only after all its blobs).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optbuild.builder.site import BuildContext, Builder, BuilderUnavailable, BuildRequest, Placement
from optbuild.common.errors import OptbuildError, StepError
from optbuild.common.events import warning
from optbuild.common.fingerprint import Fingerprint
from optbuild.distributed.resources import MARKER, requested, satisfies
from optbuild.distributed.taskspec import PROJECT_KIND, Task, TaskResult, Upstream
from optbuild.process.runstep import Cancelled, StepFailed
from optbuild.process.spec import ChildResult
from optbuild.project.recipe import StepSpec
from optbuild.store.entry import ActionEntry, canonical_json

CONNECT_TIMEOUT_S = 10
NODES_WAIT_S = 10.0  # how long a build waits for the first node to join
NODE_GONE_S = 30.0  # how long a step waits for a node that can build it, when all such left


@dataclass
class Node:
    address: str
    name: str
    fields: dict[str, Any]
    resources: dict[str, float]


@dataclass
class HostClass:
    """Nodes with one fingerprint."""

    host: Fingerprint
    fields: dict[str, Any]
    nodes: list[Node] = field(default_factory=list)

    @property
    def names(self) -> str:
        return ", ".join(sorted(n.name for n in self.nodes))


@dataclass(frozen=True)
class Route:
    resources: dict[str, float]
    workers: list[str] | None  # pinned to these nodes, where resources cannot say it
    nodes: str  # the nodes' names, for messages


class DaskBuilder(Builder):
    local = False
    name = "dask"

    def __init__(self, context: BuildContext):
        super().__init__(context)
        self.address = context.dask_scheduler
        self.client: Any = None
        self.classes: list[HostClass] = []
        self.nodes: list[Node] = []
        self._present: set[str] = set()  # blobs known to be in the remote CAS this run
        self._entries: set[str] = set()  # keys of upstream entries known to be in the remote this run
        self._sending: dict[str, threading.Lock] = {}  # per blob: held while one thread uploads it
        self._connected = False
        self._lock = threading.Lock()

    # --- start and stop --------------------------------------------------------------
    def start(self) -> None:
        ex = self.context
        config = ex.project.config_file
        if not self.address:
            raise OptbuildError('the dask executor needs the address of a Dask scheduler that `optbuild worker` '
                                f'nodes joined: --scheduler tcp://HOST:PORT, or [build] scheduler in {config}')
        if not ex.dry_run:
            if ex.remote is None:
                raise BuilderUnavailable(f'{config}: the dask executor needs a remote cache ([remote] url, '
                                    "s3://... or file:// on a mount every node shares): artifacts travel "
                                    "through it, not through Dask")
            if not (ex.remote.store.read and ex.remote.store.write):
                raise BuilderUnavailable(f'{config}: the dask executor needs a remote cache that this host '
                                    "can read and write ([remote] read and write = true)")
        from optbuild.distributed import require_distributed, require_tls_settings

        require_distributed()
        require_tls_settings(self.address, "client")
        from distributed import Client

        try:
            self.client = Client(self.address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            message = f"cannot reach the Dask scheduler at {self.address}: {type(exc).__name__}: {exc}"
            if not ex.dry_run:
                raise BuilderUnavailable(message) from None
            ex.reporter.emit(warning(message + "; planning for this host"))
            return
        self._discover()

    def _discover(self) -> None:
        from optbuild.distributed.node import node_info

        deadline = time.monotonic() + NODES_WAIT_S
        while True:
            found = self.client.run(node_info, on_error="return")
            self.nodes = [Node(address, str(info["name"]), dict(info["fields"]), dict(info["resources"]))
                          for address, info in sorted(found.items()) if isinstance(info, dict)]
            if self.nodes or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if not self.nodes:
            raise BuilderUnavailable(f"no node has joined the Dask scheduler at {self.address}: start one on each "
                                f"build host with `optbuild worker --scheduler {self.address}`")
        by_fields: dict[bytes, HostClass] = {}
        for node in self.nodes:
            canon = canonical_json(node.fields)
            if canon not in by_fields:
                by_fields[canon] = HostClass(Fingerprint(node.fields), node.fields)
            by_fields[canon].nodes.append(node)
        self.classes = [by_fields[c] for c in sorted(by_fields)]

    def slots(self) -> int:
        """The farm's: every node's task threads (a dry run that reached no node: this
        host's CPUs)."""
        return int(sum(node.resources.get(MARKER, 0) for node in self.nodes)) or super().slots()

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=5)

    # --- placement -------------------------------------------------------------------
    def place(self, spec: StepSpec) -> Placement:
        ex = self.context
        if not self.classes:  # a plan with no scheduler reachable: for this host
            return Placement.on(ex.host, spec)
        eligible, refusals = [], []
        for cls in self.classes:
            why = spec.step.unavailable(cls.host)
            if why is None:
                eligible.append(cls)
            else:
                refusals.append(f"{cls.names}: {why}")
        if not eligible:
            why = (f"no node of the Dask cluster at {self.address} can build it (" + "; ".join(refusals) + ")")
            return Placement(ex.host, lambda: why)
        groups: dict[bytes, list[HostClass]] = {}
        for cls in eligible:
            groups.setdefault(canonical_json(spec.step.host_key(cls.host)), []).append(cls)
        mine = canonical_json(spec.step.host_key(ex.host)) if len(groups) > 1 else None
        if mine in groups:
            chosen = groups[mine]
        else:
            chosen = min(groups.items(), key=lambda g: (-sum(len(c.nodes) for c in g[1]), g[0]))[1]
        return Placement(chosen[0].host, route=self._route(spec, chosen))

    def _route(self, spec: StepSpec, chosen: list[HostClass]) -> Route:
        wanted = requested(spec.step.host_key(chosen[0].host))
        members = {n.address for c in chosen for n in c.nodes}
        matching = {n.address for n in self.nodes if satisfies(n.resources, wanted)}
        names = ", ".join(sorted(n.name for c in chosen for n in c.nodes))
        return Route(wanted, sorted(members) if matching != members else None, names)

    # --- one build -------------------------------------------------------------------
    def build(self, request: BuildRequest) -> ActionEntry:
        ex = self.context
        if ex.cancel.is_set():
            raise Cancelled
        spec, key, route = request.spec, request.key, request.placement.route
        assert isinstance(route, Route) and ex.remote is not None
        self._connect()
        task = self._task(request)
        from optbuild.distributed.task import run_task

        future = self.client.submit(
            run_task, task.model_dump(mode="json"), key=f"{spec.id}-{key[:12]}-{uuid.uuid4().hex[:8]}", pure=False,
            resources=route.resources, workers=route.workers, allow_other_workers=False)
        result = TaskResult.read(self._wait(future, spec, route))
        ex.remote.crossings.add(result.node, result.crossed)
        if not result.ok:
            self._failed(spec, result)
        return self._accept(spec, key, request.action.material(), result, download=request.download)

    def _wait(self, future: Any, spec: StepSpec, route: Route) -> Any:
        from distributed import KilledWorker

        try:
            orphaned: float | None = None  # since when no connected node could run it
            checked = time.monotonic()
            while not future.done():
                if self.context.cancel.is_set():
                    future.cancel()
                    raise Cancelled
                time.sleep(0.05)
                if time.monotonic() - checked > 1.0:
                    checked = time.monotonic()
                    if self._placeable(route):
                        orphaned = None
                    elif orphaned is None:
                        orphaned = checked
                    elif checked - orphaned > NODE_GONE_S:
                        future.cancel()
                        raise StepError(f"{spec.id}: no connected node can build it any more (it was placed "
                                        f"on {route.nodes}, which left the Dask cluster at {self.address}, "
                                        f"and none offering {_shown(route.resources)} joined within "
                                        f"{NODE_GONE_S:g} s); nothing of it was stored")
            return future.result()
        except KilledWorker as exc:
            raise StepError(f"{spec.id}: the nodes that ran it died, each time ({exc}); Dask stopped retrying "
                            "it. Nothing of it was stored") from None
        except (Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise StepError(f"{spec.id} did not build on the Dask cluster at {self.address} (nodes "
                            f"{route.nodes}): {type(exc).__name__}: {exc}") from None

    def _placeable(self, route: Route) -> bool:
        """Whether a node connected now can run a task routed so (Dask would wait for one forever)."""
        try:
            workers = self.client.scheduler_info(n_workers=-1)["workers"]
        except Exception:  # the scheduler is gone: the future fails on its own
            return True
        return any(satisfies(info.get("resources") or {}, route.resources)
                   and (route.workers is None or address in route.workers) for address, info in workers.items())

    def _task(self, request: BuildRequest) -> Task:
        """The task; the files and upstream outputs it names are in the remote CAS. A node
        checks it against its key (``task``): files go under the names their digests have in
        the key material, and the parameters are the key's."""
        ex, spec = self.context, request.spec
        assert ex.remote is not None
        root = ex.project.root
        files = {}
        for name, path in request.key_files.items():
            relative = _relative(path, root, spec)
            try:
                blob = ex.store.put_file(path)  # a snapshot: the file may change while the step builds
            except FileNotFoundError:
                raise StepError(f"input file disappeared: {path}") from None
            if blob.digest != request.action.files.get(name):
                raise StepError(f"input {relative} changed while {spec.id} was being sent to the Dask cluster; "
                                "run the build again")
            files[name] = blob
            self._ensure(blob.digest, blob.size, f"{spec.id} input {relative}")
        inputs = {}
        for field_name, entry in request.upstream.items():
            read = {name: output for name, output in entry.outputs.items() if name in request.action.inputs[field_name]}
            if field_name not in request.remote_inputs:  # else read from the remote, which holds it
                for name, output in read.items():  # only what the step reads (its action's) travels
                    self._ensure(output.digest, output.size, f"{entry.step} {name}")
                self._ensure_entry(entry, spec.deps[field_name])
            inputs[field_name] = Upstream(step=spec.deps[field_name], key=entry.key, primary=entry.primary,
                                          outputs=read)
        implementation = spec.implementation
        file, _, cls = implementation.rpartition(":")
        if file.endswith(".py"):
            implementation = f"{PROJECT_KIND}{_relative(Path(file), root, spec)}:{cls}"
        base = "." if Path(spec.step.base_dir).resolve() == Path(root).resolve() else _relative(spec.step.base_dir, root, spec)
        store = ex.remote.store
        return Task(key=request.key, step=spec.id, implementation=implementation, base_dir=base, files=files,
                    inputs=inputs, primary_output=spec.step.primary_output, ingredients=request.action.material(),
                    preload=spec.step.preload, remote=store.display_url, signed=store.signing_key is not None)

    def _connect(self) -> None:
        """The remote cache, usable for reading and writing: StepError saying why not."""
        from optbuild.store.remote import TransferError

        if self._connected:
            return
        assert self.context.remote is not None  # start() refused to run without one
        try:
            self.context.remote.require_read_write()
        except TransferError as exc:
            raise StepError(str(exc)) from None
        self._connected = True

    def _ensure(self, digest: str, size: int, label: str) -> None:
        """The remote CAS holds blob ``digest`` (from the local store) once this returns."""
        from optbuild.store.remote import TransferError

        with self._lock:
            if digest in self._present:
                return
            gate = self._sending.setdefault(digest, threading.Lock())
        with gate:  # one upload per blob: steps sharing an input (a model, several engines) wait for it
            with self._lock:
                if digest in self._present:
                    return
            ex = self.context
            assert ex.remote is not None  # start() refused to run without one
            if not ex.store.blob_ok(digest, size):
                raise StepError(f"{label} is missing from the local cache {ex.store.root} (run the build again)")
            try:
                ex.remote.ensure_blob(ex.store.blob_path(digest), digest, size, label)
            except TransferError as exc:
                raise StepError(f"{exc} (the dask executor needs it there)") from None
            with self._lock:
                self._present.add(digest)

    def _ensure_entry(self, entry: ActionEntry, step: str) -> None:
        """The remote cache holds ``entry`` (an upstream step's: its outputs and main output)
        under its key once this returns: a node checks which output is an input's main one
        against it. An upstream built here, or by another host whose build differs, is pushed."""
        ex = self.context
        assert ex.remote is not None
        with self._lock:
            if entry.key in self._entries:
                return
        if not ex.remote.holds(entry, step):
            # the scheduler holds the store's shared gc lock; nodes read blobs by digest, none carried
            status = ex.remote.push(entry, ex.store, step, carry=False)
            if status != "uploaded":
                raise StepError(f"the entry of {step} could not be stored in the remote cache {ex.remote.url} "
                                f"({status}); the nodes check the main output of a step's input against it")
        with self._lock:
            self._entries.add(entry.key)

    def _failed(self, spec: StepSpec, result: TaskResult) -> None:
        """The node's report of a failure: the step's own (StepFailed, with its log), or the
        node's (StepError)."""
        node, error = result.node, result.error or "step failed"
        if result.infra:
            raise StepError(f"{spec.id} could not build on node {node}: {error}")
        failed = ChildResult(ok=False, error=f"{error} (on node {node})", expected=result.expected,
                             repeats=result.repeats)
        raise StepFailed(failed, result.log.encode())

    def _accept(self, spec: StepSpec, key: str, ingredients: dict[str, Any], result: TaskResult, *,
                download: bool) -> ActionEntry:
        """The node's entry, validated as a fetched remote entry is, its blobs fetched here
        when ``download``. The node stored them and the entry in the remote before it answered,
        so a later step's task need not send them again."""
        from optbuild.store.remote import Rejected, decode_entry

        ex = self.context
        assert ex.remote is not None
        self._connect()
        node, data = result.node, result.entry
        if not isinstance(data, str):
            raise StepError(f"node {node} returned no entry for {spec.id}")
        try:
            entry = decode_entry(data.encode(), key, ex.remote.store.signing_key)
        except Rejected as exc:
            raise StepError(f"the entry that node {node} returned for {spec.id} was rejected: {exc}") from None
        wrong = [what for what, ok in (("key material", entry.ingredients == ingredients),
                                       ("step", entry.step == spec.id), ("kind", entry.kind == spec.kind),
                                       ("main output", entry.primary == spec.step.primary_output)) if not ok]
        if wrong:
            raise StepError(f"the entry that node {node} returned for {spec.id} was rejected: its "
                            f"{', '.join(wrong)} differ from what was asked")
        with self._lock:
            self._present.update(entry.blob_digests())
            self._entries.add(entry.key)
        if not download:
            return entry
        fetched = ex.remote.fetch(entry, ex.store, spec.id, hit=False)  # built for this run, not a hit
        if fetched is None:
            raise StepError(f"the outputs that node {node} built for {spec.id} could not be fetched: "
                            f"{ex.remote.miss_reason(key) or 'see the warnings'}")
        return fetched


def _relative(path: Path, root: Path, spec: StepSpec) -> str:
    """``path`` relative to the project root: only the project's files travel to the nodes."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        raise StepError(f"{spec.id} reads {path}, which lies outside the project {root}: the dask executor "
                        "sends only files under the project's folder to its nodes") from None


def _shown(resources: dict[str, float]) -> str:
    return ", ".join(name for name in resources if name != "optbuild") or "optbuild"
