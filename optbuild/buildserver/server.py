"""The server: it binds the project's address, loads what a build needs, keeps the fork
servers warm, and runs each client's build as ``optbuild.cli.main`` would in the client's
own process (``session.client_context``), declining a client it is stale for."""

from __future__ import annotations

import os
import sys

from optbuild.buildserver.protocol import LOG, MAX_REQUEST, address, identity, peer_uid, same_user, send
from optbuild.buildserver.session import client_context, fresh_caches

# Variables a shell sets per folder or per command: they do not restart the fork servers.
SHELL_NOISE = ("PWD", "OLDPWD", "_")


class _State:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.building = False  # a client's signal now cancels the build (see _on_signal)
        self.build_id = 0
        self.cancelled = False  # this build's client sent its one signal
        self.stop: str | None = None


_STATE: _State | None = None
_POOL = None  # the served pool of the build now running (optbuild.cli.build asks for it)


def served_pool(root: str | None):
    """The server's warm WorkerPool when this process is a build server serving ``root``;
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
        self.pool = None
        from optbuild import noop

        self.host = noop.host_facts()

    # --- staleness ---
    def watch_modules(self, since_ns: int) -> None:
        """Record the signature of every module file and sys.path entry not seen yet; one
        that changed too recently to vouch for what was imported makes the server stale."""
        from optbuild import noop

        for path in noop.module_files(stdlib=True):
            if path in self.sigs:
                continue
            sig = self.sigs[path] = noop.signature(path)
            if noop.changed_within(sig, since_ns) and self.stale is None:
                self.stale = f"{path} changed within {noop.RACY_NS / 1e9:g} s of being loaded"

    def why_stale(self, client: dict) -> str | None:
        from optbuild import noop

        if self.stale:
            return self.stale
        if client.get("identity") != self.identity:
            ours, theirs = self.identity, client.get("identity") or {}
            what = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
            return f"another interpreter setup ({', '.join(what)})"
        if _file_id(self.root) != self.root_id:
            return "the project folder was removed or replaced"
        if noop.host_facts() != self.host:
            return "the host changed (reboot, GPU devices or driver)"
        for path, sig in self.sigs.items():
            if noop.signature(path) != sig:
                return f"{path} changed since it was loaded"
        return None

    def check_pool(self, env: dict[str, str]) -> None:
        """A fresh pool when the fork servers are stale, dead, or were started under
        another environment."""
        from optbuild.workerpool import ONNX_TOOLS, ServedPool

        if self.pool is not None:
            why = self.pool.why_stale(env)
            if why is None:
                return
            _log(f"restarting the fork servers: {why}")
            self.pool.shutdown()
            self.pool = None
        self.pool = ServedPool(self.root, env=env, quiet_env=SHELL_NOISE)
        self.pool.prewarm(ONNX_TOOLS)

    # --- the loop ---
    def serve(self, listener) -> None:
        import select
        import time

        while True:
            if _STATE.stop:
                _log(f"stopping: {_STATE.stop}")
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
                if self.stale and _STATE.stop is None:
                    _STATE.stop = self.stale

    def handle(self, conn) -> None:
        import socket

        try:
            uid = peer_uid(conn)
        except OSError:
            return
        if not same_user(uid):
            _log(f"refused a connection from uid {uid}")
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
                _STATE.stop = "optbuild server stop"
                send(conn, {"stopping": True, "pid": os.getpid()})
            elif op == "build" and len(fds) == 3:
                conn.settimeout(None)
                owned, fds = fds, []  # build() closes them, whatever happens
                self.build(conn, doc, owned)
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

    def build(self, conn, doc: dict, fds: list[int]) -> None:
        import threading
        import time

        try:
            why = self.why_stale(doc)
            if why is None and _closed(conn):
                why = "the client left"
            if why is None:
                try:
                    os.stat(doc["cwd"])
                except OSError as exc:
                    why = f"the client's folder cannot be entered ({exc})"
        except Exception as exc:  # never build on a doubt
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            _log(f"declined a build: {why}")
            if self.stale is None and why != "the client left":
                self.stale = why
            for fd in fds:
                os.close(fd)
            try:
                send(conn, {"declined": why})
            except OSError:
                pass
            return
        started = time.time_ns()
        self.builds += 1
        _log(f"build {self.builds} for pid {doc.get('pid')}: optbuild {' '.join(doc['argv'])} (in {doc['cwd']})")
        state = _STATE
        state.cancelled = False
        state.build_id += 1
        watcher = threading.Thread(target=_watch, args=(conn, threading.main_thread().ident, state, state.build_id),
                                   name="optbuild-server-client", daemon=True)
        code = 2
        try:
            with client_context(doc, fds, self.root):
                fds = []
                self.check_pool(dict(os.environ))
                with state.lock:  # from now on the client's Ctrl-C cancels the build
                    state.building = True
                send(conn, {"accepted": True, "pid": os.getpid()})
                watcher.start()
                code = _run(self, doc)
        except KeyboardInterrupt as exc:  # a cancel that came as the build was ending
            from optbuild.cli import Terminated

            code = 128 + exc.signum if isinstance(exc, Terminated) else 130
        except BaseException as exc:
            _log(f"build failed in the server: {type(exc).__name__}: {exc}")
            if not isinstance(exc, Exception):
                raise
        finally:
            for fd in fds:
                os.close(fd)
            with state.lock:
                state.building = False
            try:
                send(conn, {"exit": code})
            except OSError:
                pass
            import socket

            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            if watcher.is_alive():
                watcher.join(5)
            self.watch_modules(started)
            _log(f"build {self.builds} ended: exit {code}")


def _run(server: Server, doc: dict) -> int:
    """The command, as ``optbuild.cli.main`` runs it after the fast path declined."""
    global _POOL
    from optbuild import cli, noop

    noop.mark_start(doc["argv"], started_ns=doc.get("started_ns"), sys_path=doc["identity"]["path"])
    fresh_caches()
    _POOL = server.pool
    try:
        return cli.main(doc["argv"], fast_path=False)
    except SystemExit as exc:  # argparse: --help, a usage error
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        with _STATE.lock:  # first: a signal handled after this no longer cancels anything
            _STATE.building = False
        _POOL = None


def _watch(conn, main_thread: int, state: _State, build_id: int) -> None:
    """Act on the client's signals for the build (the main thread): the first Ctrl-C or
    SIGTERM cancels it, Ctrl-Z stops its processes and SIGCONT resumes them; a client gone
    resumes them and cancels it as SIGTERM would."""
    import json
    import signal

    from optbuild.buildserver.jobcontrol import SWEEP_S, Suspension

    suspension = Suspension(os.getpid())
    while True:
        conn.settimeout(SWEEP_S if suspension.active else None)
        try:
            data = conn.recv(4096)
        except TimeoutError:  # stopped: stop what was started since, too
            suspension.stop()
            continue
        except OSError:
            data = b""
        try:
            signum = int(json.loads(data)["signal"]) if data else signal.SIGTERM
        except (ValueError, KeyError, TypeError):
            continue
        if signum == signal.SIGTSTP:
            suspension.stop()
            continue
        suspension.resume()  # SIGCONT; and a cancelled build must be able to end
        if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the client's terminal closed
            with state.lock:
                if state.building and not state.cancelled and state.build_id == build_id:
                    state.cancelled = True
                    signal.pthread_kill(main_thread, signum)
        if not data:
            return


def _closed(conn) -> bool:
    """Whether the client has closed its end (it was interrupted while it waited)."""
    import select
    import socket

    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def serve(root: str, build_dir: str, idle_s: float) -> None:
    """The server's main: bind, load what a build needs, start the fork servers, serve."""
    global _STATE, _LOGFILE
    import signal
    import socket
    import time

    _LOGFILE = os.fdopen(os.dup(2), "a", encoding="utf-8", errors="backslashreplace")
    _STATE = _State()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    deadline = time.monotonic() + 3
    while True:
        try:
            listener.bind(address(root))
            break
        except OSError:  # another server runs (or one is ending): it serves, or the next try starts one
            if time.monotonic() > deadline:
                _log("another server holds the address; exiting")
                return
            time.sleep(0.1)
    listener.listen(16)
    server = Server(root, build_dir, idle_s)
    _log(f"serving {root} (idle limit {idle_s:g} s)")
    try:
        import importlib

        for name in ("optbuild.api", "optbuild.cli.build", "optbuild.executor", "optbuild.report"):
            importlib.import_module(name)  # what a build imports, loaded before the first one

        server.check_pool(dict(os.environ))
        server.watch_modules(server.started_ns)
        server.serve(listener)
    finally:
        listener.close()
        if server.pool is not None:
            server.pool.shutdown()
        _log("stopped")
