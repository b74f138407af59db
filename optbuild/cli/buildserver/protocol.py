"""What client and server share: the switches, the address (and the server's claim of it),
the identity a server must share with its client, and the messages (one JSON document per
SOCK_SEQPACKET packet, file descriptors attached with SCM_RIGHTS). Standard library only at
import: the client imports it."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported for it: the client's start-up time
if TYPE_CHECKING:
    from typing import Self

ENV_SWITCH = "OPTBUILD_SERVER"
ENV_IDLE = "OPTBUILD_SERVER_IDLE_S"
ENV_DEBUG = "OPTBUILD_DEBUG_SERVER"
# Variables a shell sets per folder or per command, and the server's own switches (they
# decide how a build runs, not what it makes): a client that differs only in them is served.
QUIET_ENV = ("PWD", "OLDPWD", "_", ENV_SWITCH, ENV_IDLE, ENV_DEBUG)
DEFAULT_IDLE_S = 900.0
LOG = os.path.join(".optbuild", "server.log")  # under the build folder
LOG_KEPT_BYTES = 1 << 20  # a server starting beside a larger log moves it to server.log.1
MAX_REQUEST = 1 << 20
PROTOCOL = 4
SOCKET_DIR_MODE = 0o700
# Limits a build inherits from the process that runs it (see limits()).
_RLIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK",
            "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_RSS", "RLIMIT_STACK")


def debug(message: str) -> None:
    if os.environ.get(ENV_DEBUG, "") not in ("", "0"):
        print(f"optbuild: server: {message}", file=sys.stderr, flush=True)


def enabled(root: str | None = None) -> bool:
    """Whether ``optbuild build`` of the project at ``root`` uses a build server (Linux
    only; off unless asked): ``OPTBUILD_SERVER`` when set (1 or 0), else ``[build] server =
    true`` in its optbuild.toml. Never for an optbuild.toml that does not parse: the build
    reports that in this process, before any server is consulted or started."""
    if not sys.platform.startswith("linux") or root is None:
        return False
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch and switch not in ("1", "true", "yes", "on"):
        return False
    build = build_section(root)
    if build is None:
        return False
    return bool(switch) or build.get("server") is True


def build_section(root: str) -> dict | None:
    """``[build]`` of the project's optbuild.toml as written there ({} when absent); None when
    the file cannot be read or parsed (the build reports why, naming file and line; its
    types are checked there too)."""
    from optbuild.common.tomlfile import config_table

    return config_table(root, "build")


def setting(root: str, name: str, default: object) -> object:
    """``[build] NAME`` of the project's optbuild.toml as written there; ``default`` when it
    is absent or the file is unreadable."""
    return (build_section(root) or {}).get(name, default)


def idle_limit(root: str) -> float:
    """Seconds a server waits for its next build: $OPTBUILD_SERVER_IDLE_S, else
    ``[build] server_idle_s``, else 900."""
    given = os.environ.get(ENV_IDLE) or setting(root, "server_idle_s", DEFAULT_IDLE_S)
    try:
        if not isinstance(given, str | int | float):  # a TOML table, array or date
            raise TypeError(type(given).__name__)
        value = float(given)
    except (TypeError, ValueError):
        print(f"warning: the build server's idle time {given!r} is not a number of seconds; using "
              f"{DEFAULT_IDLE_S:g}", file=sys.stderr)
        return DEFAULT_IDLE_S
    return value if value > 0 else DEFAULT_IDLE_S


def socket_dir(root: str) -> str:
    """The private folder of the server's socket and lock: $XDG_RUNTIME_DIR/optbuild (the
    user's own tmpfs, where set and there), else the project's build/.optbuild/server."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, "optbuild")
    from optbuild.common import noopstamp

    return os.path.join(noopstamp.build_dir_of(root), ".optbuild", "server")


def _name(root: str) -> str:
    """The server's file name stem in its folder: one per user and project (a real path)."""
    from optbuild.common.quickhash import blake2b

    return blake2b()(f"{os.getuid()}\0{root}".encode(errors="surrogateescape"), digest_size=12).hexdigest()


