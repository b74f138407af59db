"""The build server: ``optbuild build`` handed to a process that stays loaded between builds
(as Gradle's and Bazel's daemons), its fork servers warm, so that a changed build pays for
the steps' own work and not for importing optbuild, pydantic and the steps' tools again.

Opt-in (``[build] server = true`` in optbuild.toml, or ``OPTBUILD_SERVER=1``, which also
turns it off with 0); off by default for now, see the README.

**Client** (``try_build``; standard library only, imported after the no-op fast path
declined): connects to the project's server over a Unix socket and sends, in one message,
the arguments, the working folder, the whole environment, the umask, the moment the build
started and the interpreter's identity, with the client's stdin, stdout and stderr attached
(SCM_RIGHTS): the server writes straight to the user's terminal. Ctrl-C and SIGTERM are
forwarded as messages; the server answers with the exit code. With no server running the
build runs in-process as without one, and a server is started once it has ended (its
imports would compete with the build's for the CPU; it is ready for the next build).

**Address.** A Linux abstract socket named from a hash of the uid and the project's real
path (no file; no 108-byte ``sun_path`` limit). Anyone on the host can connect to an
abstract socket, so both ends check the other's uid (SO_PEERCRED): the server serves only
its own uid; the client talks only to a server of its own uid (another user squatting the
name would otherwise receive the client's environment and terminal).

**Staleness.** The server declines (and exits; the client builds in-process and starts a
fresh one) when the client's interpreter, ``sys.path``, interpreter flags, optbuild version,
``PYTHON*``/``LD_LIBRARY_PATH``/``LD_PRELOAD`` variables, or the host (boot id,
``/dev/nvidia*``, driver version) differ from the server's; when any file of a module it has
loaded (optbuild, step kinds, plugins, pydantic..., found in ``sys.modules``) changed since
it was read (a package installed is seen by the entry-point scan, read again per build, and
by the import system, whose folder caches are dropped per build). A file changed less
than ``noop.RACY_NS`` before it could have been imported cannot vouch for itself: the server
then ends after that build. The fork servers report their own modules the same way; a
changed one, a dead one, or a client environment other than the one they were started with
(``PWD``, ``OLDPWD`` and ``_`` aside) restarts them. No optbuild cache outlives a build: every
``functools`` cache of an optbuild module and the warn-once sets are cleared before each.

**Lifetime.** It ends after ``OPTBUILD_SERVER_IDLE_S`` (else ``[build] server_idle_s``)
seconds without a build (default 900),
when its project folder is removed or replaced, on ``optbuild server stop``, and on SIGTERM
(cancelling a build as a local SIGTERM would). Its fork servers and their step children
die with it (PR_SET_PDEATHSIG, tied to a thread that lives as long as the server). A client
that disappears mid-build (its socket closes) cancels the build as SIGTERM would.
"""

from __future__ import annotations

import os
import sys

ENV_SWITCH = "OPTBUILD_SERVER"
ENV_IDLE = "OPTBUILD_SERVER_IDLE_S"
ENV_DEBUG = "OPTBUILD_DEBUG_SERVER"
DEFAULT_IDLE_S = 900.0
LOG = os.path.join(".optbuild", "server.log")  # under the build folder
MAX_REQUEST = 1 << 20
PROTOCOL = 1
WAIT_NOTE_S = 3.0  # a client waiting longer than this for its build to start says so
# Variables that change what the interpreter or native libraries load: a server started
# under other values is not this client's.
_IDENTITY_PREFIXES = ("PYTHON",)
_IDENTITY_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
# Variables a shell sets per folder or per command: they do not restart the fork servers.
SHELL_NOISE = ("PWD", "OLDPWD", "_")


def _debug(message: str) -> None:
    if os.environ.get(ENV_DEBUG, "") not in ("", "0"):
        print(f"optbuild: server: {message}", file=sys.stderr, flush=True)


def enabled(root: str | None = None) -> bool:
    """Whether ``optbuild build`` of the project at ``root`` uses a build server (Linux
    only): ``OPTBUILD_SERVER`` when set (1 or 0), else ``[build] server`` of its
    optbuild.toml; off by default."""
    if not sys.platform.startswith("linux"):
        return False
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch:
        return switch in ("1", "true", "yes", "on")
    return root is not None and _setting(root, "server", False) is True


