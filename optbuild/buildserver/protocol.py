"""What client and server share: the switches, the address, the identity a server must
share with its client, and the messages (one JSON document per SOCK_SEQPACKET packet, file
descriptors attached with SCM_RIGHTS). Standard library only: the client imports it."""

from __future__ import annotations

import os
import sys

ENV_SWITCH = "OPTBUILD_SERVER"
ENV_IDLE = "OPTBUILD_SERVER_IDLE_S"
ENV_DEBUG = "OPTBUILD_DEBUG_SERVER"
DEFAULT_IDLE_S = 900.0
LOG = os.path.join(".optbuild", "server.log")  # under the build folder
LOG_KEPT_BYTES = 1 << 20  # a server starting beside a larger log moves it to server.log.1
MAX_REQUEST = 1 << 20
PROTOCOL = 2
# Variables that change what the interpreter or native libraries load: a server started
# under other values is not this client's.
_IDENTITY_PREFIXES = ("PYTHON",)
_IDENTITY_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
# Limits a build inherits from the process that runs it (see limits()).
_RLIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK",
            "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_RSS", "RLIMIT_STACK")


def debug(message: str) -> None:
    if os.environ.get(ENV_DEBUG, "") not in ("", "0"):
        print(f"optbuild: server: {message}", file=sys.stderr, flush=True)


def enabled(root: str | None = None) -> bool:
    """Whether ``optbuild build`` of the project at ``root`` uses a build server (Linux
    only): ``OPTBUILD_SERVER`` when set (1 or 0), else ``[build] server`` of its
    optbuild.toml, else on unless ``$CI`` is set (a CI job's machine is thrown away after
    one build: a server would only linger)."""
    if not sys.platform.startswith("linux"):
        return False
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch:
        return switch in ("1", "true", "yes", "on")
    if root is None:
        return False
    given = setting(root, "server", None)
    if isinstance(given, bool):
        return given
    return os.environ.get("CI", "").strip().lower() in ("", "0", "false", "no")


def setting(root: str, name: str, default: object) -> object:
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


def idle_limit(root: str) -> float:
    """Seconds a server waits for its next build: $OPTBUILD_SERVER_IDLE_S, else
    ``[build] server_idle_s``, else 900."""
    given = os.environ.get(ENV_IDLE) or setting(root, "server_idle_s", DEFAULT_IDLE_S)
    try:
        value = float(given)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        print(f"warning: the build server's idle time {given!r} is not a number of seconds; using "
              f"{DEFAULT_IDLE_S:g}", file=sys.stderr)
        return DEFAULT_IDLE_S
    return value if value > 0 else DEFAULT_IDLE_S


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
    optbuild's version, the variables that change what gets loaded, and the limits a build
    runs under."""
    from optbuild import __version__, noop

    env = {name: value for name, value in os.environ.items()
           if name.startswith(_IDENTITY_PREFIXES) or name in _IDENTITY_NAMES}
    return {"protocol": PROTOCOL, "executable": sys.executable, "version": sys.version,
            "optbuild": __version__, "flags": repr(sys.flags), "uid": os.getuid(),
            "path": noop.python_path(), "env": env, "limits": limits()}


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


def peer_uid(sock) -> int:
    """The uid of the process at the other end of the Unix socket ``sock`` (SO_PEERCRED)."""
    import socket
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def same_user(uid: int) -> bool:
    """Whether a peer with ``uid`` may use (or serve) this user's builds."""
    return uid == os.getuid()


def connect(root: str, timeout: float | None = None):
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