class PrivateDir:
    """The socket folder, opened and checked once (a folder, not a link; this user's; 0700)
    and then reached through /proc/self/fd: a folder swapped after the check is not used,
    and a socket path stays short whatever the folder's (AF_UNIX allows 108 bytes).
    PermissionError, naming the folder, when it is not private."""

    def __init__(self, path: str, *, create: bool):
        self.path = path
        if create:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                os.mkdir(path, SOCKET_DIR_MODE)
            except FileExistsError:
                pass
        try:
            self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except NotADirectoryError:
            raise PermissionError(f"the build server's folder {path} is not a folder (or is a link)") from None
        st = os.fstat(self.fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:  # others may neither list nor enter it
            os.close(self.fd)
            raise PermissionError(f"the build server's folder {path} is not private (owner uid {st.st_uid}, "
                                  f"mode {st.st_mode & 0o777:o}; wanted uid {os.getuid()}, mode 700)")

    def file(self, name: str) -> str:
        return f"/proc/self/fd/{self.fd}/{name}"

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def socket_name(root: str) -> str:
    return _name(root) + ".sock"


def lock_name(root: str) -> str:
    """The file its server holds locked (flock) while it runs, holding its pid."""
    return _name(root) + ".lock"


def server_pid(root: str) -> int | None:
    """The pid of the server of ``root`` while it runs, answering or not (from its lock
    file); None when none runs."""
    from optbuild.common.flock import try_lock

    try:
        with PrivateDir(socket_dir(root), create=False) as folder:
            fd = os.open(folder.file(lock_name(root)), os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, PermissionError):
        return None
    try:
        if try_lock(fd, shared=True):
            return None  # nobody holds it: no server runs
        return int(os.read(fd, 32) or b"0") or None
    except ValueError:
        return None
    finally:
        os.close(fd)


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP: T; a debugger: t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def identity() -> dict[str, object]:
    """What a server must share with its client: the interpreter, its path and flags,
    optbuild's version, the environment its steps see (``QUIET_ENV`` aside), the limits a
    build runs under, and the world it sees files in (mount namespace, root folder)."""
    from optbuild import __version__
    from optbuild.common import noopstamp

    env = {name: value for name, value in os.environ.items() if name not in QUIET_ENV}
    return {"protocol": PROTOCOL, "executable": sys.executable, "version": sys.version,
            "optbuild": __version__, "flags": repr(sys.flags), "uid": os.getuid(),
            "path": noopstamp.python_path(), "env": env, "limits": limits(), **world()}


def world() -> dict[str, object]:
    """The mount namespace and root folder this process sees files through: a client in
    another (``unshare -m``, a container, ``chroot``) may see other files, or the same ones
    read-only, at the same paths."""
    found: dict[str, object] = {}
    for name, path in (("mount_namespace", "/proc/self/ns/mnt"), ("root", "/proc/self/root")):
        try:
            st = os.stat(path)
            found[name] = [st.st_dev, st.st_ino]
        except OSError:
            found[name] = None
    return found


def differences(ours: dict, theirs: dict) -> list[str]:
    """What differs between two identities; an environment variable by its name only (its
    value may be a secret)."""
    found = []
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) == theirs.get(key):
            continue
        if key == "env" and isinstance(ours.get(key), dict) and isinstance(theirs.get(key), dict):
            mine, other = ours[key], theirs[key]
            names = sorted(n for n in set(mine) | set(other) if mine.get(n) != other.get(n))
            found.append(f"environment: {', '.join(names)}")
        else:
            found.append(key.replace("_", " "))
    return found


def limits() -> dict[str, object]:
    """What a build inherits from the process that starts it and a server could not give it
    otherwise: the nice level (a server cannot lower its own), the CPUs it may use
    (taskset), the resource limits (ulimit) and the control group (systemd-run, a
    container's cgroup). A client under others is served by a server started under its
    own: the server declines it, and the client starts one."""
    import resource

    found: dict[str, object] = {"nice": os.getpriority(os.PRIO_PROCESS, 0),
                                "cpus": sorted(os.sched_getaffinity(0))}
    for name in _RLIMITS:
        if (which := getattr(resource, name, None)) is not None:
            found[name] = list(resource.getrlimit(which))
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as cgroup:
            found["cgroup"] = cgroup.read()
    except OSError:
        pass
    return found


def peer_creds(sock) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of the Unix socket ``sock`` (SO_PEERCRED)."""
    import socket
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def peer_uid(sock) -> int:
    return peer_creds(sock)[1]


def same_user(uid: int) -> bool:
    """Whether a peer with ``uid`` may use (or serve) this user's builds."""
    return uid == os.getuid()


def connect(root: str, timeout: float | None = None):
    """A socket connected to the server of ``root``, checked to run as this user; None if
    none answers the connection. PermissionError if its folder is not private, or the
    server runs as another user."""
    import socket

    try:
        folder = PrivateDir(socket_dir(root), create=False)
    except FileNotFoundError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        with folder:
            sock.connect(folder.file(socket_name(root)))
    except OSError:  # ConnectionRefusedError, FileNotFoundError, a full backlog...: none answers
        sock.close()
        return None
    if not same_user(uid := peer_uid(sock)):
        sock.close()
        raise PermissionError(f"the build server's socket belongs to uid {uid}, not {os.getuid()}")
    return sock


def send(sock, doc: dict, fds: list[int] | None = None) -> None:
    import json
    import socket

    socket.send_fds(sock, [json.dumps(doc).encode(errors="surrogateescape")], fds or [])


def recv(sock) -> dict | None:
    """The next message; None when the other end has closed."""
    import json

    data = sock.recv(MAX_REQUEST)
    return json.loads(data) if data else None


def request(root: str, doc: dict, timeout: float = 10.0) -> dict | None:
    """One request and its answer (status, stop); None when no server runs."""
    sock = connect(root, timeout)
    if sock is None:
        return None
    with sock:
        send(sock, doc)
        return recv(sock)


def claim(root: str) -> tuple[PrivateDir, int]:
    """The project's server address, this process's: its private folder, and its lock file
    held (flock; with this pid in it) for as long as this process runs, a stale socket of a
    server that died replaced. Waits a little for a server that is ending (it declined a
    client); BlockingIOError if another one runs."""
    import time

    from optbuild.common.flock import try_lock

    folder = PrivateDir(socket_dir(root), create=True)
    fd = os.open(folder.file(lock_name(root)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + 3
    while not try_lock(fd):
        if time.monotonic() > deadline:
            os.close(fd)
            folder.close()
            raise BlockingIOError(f"another build server holds {lock_name(root)}")
        time.sleep(0.1)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    try:
        os.unlink(folder.file(socket_name(root)))
    except FileNotFoundError:
        pass
    return folder, fd