def _setting(root: str, name: str, default: object) -> object:
    """``[build] NAME`` of the project's optbuild.toml as written there (the build checks its
    type: an unreadable or invalid file gives ``default`` here and its error there)."""
    import tomllib

    from optbuild.projectroot import CONFIG_NAME

    try:
        with open(os.path.join(root, CONFIG_NAME), "rb") as config:
            build = tomllib.load(config).get("build", {})
    except (OSError, ValueError):
        return default
    return build.get(name, default) if isinstance(build, dict) else default


def address(root: str) -> str:
    """The abstract socket name of the server of the project at ``root`` (a real path)."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    digest = blake2b(f"{os.getuid()}\0{root}".encode(errors="surrogateescape"), digest_size=12).hexdigest()
    return f"\0optbuild-server-{digest}"


def identity() -> dict[str, object]:
    """What a server must share with its client: the interpreter, its path and flags,
    optbuild's version, and the variables that change what gets loaded."""
    from optbuild import __version__, noop

    env = {name: value for name, value in os.environ.items()
           if name.startswith(_IDENTITY_PREFIXES) or name in _IDENTITY_NAMES}
    return {"protocol": PROTOCOL, "executable": sys.executable, "version": sys.version,
            "optbuild": __version__, "flags": repr(sys.flags), "uid": os.getuid(),
            "path": noop.python_path(), "env": env}


def peer_uid(sock) -> int:
    """The uid of the process at the other end of the Unix socket ``sock`` (SO_PEERCRED)."""
    import socket
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def same_user(uid: int) -> bool:
    """Whether a peer with ``uid`` may use (or serve) this user's builds."""
    return uid == os.getuid()


def _connect(root: str, timeout: float | None = None):
    """A socket connected to the server of ``root``, checked to run as this user; None if
    none runs. PermissionError if one runs as another user."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(address(root))
    except OSError:  # ConnectionRefusedError, FileNotFoundError...: none runs
        sock.close()
        return None
    if not same_user(uid := peer_uid(sock)):
        sock.close()
        raise PermissionError(f"the build server's socket belongs to uid {uid}, not {os.getuid()}")
    return sock


def _send(sock, doc: dict, fds: list[int] | None = None) -> None:
    import json
    import socket

    socket.send_fds(sock, [json.dumps(doc).encode(errors="surrogateescape")], fds or [])


def _recv(sock) -> dict | None:
    import json

    data = sock.recv(MAX_REQUEST)
    return json.loads(data) if data else None


def request(root: str, doc: dict, timeout: float = 10.0) -> dict | None:
    """One request and its answer (status, stop); None when no server runs."""
    sock = _connect(root, timeout)
    if sock is None:
        return None
    with sock:
        _send(sock, doc)
        return _recv(sock)


# --- the client -----------------------------------------------------------------------------
class _Declined(Exception):
    pass


def try_build(argv: list[str], directory: str | None) -> tuple[int | None, str | None]:
    """(the build's exit code from the project's server, None); or (None, the project root
    whose server to start after an in-process build, or None to start none)."""
    from optbuild.projectroot import project_root

    root = project_root(directory)
    if root is None or not enabled(root):
        return None, None
    try:
        sock = _connect(root)
    except PermissionError as exc:
        print(f"warning: {exc}; building in this process", file=sys.stderr)
        return None, None
    if sock is None:
        _debug("none runs: building in this process, then starting one")
        return None, root
    try:
        return _build_through(sock, argv), None
    except _Declined as exc:
        _debug(f"declined: {exc}; building in this process, then starting another")
        return None, root
    finally:
        sock.close()


def _stdio() -> tuple[list[int], dict[str, list]]:
    """The client's fds 0, 1 and 2 (/dev/null for a closed one) and how Python wraps them."""
    fds, wrap = [], {}
    for fd, stream in ((0, sys.stdin), (1, sys.stdout), (2, sys.stderr)):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
        wrap[str(fd)] = [getattr(stream, "encoding", None), getattr(stream, "errors", None)]
    return fds, wrap


