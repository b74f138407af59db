"""The build server: ``optbuild build`` handed to a process that stays loaded between builds
(as Gradle's and Bazel's daemons), its fork servers warm, so that a changed build pays for
the steps' own work and not for importing optbuild, pydantic and the steps' tools again.

Off unless asked (Linux only): ``[build] server = true`` in optbuild.toml or
``OPTBUILD_SERVER=1`` turns it on, ``OPTBUILD_SERVER=0`` off whatever the project says. Its
gain is a fraction of a second per changed build; where it is on, it must never be less
correct than an in-process build. An optbuild.toml that does not parse is reported by the
build itself, before any server is consulted; a build that ends in an error (an invalid
project) or a cancel starts none.

**Client** (``client``; standard library only, imported after the no-op fast path
declined): connects to the project's server over a Unix socket and sends, in one message,
the arguments, the working folder, the whole environment, the umask, the moment the build
started and its identity (``protocol.identity``); once the server answers that it will run
the build, its stdin, stdout and stderr (SCM_RIGHTS): the server writes straight to the
user's terminal, and a server that is busy or stuck never holds it open. Ctrl-C, SIGTERM,
SIGHUP and Ctrl-Z are forwarded as messages (``jobcontrol`` stops the build's processes);
the server answers with the exit code. With no server running the build runs in-process as
without one, and a server is started once it has ended (its imports would compete with the
build's for the CPU; it is ready for the next build). A server seen stopped (SIGSTOP, a
debugger), or silent for ``client.WAIT_LIMIT_S`` (a long build for another client, or
hung), does not hold the build: the client names its pid and how to end it, and builds
in-process.

**Address.** A socket in a private folder: ``$XDG_RUNTIME_DIR/optbuild`` where that is
set, else the build folder's ``.optbuild/server``, made 0700 and checked (a folder, not a
link, this user's, closed to others) before each use, then reached through
``/proc/self/fd`` (no swap after the check; no 108-byte ``sun_path`` limit). Another user
can neither take the name first nor connect; both ends still check the other's uid
(SO_PEERCRED), and refused connections are logged once, then counted per minute. Beside
the socket, a lock file the server holds (flock) while it runs, with its pid: ``server
status`` and ``server stop`` find a server that does not answer; ``stop`` asks, then sends
SIGTERM (and SIGCONT), then SIGKILL.

**Staleness.** The server (``server``) declines (and exits; the client builds in-process
and starts a fresh one) when the client's interpreter, ``sys.path``, interpreter flags,
optbuild version, environment (what its steps would see: every variable but ``PWD``,
``OLDPWD``, ``_`` and the server's own switches; named, never shown, in the reason), nice
level, CPU affinity, resource limits, control group, mount namespace or root folder, or the
host (boot id, ``/dev/nvidia*``, driver version) differ from the server's; when any file of
a module it has loaded (optbuild, step kinds, plugins, pydantic..., found in
``sys.modules``) changed since it was read (a package installed is seen by the entry-point
scan, read again per build, and by the import system, whose folder caches are dropped per
build). A file changed less than ``signatures.RACY_NS`` before it could have been imported cannot
vouch for itself: the server then ends after that build. The fork servers report their own
modules the same way; a changed one or a dead one restarts them. No optbuild cache outlives
a build (``session``): every ``functools`` cache of an optbuild module and the warn-once
sets are cleared before each, and the temporary folder is looked up again. A build that
leaves a thread running (a remote transfer stalled past its timeout, blocked in a read)
ends the server after it, and the thread with it.

**Lifetime.** It ends after ``OPTBUILD_SERVER_IDLE_S`` (else ``[build] server_idle_s``)
seconds without a build (default 900), when its project folder is removed or replaced, on
``optbuild server stop``, and on SIGTERM (cancelling a build as a local SIGTERM would). Its
fork servers and their step children die with it (PR_SET_PDEATHSIG, tied to a thread that
lives as long as the server). A client that disappears mid-build (its socket closes, as
when Ctrl-\\ kills it) cancels the build as SIGTERM would.
"""
