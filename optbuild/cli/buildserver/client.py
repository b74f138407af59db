"""The client: ``optbuild build`` handing its build to the project's server, and starting one.
Standard library only; imported after the no-op fast path declined."""

from __future__ import annotations

import contextlib
import os
import sys

from optbuild.cli.buildserver.protocol import (
    LOG,
    LOG_KEPT_BYTES,
    connect,
    debug,
    enabled,
    identity,
    idle_limit,
    peer_creds,
    recv,
    send,
    server_pid,
    stopped,
)

WAIT_NOTE_S = 3.0  # a client waiting longer than this for its build to start says so
WAIT_LIMIT_S = 20.0  # ... and builds in-process after this long (the server is busy or hung)
POLL_S = 0.25  # while it waits: how often it looks whether the server is stopped


class _Declined(Exception):
    pass


class _Unanswered(Exception):
    """The server does not take the build: stopped (SIGSTOP, a debugger: it will not answer
    until continued), or silent for WAIT_LIMIT_S (a long build for another client, or hung)."""

    def __init__(self, pid: int, stopped: bool):
        super().__init__(pid)
        self.pid, self.stopped = pid, stopped

    def warning(self) -> str:
        if self.stopped:
            return (f"warning: the build server (pid {self.pid}) is stopped and does not answer; building in "
                    f"this process. `optbuild server stop` ends it (or `kill -9 {self.pid}`)")
        return (f"warning: the build server (pid {self.pid}) has not answered in {WAIT_LIMIT_S:g} s (a long "
                "build for another client, or hung); building in this process. `optbuild server stop` ends "
                f"it (or `kill -9 {self.pid}`)")


def try_build(argv: list[str], directory: str | None) -> tuple[int | None, str | None]:
    """(the build's exit code from the project's server, None); or (None, the project root
    whose server to start after an in-process build, or None to start none).

    A stopped or silent server does not hold the build: the client says so, naming its
    pid, and builds in this process (as without a server: the build is what was asked for;
    the warning says how to end the server)."""
    from optbuild.common.projectroot import project_root

    root = project_root(directory)
    if root is None or not enabled(root):
        return None, None
    try:
        sock = connect(root, timeout=WAIT_NOTE_S)
    except PermissionError as exc:
        print(f"warning: {exc}; building in this process", file=sys.stderr)
        return None, None
    try:
        if sock is None:
            return None, _unanswered(root)
        return _build_through(sock, argv), None
    except _Declined as exc:
        debug(f"declined: {exc}; building in this process, then starting another")
        return None, root
    except _Unanswered as exc:
        print(exc.warning(), file=sys.stderr, flush=True)
        return None, None
    finally:
        if sock is not None:
            sock.close()


def _unanswered(root: str) -> str | None:
    """After a connection no server took: the root whose server to start after the build
    (none runs), or None (one runs, busy; _Unanswered: one runs, stopped)."""
    pid = server_pid(root)
    if pid is None:
        debug("none runs: building in this process, then starting one")
        return root
    if stopped(pid):
        raise _Unanswered(pid, stopped=True)
    debug(f"pid {pid} did not take the connection: building in this process")
    return None


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


