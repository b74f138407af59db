"""The server: it claims the project's address, loads what a build needs, keeps the fork
servers warm, and runs each client's build as ``optbuild.cli.main`` would in the client's
own process (``session.client_context``), declining a client it is stale for."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from optbuild.cli.buildserver.jobcontrol import client_gone, watch_client
from optbuild.cli.buildserver.protocol import (
    LOG,
    MAX_REQUEST,
    QUIET_ENV,
    claim,
    differences,
    identity,
    peer_uid,
    same_user,
    send,
    socket_name,
)
from optbuild.cli.buildserver.session import client_context, fresh_caches
from optbuild.common import signatures

if TYPE_CHECKING:
    from optbuild.api import ServedPool

REFUSED_LOG_S = 60.0  # refused connections: the first logged, then a count per this many seconds
THREADS_GRACE_S = 2.0  # a thread a build started that still runs this long after it ends the server


class _State:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.building = False  # a client's signal now cancels the build (see _on_signal)
        self.build_id = 0
        self.cancelled = False  # this build's client sent its one signal
        self.stop: str | None = None


_STATE: _State | None = None
_POOL: ServedPool | None = None  # the served pool of the build now running (optbuild.cli.build asks for it)


def _serving() -> _State:
    """The state of the server this process runs: ``serve`` sets it before any request."""
    if _STATE is None:
        raise RuntimeError("optbuild's build server is not serving in this process")
    return _STATE


def served_pool(root: str | None):
    """The server's warm ProcessPool when this process is a build server serving ``root``;
    None otherwise (a normal build starts its own)."""
    if _POOL is not None and root is not None and os.path.realpath(root) == os.path.realpath(_POOL.cwd):
        return _POOL
    return None


_LOGFILE = None  # the server's log (its stderr at start; fd 2 is a client's during a build)


def _log(message: str) -> None:
    import time

    out = _LOGFILE or sys.__stderr__
    try:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {message}", file=out, flush=True)
    except (OSError, ValueError):
        pass


def _on_signal(signum: int, frame: object) -> None:
    """SIGINT, SIGTERM, SIGHUP outside a build's own handlers: cancel the build if one runs,
    else stop the server (SIGTERM; it has no terminal whose closing a SIGHUP would mean).
    A client's cancel forwarded just as its build ended lands here too, and stops the
    server: the next build starts a fresh one, which is better than ignoring a real SIGTERM
    that came then."""
    import signal

    state = _STATE
    if state is None:
        return
    if state.building:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        from optbuild.cli import Terminated

        raise Terminated(signum)
    if signum == signal.SIGTERM:
        state.stop = "SIGTERM"


class _RefusedLog:
    """Refused connections in the log: the first, then how many more per ``REFUSED_LOG_S``
    (a client of another user may connect as fast as it likes; the log must not grow so)."""

    def __init__(self) -> None:
        self.count = 0
        self.uids: set[int] = set()
        self.since: float | None = None

    def refused(self, uid: int) -> None:
        import time

        if self.since is None:
            _log(f"refused a connection from uid {uid} (more are counted, once per {REFUSED_LOG_S:g} s)")
            self.since = time.monotonic()
            return
        self.count += 1
        self.uids.add(uid)
        self.flush()

    def flush(self, force: bool = False) -> None:
        """The count so far, when an interval has passed (or ``force``)."""
        import time

        if self.since is None or not self.count or not force and time.monotonic() - self.since < REFUSED_LOG_S:
            return
        uids = ", ".join(str(u) for u in sorted(self.uids))
        _log(f"refused {self.count} more connection(s) from uid {uids} in {time.monotonic() - self.since:.0f} s")
        self.count, self.uids, self.since = 0, set(), time.monotonic()


class Server:
    def __init__(self, root: str, build_dir: str, idle_s: float):
        import time

        self.root, self.build_dir, self.idle_s = root, build_dir, idle_s
        self.started = time.time()
        self.started_ns = time.time_ns()
        self.last_used = time.monotonic()
        self.builds = 0
        self.root_id = _file_id(root)
        self.identity = identity()
        self.sigs: dict[str, object] = {}  # module file -> its signature when first seen
        self.stale: str | None = None  # why the next request must be declined
        self.pool: ServedPool | None = None
        self.refused = _RefusedLog()
        from optbuild.common import noopstamp

        self.host = noopstamp.host_facts()

    # --- staleness ---
    def watch_modules(self, since_ns: int) -> None:
        """Record the signature of every module file and sys.path entry not seen yet; one
        that changed too recently to vouch for what was imported makes the server stale."""
        for path in signatures.module_files(stdlib=True):
            if path in self.sigs:
                continue
            sig = self.sigs[path] = signatures.signature(path)
            if signatures.changed_within(sig, since_ns) and self.stale is None:
                self.stale = f"{path} changed within {signatures.RACY_NS / 1e9:g} s of being loaded"

    def why_stale(self, client: dict) -> str | None:
        from optbuild.common import noopstamp

        if self.stale:
            return self.stale
        if what := differences(self.identity, client.get("identity") or {}):
            return f"the client's setup differs ({'; '.join(what)})"
        if _file_id(self.root) != self.root_id:
            return "the project folder was removed or replaced"
        if noopstamp.host_facts() != self.host:
            return "the host changed (reboot, GPU devices or driver)"
        for path, sig in self.sigs.items():
            if signatures.signature(path) != sig:
                return f"{path} changed since it was loaded"
        return None

    def check_pool(self, env: dict[str, str]) -> None:
        """A fresh pool when the fork servers are stale, dead, or were started under
        another environment."""
        from optbuild.api import ONNX_TOOLS, ServedPool

        if self.pool is not None:
            why = self.pool.why_stale(env)
            if why is None:
                return
            _log(f"restarting the fork servers: {why}")
            self.pool.shutdown()
            self.pool = None
        self.pool = ServedPool(self.root, env=env, quiet_env=QUIET_ENV)
        self.pool.prewarm(ONNX_TOOLS)

    # --- the loop ---
    def serve(self, listener) -> None:
        import select
        import time

        state = _serving()
        while True:
            self.refused.flush()
            if state.stop:
                _log(f"stopping: {state.stop}")
                return
            if time.monotonic() - self.last_used > self.idle_s:
                _log(f"stopping: idle for {self.idle_s:g} s")
                return
            if _file_id(self.root) != self.root_id or not os.path.isdir(self.build_dir):
                _log("stopping: the project folder or its build folder is gone or replaced")
                return
            try:
                readable = select.select([listener], [], [], 0.5)[0]
            except InterruptedError:
                continue
            if readable:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                with conn:
                    try:
                        self.handle(conn)
                    except Exception:  # a bug here must not leave a server in doubt: it ends
                        import traceback

                        _log(f"request failed:\n{traceback.format_exc()}")
                        self.stale = self.stale or "a request failed in the server"
                self.last_used = time.monotonic()
                if self.stale and state.stop is None:
                    state.stop = self.stale

    def handle(self, conn) -> None:
        import socket

        try:
            uid = peer_uid(conn)
        except OSError:
            return
        if not same_user(uid):
            self.refused.refused(uid)
            return
        conn.settimeout(10)
        try:
            message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        except (OSError, ValueError):
            return
        try:
            import json

            try:
                doc = json.loads(message) if message else {}
            except ValueError:  # truncated (too large) or not ours
                _log("ignored a request that is not JSON")
                return
            op = doc.get("op") if isinstance(doc, dict) else None
            if op == "status":
                send(conn, self.status())
            elif op == "stop":
                _serving().stop = "optbuild server stop"
                send(conn, {"stopping": True, "pid": os.getpid()})
            elif op == "build" and not fds:
                conn.settimeout(None)
                self.build(conn, doc)
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)

    def status(self) -> dict:
        import time

        return {"pid": os.getpid(), "root": self.root, "uptime_s": round(time.time() - self.started, 1),
                "builds": self.builds, "idle_s": round(time.monotonic() - self.last_used, 1),
                "idle_limit_s": self.idle_s, "log": os.path.join(self.build_dir, LOG),
                "fork_servers": self.pool.describe() if self.pool is not None else []}

    def build(self, conn, doc: dict) -> None:
        import threading
        import time

        why = self.why_declined(conn, doc)
        if why is not None:
            self.decline(conn, why)
            return
        fds, wrap = self.terminal(conn)
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            _log("a client left before sending its terminal")
            return
        doc = {**doc, "stdio": wrap}
        started = time.time_ns()
        self.builds += 1
        _log(f"build {self.builds} for pid {doc.get('pid')}: optbuild {' '.join(doc['argv'])} (in {doc['cwd']})")
        state = _serving()
        state.cancelled = False
        state.build_id += 1
        watcher = threading.Thread(target=watch_client, args=(conn, threading.main_thread().ident, state, state.build_id),
                                   name="optbuild-server-client", daemon=True)
        code: int | None = None  # None: the build was not started (the client builds in-process)
        threads: set[threading.Thread] = set()
        try:
            with client_context(doc, fds, self.root):
                fds = []
                self.check_pool(dict(os.environ))
                threads = set(threading.enumerate())
                with state.lock:  # from now on the client's Ctrl-C cancels the build
                    state.building = True
                send(conn, {"accepted": True, "pid": os.getpid()})
                code = 2
                watcher.start()
                code = _run(self, doc)
        except KeyboardInterrupt as exc:  # a cancel that came as the build was ending
            from optbuild.cli import Terminated

            code = 128 + exc.signum if isinstance(exc, Terminated) else 130
        except BaseException as exc:
            _log(f"build failed in the server: {type(exc).__name__}: {exc}")
            self.stale = self.stale or "a build failed in the server"
            if not isinstance(exc, Exception):
                raise
            if code is None:
                self.decline(conn, f"it could not start the build ({type(exc).__name__}: {exc})")
        finally:
            for fd in fds:
                os.close(fd)
            with state.lock:
                state.building = False
            if code is not None:
                self.answer(conn, code, watcher)
            self.watch_modules(started)
            self.check_threads(threads | {watcher} if threads else set())
            _log(f"build {self.builds} ended: " + ("not started" if code is None else f"exit {code}"))

    def terminal(self, conn) -> tuple[list[int], dict]:
        """The client's stdin, stdout and stderr (and how it wraps them), asked for once its
        build will run: a server that is busy or stopped meanwhile never holds them open."""
        import json
        import socket

        try:
            send(conn, {"ready": True})
            conn.settimeout(10)
            message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
            conn.settimeout(None)
        except OSError:
            return [], {}
        try:
            wrap = json.loads(message).get("stdio") or {}
        except (ValueError, AttributeError):
            wrap = {}
        return fds, wrap

    def why_declined(self, conn, doc: dict) -> str | None:
        """Why this client's build must run in its own process; None to serve it."""
        try:
            why = self.why_stale(doc)
            if why is None and client_gone(conn):
                why = "the client left"
            if why is None:
                try:
                    os.stat(doc["cwd"])
                except OSError as exc:
                    why = f"the client's folder cannot be entered ({exc})"
        except Exception as exc:  # never build on a doubt
            why = f"{type(exc).__name__}: {exc}"
        return why

    def decline(self, conn, why: str) -> None:
        """The client builds in its own process (and starts a fresh server: this one ends,
        but for a client that left)."""
        _log(f"declined a build: {why}")
        if self.stale is None and why != "the client left":
            self.stale = why
        try:
            send(conn, {"declined": why})
        except OSError:
            pass

    def answer(self, conn, code: int, watcher) -> None:
        """The build's exit code to its client; then its signals are no longer read."""
        import socket

        try:
            send(conn, {"exit": code})
        except OSError:
            pass
        try:
            conn.shutdown(socket.SHUT_RD)
        except OSError:
            pass
        if watcher.is_alive():
            watcher.join(5)

    def check_threads(self, before: set) -> None:
        """A thread the build started that outlives it (a remote transfer stalled past its
        timeout, abandoned but blocked in a read) would stay in this process for good, and
        others would pile up: the server ends after such a build, and the thread with it, as
        it would with an in-process build. ``before``: the threads to leave alone (none
        when the build did not start)."""
        import threading
        import time

        if not before:
            return
        deadline = time.monotonic() + THREADS_GRACE_S
        for thread in set(threading.enumerate()) - before:
            thread.join(max(0.0, deadline - time.monotonic()))
        if left := sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive()):
            self.stale = self.stale or f"the build left {len(left)} thread(s) running ({', '.join(left)})"


