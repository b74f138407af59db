"""Starts the process that runs a step: a child of a fork server that has already imported
the step's tools (``optbuild.process.forkserver``) where it can, a fresh ``python -m optbuild.process.child``
where it cannot (not Linux, ``[build] preload = false``, or a fork server that failed).

Either way the step runs in a process of its own and its runner (``runstep``) sees the same
thing: a ``StepProcess`` to poll for its exit code, or to kill. A kind that declares
``shares_process`` runs its steps in workers instead, forked once and reused for the
build's next steps of that kind (a fork costs a few milliseconds of CPU a step, mostly in
copying the pages the child touches); a worker is a ``StepProcess`` too, whose "exit code"
is 0 when it says its step is done. One fork server per set of
preloaded modules, started on first need and shared by the steps whose ``preload`` it
covers (a quantize step, which preloads onnx, forks from the server that holds torch and
onnx when that one is already running); all end with the build.

``optbuild build`` starts the server of ``ONNX_TOOLS``, which most step kinds preload, before
it even imports its own modules (``ProcessPool.speculative``): it is ready when the first
step is, instead of after it. One that no step used is killed at the end.

A build server (``optbuild.cli.buildserver``) keeps its pool between builds: a ``ServedPool``,
whose ``close`` ends a build's use of it and ``shutdown`` ends its servers. Its fork servers
are started from one thread that lives as long as the pool (a server dies with the thread
that started it: PR_SET_PDEATHSIG), under the environment the pool was made for, and report
the files of the modules they import (``--watch``) so that a changed one restarts them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("optbuild")

READY_TIMEOUT_S = 600.0  # importing torch on a loaded host can take a minute; never forever
MAX_MESSAGE = 4096


class StepProcess(Protocol):
    def poll(self, timeout: float | None) -> int | None:
        """The exit code (negative: the signal that killed it), waiting at most ``timeout``
        seconds (None: until it exits); None if it still runs."""

    def kill(self) -> None: ...


class FreshProcess:
    """``python -u -m optbuild.process.child SPEC``: unbuffered, so that what a step printed reaches
    the log in order even when it then crashes."""

    def __init__(self, spec: Path, log_path: Path, cwd: Path):
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "optbuild.process.child", str(spec)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)

    def poll(self, timeout: float | None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


class ForkedChild:
    """A child of a fork server; its exit code arrives on ``sock``. A server that died
    first (killed with it: PR_SET_PDEATHSIG) reads as SIGKILL."""

    def __init__(self, sock: socket.socket, pid: int, pidfd: int | None):
        self.sock, self.pid, self.pidfd = sock, pid, pidfd
        self.code: int | None = None

    def poll(self, timeout: float | None) -> int | None:
        if self.code is None and select.select([self.sock], [], [], timeout)[0]:
            try:
                message = self.sock.recv(MAX_MESSAGE)
            except OSError:
                message = b""
            self.code = json.loads(message)["exit"] if message else -signal.SIGKILL
            self._close()
        return self.code

    def kill(self) -> None:
        """SIGKILL through the pidfd (no pid-reuse race) where there is one."""
        if self.code is not None:
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def _close(self) -> None:
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _job(spec: Path, log_path: Path, cwd: Path) -> dict[str, Any]:
    """What a forked child needs to run a step, as a fresh process would: its spec, its log,
    and the builder's working directory and environment as they are now."""
    return {"spec": str(spec), "log": str(log_path), "cwd": str(cwd), "env": dict(os.environ)}


class Worker:
    """A child of a fork server that runs steps of one kind one after another
    (``Step.shares_process``): each step's end arrives on ``jobs``, the worker's own exit as
    a ``ForkedChild``'s does."""

    def __init__(self, child: ForkedChild, jobs: socket.socket):
        self.child, self.jobs = child, jobs
        self.more = True  # it takes another step after the one it runs

    def run(self, spec: Path, log_path: Path, cwd: Path, ended: Callable[[Worker], None]) -> WorkerJob | None:
        """The worker running ``spec`` (``ended`` called with it once the step ended); None
        if it ended while idle."""
        try:
            self.jobs.send(json.dumps(_job(spec, log_path, cwd)).encode())
        except OSError:
            self.end()
            return None
        return WorkerJob(self, ended)

    def end(self) -> None:
        """Close its end of ``jobs``: an idle worker exits; one that has not within a second
        (running a step) is killed."""
        self.more = False
        self.jobs.close()
        if self.child.poll(1.0) is None:
            self.child.kill()
            self.child.poll(None)