class _Signals:
    """The client's signals while a server builds for it, as they would act on a local build:

    - Ctrl-C, SIGTERM and SIGHUP (the terminal closed; not under nohup) cancel the build:
      forwarded once it started, an exit at once before;
    - Ctrl-Z (SIGTSTP) stops the build's processes in the server, then this client; the
      shell's ``fg`` or ``bg`` (SIGCONT) resumes them;
    - Ctrl-\\ (SIGQUIT) keeps its default, as in a local build: the client dies at once
      (with a core dump where allowed), and the server cancels the build of a client gone.
    """

    def __init__(self, sock) -> None:
        import signal

        self.sock = sock
        self.accepted = False
        ending = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            ending.append(signal.SIGHUP)
        self.previous = {s: signal.signal(s, self.cancel) for s in ending}
        if signal.getsignal(signal.SIGTSTP) == signal.SIG_DFL:  # a shell with job control
            self.previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self.suspend)

    def cancel(self, signum: int, frame: object) -> None:
        if not self.accepted:  # nothing started yet: end as the build would have at once
            raise SystemExit(128 + signum)
        self._tell(signum)

    def suspend(self, signum: int, frame: object) -> None:
        """Stop the build, then this process as SIGTSTP would have; once continued, resume it."""
        import signal

        self._tell(signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until SIGCONT
        signal.signal(signal.SIGTSTP, self.suspend)
        self._tell(signal.SIGCONT)

    def _tell(self, signum: int) -> None:
        try:
            send(self.sock, {"signal": int(signum)})
        except OSError:  # the server ended: the answer says so
            pass

    def restore(self) -> None:
        import signal

        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _build_through(sock, argv: list[str]) -> int:
    """The build, asked for; the terminal sent once the server is ready to run it (a busy,
    stopped or hung server never holds it open: `optbuild build | tee` ends with the
    client); then its exit code."""
    from optbuild.common import noopstamp

    pid = peer_creds(sock)[0]
    if pid > 0 and stopped(pid):
        raise _Unanswered(pid, stopped=True)
    umask = os.umask(0o022)
    os.umask(umask)
    doc = {"op": "build", "identity": identity(), "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
           "umask": umask, "started_ns": noopstamp.started_ns(), "pid": os.getpid()}
    try:
        send(sock, doc)
    except OSError as exc:  # the server ended meanwhile, or the request is too large
        raise _Declined(f"the request could not be sent ({exc})") from None
    signals = _Signals(sock)
    try:
        answer = _first_answer(sock, pid)
        if answer is not None and "ready" in answer:
            _send_stdio(sock)
            answer = _recv_answer(sock)
        if answer is None or "accepted" not in answer:
            raise _Declined(answer.get("declined", "no reason") if answer else "the server ended before answering")
        signals.accepted = True
        debug(f"build served by pid {answer['pid']}")
        answer = _recv_answer(sock)
        if answer is None or "exit" not in answer:
            print("error: the build server ended during the build (see build/.optbuild/server.log); "
                  "run the build again", file=sys.stderr)
            return 2
        return int(answer["exit"])
    finally:
        signals.restore()


def _send_stdio(sock) -> None:
    """The client's stdin, stdout and stderr, and how Python wraps them, to the server."""
    fds, wrap = _stdio()
    try:
        send(sock, {"op": "stdio", "stdio": wrap}, fds)
    except OSError as exc:
        raise _Declined(f"the terminal could not be sent ({exc})") from None
    finally:
        for fd in fds:
            if fd > 2:
                os.close(fd)


def _first_answer(sock, pid: int) -> dict | None:
    """The server's first answer (ready, declined), waited for while it runs: it may be
    starting, or building for another client (one build at a time). _Unanswered when it is
    seen stopped, or silent for WAIT_LIMIT_S; None when it ended without one."""
    import time

    started = time.monotonic()
    noted = False
    sock.settimeout(POLL_S)
    try:
        while True:
            try:
                return recv(sock)
            except TimeoutError:
                pass
            except (OSError, ValueError):
                return None
            waited = time.monotonic() - started
            held = pid > 0 and stopped(pid)
            if held or waited > WAIT_LIMIT_S:
                raise _Unanswered(pid, stopped=held)
            if not noted and waited > WAIT_NOTE_S:
                print(f"optbuild: waiting for the build server (pid {pid}: it is starting, or building this "
                      "project for another client)", file=sys.stderr, flush=True)
                noted = True
    finally:
        sock.settimeout(None)


def _recv_answer(sock) -> dict | None:
    try:
        return recv(sock)
    except (ConnectionError, OSError, ValueError):
        return None


def spawn(root: str, build_dir: str | None = None) -> None:
    """Start the server of the project at ``root``, detached (its own session), its output
    going to build/.optbuild/server.log (the one before moved to server.log.1 when over
    LOG_KEPT_BYTES); best effort."""
    import json
    import subprocess

    from optbuild.common import noopstamp

    try:
        if build_dir is None:
            build_dir = noopstamp.build_dir_of(root)
        log_path = os.path.join(build_dir, LOG)
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with contextlib.suppress(OSError):  # every server appends: keep the last two megabytes or so
            if os.path.getsize(log_path) > LOG_KEPT_BYTES:
                os.replace(log_path, log_path + ".1")
        idle = idle_limit(root)
        code = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
                "from optbuild.cli.buildserver.server import serve; "
                "serve(sys.argv[2], sys.argv[3], float(sys.argv[4]))")
        try:
            flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # private, not in typeshed
        except Exception:
            flags = []
        with open(log_path, "ab") as log:
            subprocess.Popen([sys.executable, *flags, "-c", code, json.dumps(noopstamp.python_path()), root, build_dir,
                              str(idle)],
                             cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, close_fds=True)
        print("optbuild: started a build server for this project's next builds (`optbuild server stop` ends "
              "it)", file=sys.stderr)
    except Exception as exc:  # a server not started only costs speed
        debug(f"could not start one: {type(exc).__name__}: {exc}")
