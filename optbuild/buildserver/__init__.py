"""The build server: ``optbuild build`` handed to a process that stays loaded between builds
(as Gradle's and Bazel's daemons), its fork servers warm, so that a changed build pays for
the steps' own work and not for importing optbuild, pydantic and the steps' tools again.

On by default on Linux, except where ``$CI`` is set; ``[build] server = false`` in
optbuild.toml turns it off for a project, ``OPTBUILD_SERVER=0`` or ``1`` either way.

**Client** (``client``; standard library only, imported after the no-op fast path
declined): connects to the project's server over a Unix socket and sends, in one message,
the arguments, the working folder, the whole environment, the umask, the moment the build
started and its identity (``protocol.identity``), with its stdin, stdout and stderr
attached (SCM_RIGHTS): the server writes straight to the user's terminal. Ctrl-C, SIGTERM,
SIGHUP and Ctrl-Z are forwarded as messages (``jobcontrol`` stops the build's processes);
the server answers with the exit code. With no server running the build runs in-process as
without one, and a server is started once it has ended (its imports would compete with the
build's for the CPU; it is ready for the next build).

**Address.** A Linux abstract socket named from a hash of the uid and the project's real
path (no file; no 108-byte ``sun_path`` limit). Anyone on the host can connect to an
abstract socket, so both ends check the other's uid (SO_PEERCRED): the server serves only
its own uid; the client talks only to a server of its own uid (another user squatting the
name would otherwise receive the client's environment and terminal).

**Staleness.** The server (``server``) declines (and exits; the client builds in-process
and starts a fresh one) when the client's interpreter, ``sys.path``, interpreter flags,
optbuild version, ``PYTHON*``/``LD_LIBRARY_PATH``/``LD_PRELOAD`` variables, nice level,
CPU affinity, resource limits or control group, or the host (boot id, ``/dev/nvidia*``,
driver version) differ from the server's; when any file of a module it has loaded
(optbuild, step kinds, plugins, pydantic..., found in ``sys.modules``) changed since it
was read (a package installed is seen by the entry-point scan, read again per build, and
by the import system, whose folder caches are dropped per build). A file changed less
than ``noop.RACY_NS`` before it could have been imported cannot vouch for itself: the server
then ends after that build. The fork servers report their own modules the same way; a
changed one, a dead one, or a client environment other than the one they were started with
(``PWD``, ``OLDPWD`` and ``_`` aside) restarts them. No optbuild cache outlives a build
(``session``): every ``functools`` cache of an optbuild module and the warn-once sets are
cleared before each.

**Lifetime.** It ends after ``OPTBUILD_SERVER_IDLE_S`` (else ``[build] server_idle_s``)
seconds without a build (default 900), when its project folder is removed or replaced, on
``optbuild server stop``, and on SIGTERM (cancelling a build as a local SIGTERM would). Its
fork servers and their step children die with it (PR_SET_PDEATHSIG, tied to a thread that
lives as long as the server). A client that disappears mid-build (its socket closes, as
when Ctrl-\\ kills it) cancels the build as SIGTERM would.
"""