class WorkerJob:
    """One step that a ``Worker`` runs, seen as a ``StepProcess``: 0 once the worker says it
    is done, the worker's exit code if it died first; ``ended`` is called then, once."""

    def __init__(self, worker: Worker, ended: Callable[[Worker], None]):
        self.worker, self.ended = worker, ended
        self.code: int | None = None

    def poll(self, timeout: float | None) -> int | None:
        if self.code is None and (code := self._poll(timeout)) is not None:
            self.code = code
            self.ended(self.worker)
        return self.code

    def _poll(self, timeout: float | None) -> int | None:
        worker = self.worker
        ready = select.select([worker.jobs, worker.child.sock], [], [], timeout)[0]
        if not ready:
            return None
        message = b""
        if worker.jobs in ready:
            with contextlib.suppress(OSError):
                message = worker.jobs.recv(MAX_MESSAGE)
        if message:
            worker.more = message == b"more"  # b"last": it exits
            return 0
        worker.more = False  # it died: its exit code comes from the server
        return worker.child.poll(None)

    def kill(self) -> None:
        self.worker.more = False
        self.worker.child.kill()


class ForkServer:
    """One ``optbuild.process.forkserver`` process, which preloads ``modules``."""

    def __init__(self, modules: frozenset[str], cwd: Path, *, env: dict[str, str] | None = None,
                 watch: bool = False):
        self.modules = modules
        self.cwd = cwd
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 (the server's stderr: shown if it fails)
        # what it imported, when (--watch): only for a pool that outlives a build
        self.watched = tempfile.TemporaryFile() if watch else None  # noqa: SIM115
        extra = ["--watch", str(self.watched.fileno())] if self.watched is not None else []
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "optbuild.process.forkserver", str(theirs.fileno()), str(os.getpid()),
                 *extra, *sorted(modules)],
                pass_fds=(theirs.fileno(), *([self.watched.fileno()] if self.watched is not None else [])),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.errors, cwd=cwd, env=env)
        self.usable: bool | None = None  # None: not ready yet
        self._ready_lock = threading.Lock()

    def ready(self, cancel: threading.Event) -> bool | None:
        """Whether the server is ready to fork (waiting for it the first time); None if
        ``cancel`` was set while waiting."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready_lock.acquire(timeout=0.05):
            if cancel.is_set():
                return None
        try:
            while self.usable is None:
                if cancel.is_set():
                    return None
                if select.select([self.control], [], [], 0.05)[0]:
                    self._hello(self.control.recv(MAX_MESSAGE))
                elif time.monotonic() > deadline:
                    self._give_up(f"it was not ready after {READY_TIMEOUT_S:.0f} s")
                    self.kill()
            return self.usable
        finally:
            self._ready_lock.release()

    def _hello(self, message: bytes) -> None:
        if not message:
            self._give_up(f"it exited while importing them{self._stderr_tail()}")
            return
        hello = json.loads(message)
        if hello["ready"]:
            self.usable = True
        else:
            self._give_up(hello["unsafe"])

    def fork(self, spec: Path, log_path: Path, implementation: str, cwd: Path) -> ForkedChild | None:
        """A child running ``spec`` in ``cwd``; None if the server cannot fork (it died, or
        found itself unsafe): the caller starts a fresh process."""
        return self._fork({"implementation": implementation, **_job(spec, log_path, cwd)})

    def fork_worker(self, implementation: str, steps: int) -> Worker | None:
        """A child that runs up to ``steps`` steps of the kind ``implementation`` as they are
        sent to it (``Worker.run``); None as for ``fork``."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            child = self._fork({"implementation": implementation, "steps": steps}, theirs)
        if child is None:
            mine.close()
            return None
        return Worker(child, mine)

    def _fork(self, request: dict[str, Any], jobs: socket.socket | None = None) -> ForkedChild | None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with theirs:
                fds = [theirs.fileno()] + ([jobs.fileno()] if jobs is not None else [])
                socket.send_fds(self.control, [json.dumps(request).encode()], fds)
            message, fds, _, _ = socket.recv_fds(mine, MAX_MESSAGE, 1)
        except OSError:
            message, fds = b"", []
        answer: dict[str, Any] = json.loads(message) if message else {"error": f"it exited{self._stderr_tail()}"}
        if "error" in answer:
            mine.close()
            self._give_up(answer["error"])
            return None
        return ForkedChild(mine, answer["pid"], fds[0] if fds else None)

    def why_stale(self, racy_ns: int) -> str | None:
        """Why this server must not fork another step: it ended (None when it failed
        before: its steps start fresh processes), or a file of a module it imported changed
        since, or changed within ``racy_ns`` of the import (None without --watch)."""
        if self.usable is not False and self.proc.poll() is not None:
            return "a fork server ended"
        if self.watched is None:
            return None
        from optbuild.common.signatures import changed_within, signature

        self.watched.seek(0)
        for line in self.watched.read().decode(errors="replace").splitlines():
            try:
                batch = json.loads(line)
            except ValueError:
                return "a fork server's record of its modules is damaged"
            for path, sig in batch["sigs"].items():
                if changed_within(sig, batch["ref"], racy_ns):
                    return f"{path} changed within {racy_ns / 1e9:g} s of being imported"
                if signature(path) != sig:
                    return f"{path} changed since it was imported"
        return None

    def _give_up(self, why: str) -> None:
        if self.usable is not False:
            self.usable = False
            log.warning("preloading %s for steps failed: %s; those steps start fresh processes "
                        "(slower; set [build] preload = false to always do so)",
                        ", ".join(sorted(self.modules)) or "optbuild", why)

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            self.errors.seek(0)
            lines = self.errors.read().decode(errors="replace").strip().splitlines()
            if lines:
                return ":\n    " + "\n    ".join(lines[-10:])
        return ""

    def close(self) -> None:
        """Let the server finish (it exits when its control socket closes); kill it if it
        does not, or if it never got ready (it may still be importing)."""
        self.control.close()
        if self.usable is None:
            self.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        self.errors.close()

    def kill(self) -> None:
        """Its children die with it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ProcessPool:
    """Where ``runstep`` gets the processes that run steps."""

    worker_steps = 500  # steps a worker runs before it exits: what a kind leaks stays bounded

    def __init__(self, cwd: Path, *, preload: bool = True):
        self.cwd = cwd
        self.preload = preload and sys.platform.startswith("linux") and hasattr(socket, "send_fds")
        self._servers: list[ForkServer] = []
        self._learned: dict[str, frozenset[str]] = {}  # kind -> the heavy tools its steps imported (``learn``)
        self._idle: dict[tuple[ForkServer, str], list[Worker]] = {}  # (server, kind) -> its workers between steps
        self._lock = threading.Lock()

    @classmethod
    def speculative(cls, root: str | None) -> ProcessPool | None:
        """A pool for the project at ``root`` whose ONNX_TOOLS server starts now (None
        without a root): for a build, before the builder's own imports and planning."""
        from optbuild.steps.base import ONNX_TOOLS

        if root is None:
            return None
        pool = cls(Path(root))
        pool.prewarm(ONNX_TOOLS)
        return pool

    def fits(self, cwd: Path, *, preload: bool) -> bool:
        """Whether this pool serves a build of the project at ``cwd`` with ``preload``."""
        return self.cwd.resolve() == cwd.resolve() and self.preload == preload

    def prewarm(self, modules: tuple[str, ...]) -> None:
        """Start the fork server that steps preloading ``modules`` will use, if none runs:
        it imports while other steps build."""
        if self.preload:
            self._server_for(frozenset(modules))

    def start(self, spec: Path, log_path: Path, implementation: str, modules: tuple[str, ...],
              cancel: threading.Event, cwd: Path | None = None, *, shares: bool = False) -> StepProcess | None:
        """A process running the step ``spec`` describes (of the kind ``implementation``,
        preloading ``modules``) in ``cwd`` (default: the pool's); None if ``cancel`` was set
        first. With ``shares`` (``Step.shares_process``), a worker that ran a step of that
        kind and is idle now runs it, else a new worker."""
        cwd = self.cwd if cwd is None else cwd
        if self.preload:
            server = self._server_for(frozenset(modules) | self._learned.get(implementation, frozenset()))
            ready = server.ready(cancel)
            if ready is None:
                return None
            if ready and shares and (job := self._worker_job(server, implementation, spec, log_path, cwd)):
                return job
            if ready and not shares and (child := server.fork(spec, log_path, implementation, cwd)) is not None:
                return child
        return FreshProcess(spec, log_path, cwd)

    def _worker_job(self, server: ForkServer, implementation: str, spec: Path, log_path: Path,
                    cwd: Path) -> StepProcess | None:
        """``spec`` run by an idle worker of ``server`` for ``implementation``, or by a new
        one (None if none can be forked); the worker is idle again once the step ends."""
        with self._lock:
            idle = self._idle.setdefault((server, implementation), [])
        while True:
            with self._lock:
                worker = idle.pop() if idle else None
            if worker is None:
                worker = server.fork_worker(implementation, self.worker_steps)
                if worker is None:
                    return None
            job = worker.run(spec, log_path, cwd, ended=lambda w: self._step_ended(w, idle))
            if job is not None:
                return job

    def _step_ended(self, worker: Worker, idle: list[Worker]) -> None:
        if worker.more:
            with self._lock:
                idle.append(worker)
        else:
            worker.end()

    def _end_workers(self) -> None:
        with self._lock:
            workers = [w for idle in self._idle.values() for w in idle]
            self._idle.clear()
        for worker in workers:
            worker.end()

    def learn(self, implementation: str, imported: list[str]) -> None:
        """The steps of the kind ``implementation`` import the heavy tools ``imported``
        themselves (``ChildResult.imported``): its next steps fork from a server that
        preloaded them, as if the kind declared them in ``preload``. Only tools of
        ``PRELOADABLE`` count: a module whose import starts a thread would make the server
        refuse to fork."""
        from optbuild.steps.base import PRELOADABLE

        if tools := PRELOADABLE.intersection(imported):
            with self._lock:
                self._learned[implementation] = self._learned.get(implementation, frozenset()) | tools

    def _server_for(self, modules: frozenset[str]) -> ForkServer:
        """The smallest running server that preloads all of ``modules``, a new one if none;
        for steps that preload nothing, one that preloaded nothing (a server holding numpy and
        onnx is a bigger process to fork, for steps that use neither)."""
        with self._lock:
            fitting = [s for s in self._servers if s.usable is not False and s.modules >= modules
                       and (modules or not s.modules)]
            if fitting:
                return min(fitting, key=lambda s: len(s.modules))
            broken = [s for s in self._servers if s.usable is False and s.modules == modules]
            if broken:  # failed before: fresh processes for these steps from now on
                return broken[0]
            server = self._new_server(modules)
            self._servers.append(server)
            return server

    def _new_server(self, modules: frozenset[str]) -> ForkServer:
        return ForkServer(modules, self.cwd)

    def close(self) -> None:
        """End every worker and server (idempotent)."""
        self._end_workers()
        with self._lock:
            for server in self._servers:
                server.close()
            self._servers.clear()


