"""The Dask task that builds one step on a node: ``run_task(doc)``.

``doc`` is small JSON made by the coordinator (``builder.DaskBuilder``): the step (its kind's
implementation, main output, recipe folder), the digests of its input files (by
project-relative path) and of its upstream outputs, its key and key material, the URL of
the remote cache the coordinator uses and whether it accepts only signed entries. The node
trusts none of it (anyone who reaches the scheduler can send a task):

1. it reads the key material as an ``Action`` (``process.action``) and refuses a task whose
   key is not that action's, whose files and upstream outputs are not those the action holds,
   whose kind is implemented elsewhere than the node's registry says, whose host fields are
   not this node's, or whose tool versions are not the node's; the step runs from that action
   as a local build runs it (``Action.run_params``: an upstream step's name, which is not
   content, from its inputs);
2. the remote cache and the signing key are the node's own (``nodeconfig.NodeConfig``: ``optbuild
   worker --remote``, its environment): a task only names the remote it expects, and a node
   that stores elsewhere, or holds no key where signed entries are wanted, refuses it;
3. it fetches every blob it lacks from the remote CAS into the node's blob cache (``optbuild
   worker --cache``, trimmed after each task; with none, a throw-away store), each checked
   against its digest and size (so the files laid out are those the key names), and lays
   them out in a private scratch folder (a mirror of the project's input files, one folder
   per upstream output). Every name must be a safe relative path
   (``store.entry.check_relative_path``) and every file is written through
   ``paths.confined``: nothing lands outside the scratch folder. The key holds an upstream
   step's outputs but not which of them is the main one the step reads: the node reads the
   upstream's entry from the remote cache (signed with its key, when it has one) and refuses
   a task whose upstream outputs or main output are not that entry's;
4. it runs the step in its own process, as a local build does (``process.runstep``): a child
   of one of the node's fork servers, which have imported the step's tools once (``node_pool``; a fresh
   ``python -m optbuild.process.child`` where they cannot); a native crash kills that process,
   not the node. The signing key's variable is not in that process's environment;
5. it stores the outputs and the log in the node's cache and the remote CAS, then the action
   entry (blobs first, so the remote never names a blob it lacks; a node killed half-way
   leaves no entry), and returns the entry's bytes (signed with the node's key, if it has one).

The task is a ``taskspec.Task``, sent as a dict and read back (its shape checked) here. It
returns a ``taskspec.TaskResult`` as a dict, and never raises for a step's failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.distributed.taskspec import BadTask, Task, TaskResult

if TYPE_CHECKING:
    from optbuild.common.events import Event
    from optbuild.distributed.nodeconfig import NodeConfig
    from optbuild.process.action import Action

LOG_LIMIT = 256 << 10  # bytes of a failed step's log sent back (its tail)


_POOL: Any = None
_STORES: dict[Path, Any] = {}  # the node's blob cache, by folder
_NODE_LOCK = threading.Lock()  # the task threads share the pool and the stores


def node_pool(node: NodeConfig) -> Any:
    """The node's fork servers (a ``pool.ServedPool``), shared by its task threads and
    kept for the node's life (they die with it); a fresh pool when one of them ended. Not
    watched for changed modules: a node runs the optbuild it was started with, and is
    restarted to run another. Steps do not see the node's signing key in their environment."""
    global _POOL
    from optbuild.process.pool import ServedPool

    env = {name: value for name, value in os.environ.items() if name != node.remote.signing_key_env}
    with _NODE_LOCK:
        if _POOL is not None and _POOL.why_stale(_POOL.env) is not None:
            _POOL.shutdown()
            _POOL = None
        if _POOL is None:
            _POOL = ServedPool(_scratch_root() or tempfile.gettempdir(), env=env, watch=False)
        return _POOL


class TaskError(Exception):
    """The node could not run the step (a transfer, a bad spec): not the step's own failure."""


class Refused(TaskError):
    """The task is not what its key says, or asks for what this node does not offer."""