def _run(server: Server, doc: dict) -> int:
    """The command, as ``optbuild.cli.main`` runs it after the fast path declined."""
    global _POOL
    from optbuild import cli
    from optbuild.cli import noop
    from optbuild.common import noopstamp

    noopstamp.mark_start(doc["argv"], started_ns=doc.get("started_ns"), sys_path=doc["identity"]["path"])
    fresh_caches()
    if (reach := noop.find_reach(doc["argv"])) is not None:  # as the client's fast path found it
        _log(f"{reach.describe()}: loading {len(reach.recipes)} of {len(reach.stamp['recipes'])} recipes")
    _POOL = server.pool
    try:
        return cli.main(doc["argv"], fast_path=False)
    except SystemExit as exc:  # argparse: --help, a usage error
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:  # as Python reports it in the client's own process: on its stderr
        import traceback

        traceback.print_exc()
        _log(f"the build raised:\n{traceback.format_exc()}")
        server.stale = server.stale or "a build raised an exception in the server"
        return 1
    finally:
        state = _serving()
        with state.lock:  # first: a signal handled after this no longer cancels anything
            state.building = False
        _POOL = None


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def serve(root: str, build_dir: str, idle_s: float) -> None:
    """The server's main: claim the address, load what a build needs, start the fork
    servers, serve."""
    global _STATE, _LOGFILE
    import signal
    import socket

    _LOGFILE = os.fdopen(os.dup(2), "a", encoding="utf-8", errors="backslashreplace")
    _STATE = _State()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    try:
        folder, lock = claim(root)
    except BlockingIOError:  # it serves; or the next build starts one
        _log("another server runs for this project; exiting")
        return
    except OSError as exc:  # PermissionError: a folder that is not private
        _log(f"cannot serve: {exc}")
        return
    path = folder.file(socket_name(root))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    server = None
    try:
        listener.bind(path)
        listener.listen(16)
        server = Server(root, build_dir, idle_s)
        _log(f"serving {root} (idle limit {idle_s:g} s; socket in {folder.path})")
        import importlib

        for name in ("optbuild.api", "optbuild.cli.build", "optbuild.builder.scheduler", "optbuild.builder.report"):
            importlib.import_module(name)  # what a build imports, loaded before the first one

        server.check_pool(dict(os.environ))
        server.watch_modules(server.started_ns)
        server.serve(listener)
    finally:
        listener.close()
        try:
            os.unlink(path)  # while the lock is held: it is this server's
        except OSError:
            pass
        os.close(lock)
        folder.close()
        if server is not None:
            server.refused.flush(force=True)
            if server.pool is not None:
                server.pool.shutdown()
        _log("stopped")
