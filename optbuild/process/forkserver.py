"""A fork server ("zygote"): imports a step's heavy tools once, then forks a child per step.

    python -m optbuild.process.forkserver CONTROL_FD BUILDER_PID [--watch FD] MODULE...

A fresh Python process per step pays for importing torch, onnx and pydantic every time
(seconds each); a child forked from a process that already holds them starts in
milliseconds, and is still its own process: a native crash, a leaked global, a user module
of the same name as another recipe's, all end with the child. Each child runs exactly what
``python -m optbuild.process.child`` runs (``optbuild.process.child.serve``), with the builder's
environment and working directory, its output going to the step's log.

Why forking here is safe, where forking a process that runs threads is not (a lock held by
another thread at the moment of fork stays locked forever in the child): **every fork
happens from a process with exactly one thread**, and that is checked before each fork,
never assumed. The zygote imports modules and does nothing else: no inference session, no
tensor operation, no CUDA (``torch.cuda`` is never touched, so every child initialises
CUDA for itself), no thread of its own. Of the libraries it preloads, numpy's OpenBLAS
starts a thread pool on import, but stops it in its own ``pthread_atfork`` handler and
restarts it lazily: so the first fork (a probe, at start) leaves the zygote with one thread
for good. onnxruntime is never preloaded: its import starts a thread that lives through a
fork (measured with onnxruntime 1.2x); a child imports it for itself, as the step would in
a fresh process. If a preloaded module leaves a thread running after the probe, the zygote
says so and exits, and the builder starts fresh processes for those steps instead.

Besides its tool set, the zygote imports the module that implements a step's kind (a
built-in step module, a project's kinds file) when the first step of that kind comes, so
that children find the class loaded; never a model module or a data callable, which a step
imports while it runs, in its child.

Protocol, over Unix SOCK_SEQPACKET sockets (one message each): the builder sends on the
control socket a JSON request with one file descriptor attached, a socket of its own for
this child; the zygote answers on it ``{"pid": N}`` (with a pidfd, where the kernel has
them, so the builder can kill the child without a pid-reuse race) or ``{"error": ...}``,
and once the child has exited, ``{"exit": CODE}`` (negative: killed by that signal).

A request with a second socket attached and no spec forks a **worker**, for a kind whose
steps may share a process (``Step.shares_process``): the builder sends it one step at a
time on that socket (``{"spec", "log", "cwd", "env"}``), and it answers ``more`` (or
``last``) when the step's result is written. Each step gets its own log, the builder's working
directory and environment as they are then, and a fresh numpy seed; what else a step
changes (a module's global) reaches the next, which is what such a kind promises not to
do. The worker exits when the builder closes the socket (at the end of each build), after
as many steps as the request says (``"steps"``), or when a step's process fails rather
than its step.

The zygote dies with the builder, and its children with it (``PR_SET_PDEATHSIG``), so a
killed builder leaves nothing running. Ctrl-C reaches the children, not the zygote.

With ``--watch FD`` (a build server's fork servers, which outlive a build), the zygote
appends to that file one JSON line per batch of modules it imported: ``{"ref": NS, "sigs":
{file: [mtime_ns, ctime_ns, size, inode]}}``, NS being when the imports began; the server
restarts the zygote when any file changed since, or changed too close to NS to vouch for
what was imported (``optbuild.process.pool.ForkServer.why_stale``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from optbuild.common.forked import run_and_exit

# Always preloaded: what every worker imports before it runs a step (cheap, thread-free).
CORE = ("ctypes", "faulthandler", "logging", "pydantic", "optbuild.process.child", "optbuild.steps.registry",
        "optbuild.steps.base", "optbuild.common.fingerprint", "optbuild.common.errors")
MAX_MESSAGE = 1 << 20  # bytes: a request holds a path, a folder and the environment


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(modules: list[str]) -> list[str]:
    """Import ``modules`` (and CORE); the ones that failed, which children import (and fail
    on, with the step's own error message) for themselves."""
    failed = []
    for name in (*CORE, *modules):
        try:
            importlib.import_module(name)
        except Exception:  # an import may fail any way; the step's child will say how
            failed.append(name)
    return failed


def single_threaded_after_probe() -> str | None:
    """Fork a child that exits at once, so that libraries that stop their threads at a fork
    (OpenBLAS) do so; None if the zygote is then down to one thread, else what runs."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if thread_count() == 1:
        return None
    names = sorted(_thread_name(t) for t in os.listdir("/proc/self/task") if int(t) != os.getpid())
    return f"{len(names)} thread(s) besides the main one keep running after a fork ({', '.join(names)})"


def _thread_name(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return tid


class ModuleWatch:
    """Writes the signatures of the modules' files imported since the last call (see --watch)."""

    def __init__(self, fd: int):
        self.out = os.fdopen(fd, "a", encoding="utf-8")
        self.seen: set[str] = set()

    def record(self, ref_ns: int) -> None:
        from optbuild.common.signatures import module_files, signature

        sigs = {}
        for path in module_files(stdlib=True):
            if path not in self.seen:
                self.seen.add(path)
                try:
                    sigs[path] = signature(path)
                except OSError:  # unreadable: as gone, so that it restarts the server
                    sigs[path] = "absent"
        if sigs:
            self.out.write(json.dumps({"ref": ref_ns, "sigs": sigs}) + "\n")
            self.out.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.out.close()


class Zygote:
    def __init__(self, control: socket.socket, builder: int, watch: ModuleWatch | None = None):
        self.control = control
        self.builder = builder
        self.watch = watch
        self.children: dict[int, socket.socket] = {}  # pid -> the builder's socket for it
        self.warmed: set[str] = set()  # step implementations imported
        self.wakeup_r, self.wakeup_w = os.pipe()

    def serve(self) -> None:
        """Answer requests until the builder closes the control socket."""
        os.set_blocking(self.wakeup_w, False)
        signal.set_wakeup_fd(self.wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd fires
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ, "request")
        selector.register(self.wakeup_r, selectors.EVENT_READ, "child")
        open_ = True
        while open_ or self.children:
            for key, _ in selector.select():
                if key.data == "child":
                    os.read(self.wakeup_r, 4096)
                    self._reap()
                elif not self._request():
                    selector.unregister(self.control)
                    open_ = False
            self._reap()

    def _request(self) -> bool:
        """Handle one request; False when the builder has closed the control socket."""
        try:
            message, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE, 2)
        except ConnectionError:
            return False
        if not message:
            for fd in fds:
                os.close(fd)
            return False
        if not fds:
            return True
        reply = socket.socket(fileno=fds[0])
        jobs = socket.socket(fileno=fds[1]) if len(fds) > 1 else None  # a worker's (see _run_jobs)
        request = json.loads(message)
        self._warm(request["implementation"])
        if (threads := thread_count()) != 1:  # checked right before the fork, whatever started one
            _send(reply, {"error": f"the fork server runs {threads} threads (after importing "
                                   f"{request['implementation']}); forking is unsafe"})
            reply.close()
            if jobs is not None:
                jobs.close()
            return True
        pid = os.fork()
        if pid == 0:
            self._child(request, reply, jobs)
        if jobs is not None:
            jobs.close()  # the worker's alone, so that it is not inherited by the next child
        self.children[pid] = reply
        pidfd = _pidfd(pid)
        _send(reply, {"pid": pid}, [pidfd] if pidfd is not None else [])
        if pidfd is not None:
            os.close(pidfd)
        return True

    def _warm(self, implementation: str) -> None:
        """Import the step kind's class, once (``step_class`` caches it for the children)."""
        if implementation not in self.warmed:
            self.warmed.add(implementation)
            ref = time.time_ns()
            from optbuild.steps.registry import step_class

            with contextlib.suppress(Exception):  # the child fails on it, with the step's message
                step_class(implementation)
            if self.watch is not None:
                self.watch.record(ref)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            reply = self.children.pop(pid, None)
            if reply is not None:
                _send(reply, {"exit": os.waitstatus_to_exitcode(status)})
                reply.close()

    def _child(self, request: dict[str, Any], reply: socket.socket, jobs: socket.socket | None) -> NoReturn:
        """In the forked child: become a fresh worker, run the step (a worker: the steps sent
        on ``jobs``), exit. Never returns into the zygote's loop, whatever happens."""
        run_and_exit(lambda: self._serve(request, reply, jobs), failed=1)

    def _serve(self, request: dict[str, Any], reply: socket.socket, jobs: socket.socket | None) -> None:
        for sock in (self.control, reply, *self.children.values()):
            sock.close()
        if self.watch is not None:
            self.watch.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wakeup_r)
        os.close(self.wakeup_w)
        for signum, handler in ((signal.SIGCHLD, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                                (signal.SIGINT, signal.SIG_IGN)):  # Ctrl-C: the builder cancels the step
            signal.signal(signum, handler)
        _unbuffered_output()  # on file descriptors 1 and 2, which each step points at its log
        if jobs is None:
            _run_job(request)
        else:
            _run_jobs(jobs, request["steps"])


def _run_job(job: dict[str, Any]) -> None:
    """Run the step of ``job`` (its spec, log, working directory and environment), as
    ``python -m optbuild.process.child SPEC`` would."""
    from optbuild.process import child as worker

    _output_to(job["log"])
    set_environment(job["env"])
    os.chdir(job["cwd"])
    _fresh_random_state()
    sys.argv = [worker.__file__, job["spec"]]  # as ``python -m optbuild.process.child`` has it
    worker.serve(job["spec"], parent=os.getppid())


def _run_jobs(jobs: socket.socket, steps: int) -> None:
    """A worker (``Step.shares_process``): run at most ``steps`` steps that come on
    ``jobs``, one after another, answering ``more`` after each (``last`` after the last,
    and it exits), until the builder closes ``jobs``. A step whose process fails (not the
    step: its process) ends the worker, as it would end a child of its own."""
    for done in range(1, steps + 1):
        message = jobs.recv(MAX_MESSAGE)
        if not message:
            return
        _run_job(json.loads(message))
        jobs.send(b"more" if done < steps else b"last")


def _output_to(log: str) -> None:
    """stdout and stderr (file descriptors 1 and 2) into the step's log."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _unbuffered_output() -> None:
    """``sys.stdout`` and ``sys.stderr`` unbuffered (as ``python -u``), so that what a step
    printed reaches the log in order even when it then crashes; the logging the zygote set
    up (``child.capture_diagnostics``) writes to this ``sys.stderr``."""
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                  errors="backslashreplace")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sys.stderr)


def set_environment(env: dict[str, str]) -> None:
    """``os.environ`` made equal to ``env`` (a child's: the builder's as it is now, which may
    have changed since the zygote started; a build server's: its client's, then its own
    again); only what differs is set, each change being a putenv."""
    for name in set(os.environ) - set(env):
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _fresh_random_state() -> None:
    """As a fresh process would have: numpy's global generator, seeded once when the zygote
    imported it, reseeded; and Python's ``random``, which reseeds itself at fork, reseeded
    for a worker's next step."""
    for name in ("numpy.random", "random"):
        module = sys.modules.get(name)
        if module is not None:
            module.seed()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # an old kernel: the builder signals by pid
        return None


def _send(sock: socket.socket, doc: dict[str, Any], fds: list[int] | None = None) -> None:
    try:
        socket.send_fds(sock, [json.dumps(doc).encode()], fds or [])
    except OSError:  # the builder gave up on this child (cancelled): nothing to tell
        pass


def _die_with(parent: int) -> None:
    from optbuild.process.child import die_with_parent

    die_with_parent(parent)


def main() -> None:
    started = time.time_ns()
    control = socket.socket(fileno=int(sys.argv[1]))
    builder = int(sys.argv[2])
    modules = sys.argv[3:]
    watch = None
    if modules[:1] == ["--watch"]:
        watch, modules = ModuleWatch(int(modules[1])), modules[2:]
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the builder's to handle
    _die_with(builder)
    failed = preload(modules)
    from optbuild.process.child import capture_diagnostics

    capture_diagnostics()  # once, for every child: on file descriptor 2, which each points at its log
    if watch is not None:
        watch.record(started)
    gc.freeze()  # the preloaded objects stay shared with the children, not copied on write
    unsafe = single_threaded_after_probe()
    _send(control, {"ready": unsafe is None, "unsafe": unsafe, "failed": failed})
    if unsafe is None:
        Zygote(control, builder, watch).serve()


if __name__ == "__main__":
    main()