def _build_through(sock, argv: list[str]) -> int:
    import signal

    from optbuild import noop

    umask = os.umask(0o022)
    os.umask(umask)
    fds, wrap = _stdio()
    doc = {"op": "build", "identity": identity(), "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
           "umask": umask, "started_ns": noop.started_ns(), "stdio": wrap, "pid": os.getpid()}
    try:
        _send(sock, doc, fds)
    except OSError as exc:  # the server ended meanwhile, or the request is too large
        raise _Declined(f"the request could not be sent ({exc})") from None
    finally:
        for fd in fds[:]:
            if fd > 2:
                os.close(fd)
    accepted = False

    def forward(signum: int, frame: object) -> None:
        if not accepted:  # nothing started yet: end as the build would have at once
            raise SystemExit(128 + signum)
        try:
            _send(sock, {"signal": signum})
        except OSError:
            pass

    forwarded = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # not under nohup: the terminal closing ends it
        forwarded.append(signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        sock.settimeout(WAIT_NOTE_S)
        try:
            answer = _recv(sock)
        except TimeoutError:
            print("optbuild: waiting for the build server (it is starting, or building this project "
                  "for another client)", file=sys.stderr, flush=True)
            sock.settimeout(None)
            answer = _recv_answer(sock)
        except (OSError, ValueError):
            answer = None
        sock.settimeout(None)
        if answer is None or "declined" in answer:
            raise _Declined(answer["declined"] if answer else "the server ended before answering")
        if "exit" in answer:  # it failed to start the build
            return int(answer["exit"])
        accepted = True
        _debug(f"build served by pid {answer['pid']}")
        answer = _recv_answer(sock)
        if answer is None or "exit" not in answer:
            print("error: the build server ended during the build (see build/.optbuild/server.log); "
                  "run the build again", file=sys.stderr)
            return 2
        return int(answer["exit"])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _recv_answer(sock) -> dict | None:
    try:
        return _recv(sock)
    except (ConnectionError, OSError, ValueError):
        return None


def idle_limit(root: str) -> float:
    """Seconds a server waits for its next build: $OPTBUILD_SERVER_IDLE_S, else
    ``[build] server_idle_s``, else 900."""
    given = os.environ.get(ENV_IDLE) or _setting(root, "server_idle_s", DEFAULT_IDLE_S)
    try:
        value = float(given)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        print(f"warning: the build server's idle time {given!r} is not a number of seconds; using "
              f"{DEFAULT_IDLE_S:g}", file=sys.stderr)
        return DEFAULT_IDLE_S
    return value if value > 0 else DEFAULT_IDLE_S


def spawn(root: str, build_dir: str | None = None) -> None:
    """Start the server of the project at ``root``, detached (its own session), its output
    going to build/.optbuild/server.log; best effort."""
    import json
    import subprocess

    from optbuild import noop

    try:
        if build_dir is None:
            build_dir = noop.build_dir_of(root)
        log_path = os.path.join(build_dir, LOG)
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        idle = idle_limit(root)
        code = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
                "from optbuild.buildserver import serve; serve(sys.argv[2], sys.argv[3], float(sys.argv[4]))")
        try:
            flags = subprocess._args_from_interpreter_flags()
        except Exception:
            flags = []
        with open(log_path, "ab") as log:
            subprocess.Popen([sys.executable, *flags, "-c", code, json.dumps(noop.python_path()), root, build_dir,
                              str(idle)],
                             cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, close_fds=True)
        _debug(f"started one for {root}")
    except Exception as exc:  # a server not started only costs speed
        _debug(f"could not start one: {type(exc).__name__}: {exc}")


# --- the server -----------------------------------------------------------------------------
class _State:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.building = False  # a client's signal now cancels the build (see _on_signal)
        self.build_id = 0
        self.cancelled = False  # this build's client sent its one signal
        self.forwarded = False  # a client's signal may still reach a handler: not the server's to obey
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
    """SIGINT, SIGTERM outside a build's own handlers: cancel the build if one runs (SIGINT),
    else stop the server."""
    import signal

    state = _STATE
    if state is None:
        return
    if state.building:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        from optbuild.cli import Terminated

        raise Terminated
    if state.forwarded:  # a client's cancel that came as its build was ending
        return
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
            _STATE.forwarded = False  # any handler of a signal forwarded before has run by now
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
                _send(conn, self.status())
            elif op == "stop":
                _STATE.stop = "optbuild server stop"
                _send(conn, {"stopping": True, "pid": os.getpid()})
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
                _send(conn, {"declined": why})
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
            with _client_context(doc, fds):
                fds = []
                self.check_pool(dict(os.environ))
                with state.lock:  # from now on the client's Ctrl-C cancels the build
                    state.building = True
                _send(conn, {"accepted": True, "pid": os.getpid()})
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
                _send(conn, {"exit": code})
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
    _fresh_caches()
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
    """Forward the client's first signal to the build (the main thread); a client gone
    cancels it as SIGTERM would."""
    import json
    import signal

    while True:
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        try:
            signum = int(json.loads(data)["signal"]) if data else signal.SIGTERM
        except (ValueError, KeyError, TypeError):
            continue
        if signum == signal.SIGHUP:  # the client's terminal closed; the server ignores SIGHUP itself
            signum = signal.SIGTERM
        if signum not in (signal.SIGINT, signal.SIGTERM):
            continue
        with state.lock:
            if state.building and not state.cancelled and state.build_id == build_id:
                state.cancelled = state.forwarded = True
                signal.pthread_kill(main_thread, signum)
        if not data:
            return