class ServedPool(ProcessPool):
    """A pool that outlives builds: a build server's (``optbuild.cli.buildserver``), whose fork
    servers report the files of the modules they import (``watch``), and a Dask node's
    (``optbuild.distributed.task``), restarted with the node when its code changes."""

    def __init__(self, cwd: str | Path, *, env: dict[str, str], quiet_env: tuple[str, ...] = (),
                 watch: bool = True):
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(Path(cwd))
        self.env = dict(env)
        self.quiet_env = quiet_env
        self.watch = watch
        # one long-lived thread starts every fork server: they die with it (PR_SET_PDEATHSIG)
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="optbuild-spawner")

    def _new_server(self, modules: frozenset[str]) -> ForkServer:
        return self._spawner.submit(ForkServer, modules, self.cwd, env=self.env, watch=self.watch).result()

    def close(self) -> None:
        """A build is done with the pool: its workers end (no step of a later build runs in a
        process of this one's), its servers stay (``shutdown`` ends them)."""
        self._end_workers()

    def shutdown(self) -> None:
        super().close()
        self._spawner.shutdown(wait=True)

    def why_stale(self, env: dict[str, str]) -> str | None:
        """Why the pool cannot serve a build under ``env`` (``quiet_env`` aside): another
        environment than its servers were started under, a server that ended, or a module
        file that changed; None if it can."""
        from optbuild.common.signatures import RACY_NS

        if {k: v for k, v in self.env.items() if k not in self.quiet_env} != \
                {k: v for k, v in env.items() if k not in self.quiet_env}:
            return "the build's environment differs from the one they were started under"
        with self._lock:
            servers = list(self._servers)
        for server in servers:
            if (why := server.why_stale(RACY_NS)) is not None:
                return why
        return None

    def describe(self) -> list[dict[str, object]]:
        with self._lock:
            return [{"modules": sorted(s.modules), "pid": s.proc.pid, "usable": s.usable}
                    for s in self._servers]
