"""A client's signals for the build that runs in the server for it (``watch_client``): Ctrl-C
and SIGTERM cancel it, a client gone cancels it too, and Ctrl-Z stops it. A local build's processes share the terminal's
foreground process group, so SIGTSTP stops them all; the server runs in a session of its
own, so the client asks it to stop its build, and it stops every process below it with
SIGSTOP: the fork servers, the steps forked from them, and whatever those started. Its own
threads run on (they only wait for those processes), and a process started while the build
is stopped is stopped too at the next sweep. Linux (/proc)."""

from __future__ import annotations

import os
import signal
from typing import Any

SWEEP_S = 0.25  # while stopped: how soon a process started since is stopped too


def descendants(pid: int) -> set[int]:
    """The pids of every process below ``pid`` (children, their children...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])  # after the name, which may hold ")"
        except (OSError, IndexError, ValueError):  # it ended meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class Suspension:
    """The processes below ``pid`` stopped (``stop``, again for those started since) and
    continued (``resume``), the ones stopped included when they have left the tree since."""

    def __init__(self, pid: int):
        self.pid = pid
        self.stopped: set[int] = set()
        self.active = False

    def stop(self) -> None:
        self.active = True
        for pid in descendants(self.pid) - self.stopped:
            if _signal(pid, signal.SIGSTOP):
                self.stopped.add(pid)

    def resume(self) -> None:
        if not self.active:
            return
        self.active = False
        for pid in self.stopped | descendants(self.pid):
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except OSError:  # it ended
        return False
    return True


def watch_client(conn, main_thread: int, state: Any, build_id: int) -> None:
    """Act on the client's signals for the build (the main thread): the first Ctrl-C or
    SIGTERM cancels it, Ctrl-Z stops its processes and SIGCONT resumes them; a client gone
    resumes them and cancels it as SIGTERM would. ``state``: the server's (``server._State``:
    its lock, whether it is building, which build, whether that one was cancelled)."""
    import json
    import signal

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


def client_gone(conn) -> bool:
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