def _this_worker() -> Any:
    """The Dask worker running this task; None outside one."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _scratch_root() -> str | None:
    return getattr(_this_worker(), "local_directory", None)


def run_task(doc: dict[str, Any]) -> dict[str, Any]:
    """The task the coordinator submits: ``run_on`` this worker's node."""
    node = getattr(_this_worker(), "optbuild_node", None)
    if node is None:
        return _answer(ok=False, error="this Dask worker was not started by `optbuild worker`", infra=True)
    return run_on(doc, node)


def run_on(doc: dict[str, Any], node: NodeConfig) -> dict[str, Any]:
    """Build the step ``doc`` describes as ``node``, in a scratch folder that goes with it."""
    tmp = Path(tempfile.mkdtemp(prefix="optbuild-step-", dir=_scratch_root()))
    try:
        return _answer(**_run(Task.read(doc), tmp, node), node=node.name)
    except BadTask as exc:
        return _answer(ok=False, error=f"refused: {exc}; nothing was built or stored", infra=True, node=node.name)
    except BadOutputs as exc:  # the step's outputs break the rules: as a local build reports it
        return _answer(ok=False, error=str(exc), expected=True, node=node.name)
    except Refused as exc:
        return _answer(ok=False, error=f"refused: {exc}; nothing was built or stored", infra=True, node=node.name)
    except TaskError as exc:
        return _answer(ok=False, error=str(exc), infra=True, node=node.name)
    except Exception as exc:  # the node's fault (its disk, a bug): said, with the node's name
        return _answer(ok=False, error=f"{type(exc).__name__}: {exc}", infra=True, node=node.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _answer(**fields: Any) -> dict[str, Any]:
    """A ``TaskResult`` as the dict Dask carries back."""
    return TaskResult(**fields).model_dump()


class _Warnings:
    """Collects the remote session's warnings: they explain a failed transfer."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def emit(self, event: Event) -> None:
        if event["event"] == "warning":
            self.messages.append(event["message"])


def _place(store_path: Path, root: Path, name: str, what: str) -> Path:
    """Put the blob at ``store_path`` at ``root/name``, proven to stay inside ``root``."""
    from optbuild.common.errors import OptbuildError
    from optbuild.common.links import link_or_copy
    from optbuild.common.paths import confined
    from optbuild.store.entry import EntryError, check_relative_path

    try:
        check_relative_path(name)
        dest = confined(root / name, root, what)
    except (EntryError, OptbuildError) as exc:
        raise TaskError(f"refusing {what} {name!r}: {exc}") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    link_or_copy(store_path, dest)  # blobs are read-only: the step cannot write through a link
    return dest


def _run(task: Task, tmp: Path, node: NodeConfig) -> dict[str, Any]:
    from optbuild.process.runstep import StepFailed, StepRun, run_step
    from optbuild.store.remote import RemoteSession, encode_entry

    action = _action(task)
    _check_implementation(task, action)
    _check_host(action, node)
    _check_tools(action, node.name)
    _check_remote(task, node)
    warnings = _Warnings()
    session = RemoteSession(node.remote, warnings)
    store, cache = _store(tmp, node.cache)
    project = tmp / "project"
    project.mkdir()
    with store.shared_gc_lock():  # a trim by another task waits: the blobs are linked here first
        inputs = _fetch(task, session, store, tmp, project, warnings)
    _check_upstream(task, session)
    implementation = task.implementation
    if (named := task.project_kind) is not None:
        relative, _, cls = named.rpartition(":")
        implementation = f"{_inside(project, relative, 'the step kind')}:{cls}"
    base_dir = _inside(project, task.base_dir, "the recipe folder") if task.base_dir != "." else project
    state = tmp / "state"
    state.mkdir()
    scratch = tmp / "run"
    scratch.mkdir()
    run = StepRun(step_id=task.step, implementation=implementation, action=action, base_dir=base_dir,
                  project_root=project, inputs=inputs, primary=task.primary_output, preload=task.preload,
                  state_dir=state)
    try:
        ran = run_step(run, scratch, node_pool(node), threading.Event(), cwd=tmp)
    except StepFailed as failed:
        result = failed.result
        return {"ok": False, "error": result.error or "step failed", "expected": result.expected,
                "repeats": result.repeats, "log": failed.log[-LOG_LIMIT:].decode(errors="replace"),
                "crossed": session.crossings.own()}
    with store.shared_gc_lock():
        entry = _entry(run, ran, store, node.name)
        status = session.push(entry, store, task.step, carry=False)  # later tasks read its blobs by digest
    if status != "uploaded":
        raise TaskError(_with_warnings(f"the outputs of {task.step} could not be stored in the remote "
                                       f"cache {session.url} ({status})", warnings))
    if cache is not None and store.size_bytes() > cache.max_bytes:
        store.trim_blobs(cache.max_bytes)
    return {"ok": True, "entry": encode_entry(entry, session.store.signing_key).decode("ascii"),
            "crossed": session.crossings.own()}


def _action(task: Task) -> Action:
    """The action this task builds: its key material, typed, refused unless its key
    (``Action.key``) is the task's and the files and upstream outputs the task names (each
    blob checked against its digest by ``_fetch``) are those it holds."""
    from optbuild.builder.keys import describe_changes
    from optbuild.process.action import Action, BadAction

    try:
        action = Action.from_material(task.ingredients)
    except BadAction as exc:
        raise Refused(f"the task is not what its key {task.key[:12]}… says ({exc})") from None
    if action.key != task.key:
        raise Refused(f"the task is not what its key {task.key[:12]}… says (its key is not that of its key material)")
    sent = {"files": {name: blob.digest for name, blob in task.files.items()},
            "inputs": {field: {name: blob.digest for name, blob in upstream.outputs.items()}
                       for field, upstream in task.inputs.items()}}
    if sent != {"files": action.files, "inputs": action.inputs}:
        why = "; ".join(describe_changes(action.material(), {**action.material(), **sent}))
        raise Refused(f"the task is not what its key {task.key[:12]}… says ({why})")
    return action


def _check_upstream(task: Task, session: Any) -> None:
    """Each upstream output the step gets as its input's main one is the main output that the
    upstream's entry in the remote cache names (signed with the node's key, when it has one),
    and that entry names the very outputs the key holds. The key holds the upstream's outputs,
    not which is the main one: without this a task could point the step at another of them."""
    for field, upstream in sorted(task.inputs.items()):
        entry = session.lookup(upstream.key, upstream.step)
        if entry is None:
            why = session.miss_reason(upstream.key) or "it is not there"
            raise Refused(f"the entry of its input {field} ({upstream.step}, key {upstream.key[:12]}…) cannot be "
                          f"read from the remote cache {session.url}: {why}; the node checks which output of "
                          "an upstream step is its main one against that entry")
        if any(entry.outputs.get(name) != output for name, output in upstream.outputs.items()):
            raise Refused(f"the outputs of {upstream.step} are not those its entry {upstream.key[:12]}… "
                          f"in the remote cache names")
        if entry.primary != upstream.primary:
            raise Refused(f"it takes {upstream.primary} as the main output of {upstream.step}, whose entry in "
                          f"the remote cache names {entry.primary}")


def _check_implementation(task: Task, action: Action) -> None:
    """A kind installed on the node runs the implementation the node's registry names for
    it; a project's kind runs the file and class its key names."""
    from optbuild.steps import registry

    implementation, kind = task.implementation, action.kind
    if (named := task.project_kind) is not None:
        if named != action.kind_class:
            raise Refused(f"the task runs {named} of the project, its key names {action.kind_class}")
        return
    try:
        known = registry.implementation_of(kind)
    except KeyError:
        raise Refused(f"step kind {kind!r} is not installed here") from None
    if known != implementation:
        raise Refused(f"step kind {kind!r} is implemented by {known} here, the task asks for {implementation}")


