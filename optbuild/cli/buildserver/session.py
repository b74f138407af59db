"""A build in the server as in a fresh ``optbuild`` process of the client: its environment,
folder, umask, arguments and terminal borrowed for the build's duration, and no optbuild
cache left from the build before."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from optbuild.common import processstate
from optbuild.process.forkserver import set_environment


class client_context:
    """The client's environment, folder, umask, argv and stdio for the build's duration;
    after it, the server's again, in ``home``."""

    def __init__(self, doc: dict, fds: list[int], home: str):
        self.doc, self.fds, self.home = doc, fds, home
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
        for out in (sys.stdout, sys.stderr):
            out.flush()
        for target, fd in enumerate(self.fds):
            os.dup2(fd, target)
            os.close(fd)
        self.fds.clear()
        set_environment(doc["env"])
        _forget_tempdir()
        self.saved_umask = os.umask(int(doc["umask"]))
        os.chdir(doc["cwd"])
        sys.argv = ["optbuild", *doc["argv"]]
        wrap = doc.get("stdio") or {}

        def stream(fd: int, mode: str, line_buffering: bool = False, errors: str | None = None) -> TextIO:
            import io

            encoding, theirs = (wrap.get(str(fd)) or [None, None])[:2]
            return io.TextIOWrapper(open(fd, mode + "b", closefd=False), encoding=encoding or "utf-8",
                                    errors=errors or theirs or "strict", line_buffering=line_buffering)

        sys.stdin = stream(0, "r")
        sys.stdout = stream(1, "w", line_buffering=os.isatty(1))
        sys.stderr = stream(2, "w", line_buffering=True, errors="backslashreplace")

    def __exit__(self, *exc: object) -> None:
        import logging

        for out in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if out is not None:
                    out.flush()
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
            set_environment(self.saved_env)
            _forget_tempdir()
        try:
            os.chdir(self.home)
        except OSError:
            os.chdir("/")


def _forget_tempdir() -> None:
    """The temporary folder is found again from the environment now in force: ``tempfile``
    keeps the one it found first, which may be another client's, or gone since (a fresh
    process falls back to /tmp then)."""
    import tempfile

    tempfile.tempdir = None


def fresh_caches() -> None:
    """What a fresh process would have: every functools cache of an optbuild module cleared
    (the plugin entry points are read again), what modules remember for the process
    forgotten (``common.processstate``: the warn-once sets), and the import
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
    processstate.reset()
