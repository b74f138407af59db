"""Ctrl-Z for a build that runs in the server. A local build's processes share the terminal's
foreground process group, so SIGTSTP stops them all; the server runs in a session of its
own, so the client asks it to stop its build, and it stops every process below it with
SIGSTOP: the fork servers, the steps forked from them, and whatever those started. Its own
threads run on (they only wait for those processes), and a process started while the build
is stopped is stopped too at the next sweep. Linux (/proc)."""

from __future__ import annotations

import os
import signal

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