def _check_host(action: Action, node: NodeConfig) -> None:
    """The host fields in the key are this node's (a step keyed for another GPU must not be
    built here); fields the fingerprint does not hold are derived, and not checked here."""
    wrong = [f"{name} = {value!r} in its key, {node.fields[name]!r} here"
             for name, value in sorted(action.host.items())
             if name in node.fields and node.fields[name] != value]
    if wrong:
        raise Refused(f"its key was made for another host ({'; '.join(wrong)})")


def _check_remote(task: Task, node: NodeConfig) -> None:
    """The coordinator fetches what the node stores: both must use one remote cache, and a
    coordinator that accepts only signed entries needs a node that holds the key."""
    mine, wanted = node.remote.display_url.rstrip("/"), task.remote.rstrip("/")
    if mine != wanted:
        raise Refused(f"this node stores into the remote cache {mine}, the build uses {wanted} "
                      f"(start the node with --remote {wanted})")
    if task.signed and node.remote.signing_key is None:
        raise Refused("the build accepts only signed entries and this node holds no signing key (start it "
                      "with the key in $OPTBUILD_SIGNING_KEY, or in the variable --signing-key-env names)")


def _store(tmp: Path, cache: Any) -> tuple[Any, Any]:
    """(the store the task fetches into and stores in, the node's cache settings): the
    node's blob cache, shared by its tasks and kept between them, where it has one
    (``optbuild worker --cache``); else a throw-away store in the scratch folder."""
    from optbuild.common.digest import FileHasher
    from optbuild.store.local import LocalStore

    if cache is None or not cache.max_bytes:
        return LocalStore(tmp / "cas", FileHasher(None)), None
    with _NODE_LOCK:
        store = _STORES.get(cache.root)
        if store is None:
            store = _STORES[cache.root] = LocalStore(cache.root, FileHasher(cache.root / "statcache.sqlite"))
    return store, cache