class _client_context:
    """The client's environment, folder, umask, argv and stdio for the build's duration."""

    def __init__(self, doc: dict, fds: list[int]):
        self.doc, self.fds = doc, fds
        self.saved_env: dict[str, str] | None = None
        self.saved_argv = sys.argv
        self.saved_fds: list[int] = []
        self.saved_umask: int | None = None

    def __enter__(self) -> None:
        try:
            self._enter()
        except BaseException:
            self.__exit__()
            raise

    def _enter(self) -> None:
        doc = self.doc
        self.saved_env = dict(os.environ)
        self.saved_argv = sys.argv
        self.saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for target, fd in enumerate(self.fds):
            os.dup2(fd, target)
            os.close(fd)
        self.fds.clear()
        _replace_env(doc["env"])
        self.saved_umask = os.umask(int(doc["umask"]))
        os.chdir(doc["cwd"])
        sys.argv = ["optbuild", *doc["argv"]]
        wrap = doc.get("stdio") or {}

        def stream(fd: int, mode: str, line_buffering: bool = False, errors: str | None = None):
            import io

            encoding, theirs = (wrap.get(str(fd)) or [None, None])[:2]
            return io.TextIOWrapper(open(fd, mode + "b", closefd=False), encoding=encoding or "utf-8",
                                    errors=errors or theirs or "strict", line_buffering=line_buffering)

        sys.stdin = stream(0, "r")
        sys.stdout = stream(1, "w", line_buffering=os.isatty(1))
        sys.stderr = stream(2, "w", line_buffering=True, errors="backslashreplace")

    def __exit__(self, *exc: object) -> None:
        import logging

        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        for target, fd in enumerate(self.saved_fds):
            os.dup2(fd, target)
            os.close(fd)
        self.saved_fds = []
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        logging.getLogger("optbuild").handlers.clear()  # bound to this build's stderr
        sys.argv = self.saved_argv
        if self.saved_umask is not None:
            os.umask(self.saved_umask)
        if self.saved_env is not None:
            _replace_env(self.saved_env)
        try:
            os.chdir(_SERVER.root if _SERVER is not None else "/")
        except OSError:
            os.chdir("/")


_SERVER: Server | None = None


def _replace_env(env: dict[str, str]) -> None:
    for name in set(os.environ) - set(env):
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


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


def _fresh_caches() -> None:
    """What a fresh process would have: every functools cache of an optbuild module cleared
    (the plugin entry points are read again), the warn-once sets emptied, and the import
    system's folder listings dropped (a module added since is found)."""
    import importlib

    importlib.invalidate_caches()
    for name, module in list(sys.modules.items()):
        if not (name == "optbuild" or name.startswith("optbuild.")) or module is None:
            continue
        for value in list(vars(module).values()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and getattr(value, "__module__", None) == name:
                clear()
    for module_name, attr in (("optbuild.lockfile", "_warned"), ("optbuild.store.local", "_warned_read_only")):
        module = sys.modules.get(module_name)
        found = getattr(module, attr, None) if module is not None else None
        if isinstance(found, set):
            found.clear()


def serve(root: str, build_dir: str, idle_s: float) -> None:
    """The server's main: bind, load what a build needs, start the fork servers, serve."""
    global _STATE, _SERVER, _LOGFILE
    import signal
    import socket
    import time

    _LOGFILE = os.fdopen(os.dup(2), "a", encoding="utf-8", errors="backslashreplace")
    _STATE = _State()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
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
    server = _SERVER = Server(root, build_dir, idle_s)
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