def _fetch(task: Task, session: Any, store: Any, tmp: Path, project: Path,
           warnings: _Warnings) -> dict[str, Any]:
    """Every input file into ``project`` and every upstream output into a folder of its own,
    from ``store`` where it holds them, else from the remote; the inputs' ArtifactSpecs."""
    from optbuild.process.spec import ArtifactSpec
    from optbuild.store.remote import TransferError

    def blob(digest: str, size: int, label: str) -> Path:
        path = session.download_blob(digest, size, store, label)
        store.mark_used(digest)
        return path

    step_id = task.step
    try:
        session.require_read_write()
        for name, entry in sorted(task.files.items()):
            _place(blob(entry.digest, entry.size, f"{step_id} input {name}"), project, name, "the input file")
        inputs = {}
        for number, (field, upstream) in enumerate(sorted(task.inputs.items())):
            folder = tmp / "inputs" / str(number)
            folder.mkdir(parents=True)
            files = {}
            for name, entry in sorted(upstream.outputs.items()):
                path = blob(entry.digest, entry.size, f"{upstream.step} {name}")
                files[name] = str(_place(path, folder, name, f"the output of {upstream.step}"))
            primary = upstream.primary
            inputs[field] = ArtifactSpec(step=upstream.step, dir=str(folder), files=files,
                                         primary=files.get(primary) if primary else None)
    except TransferError as exc:
        raise TaskError(_with_warnings(str(exc), warnings)) from None
    return inputs


def _check_tools(action: Action, node: str) -> None:
    """The key names the versions of the step's tools that the coordinator has: a node with
    others would file its output under a key that does not describe it."""
    from optbuild.common.toolchain import Toolchain

    tools = Toolchain()
    wanted = action.tools
    wrong = [f"{name} {tools.version(name)} here, {version} in its key" for name, version in sorted(wanted.items())
             if tools.version(name) != version]
    if wrong:
        raise TaskError(f"node {node} has other tool versions than the coordinator ({'; '.join(wrong)}): "
                        "install the same versions on every node")


def _inside(root: Path, relative: str, what: str) -> Path:
    from optbuild.common.errors import OptbuildError
    from optbuild.common.paths import confined
    from optbuild.store.entry import EntryError, check_relative_path

    try:
        check_relative_path(relative)
        return confined(root / relative, root, what)
    except (EntryError, OptbuildError) as exc:
        raise TaskError(f"refusing {what} {relative!r}: {exc}") from None


def _entry(run: Any, ran: Any, store: Any, node: str) -> Any:
    """The action entry of the step's outputs, filed as a local build files them."""
    from optbuild.common.errors import StepError
    from optbuild.process.runstep import file_outputs

    try:
        return file_outputs(run, ran, store, built_on=node)
    except StepError as exc:
        raise BadOutputs(str(exc)) from None


class BadOutputs(TaskError):
    """The step ran but its outputs break the rules (none, a link, no main output)."""


def _with_warnings(message: str, warnings: _Warnings) -> str:
    return "\n".join([message, *(f"  {w}" for w in warnings.messages[-5:])])
