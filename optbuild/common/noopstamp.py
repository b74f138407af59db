"""The no-op stamp: what an ok ``optbuild build`` records for the fast path
(``optbuild.cli.noop`` checks it, ``optbuild.app.noop_record`` writes it), where it lies, and
the facts of the process and the host it is keyed on (the build server, which runs builds
for its clients, passes their start and checks their host the same way).

Importing this module costs only the standard library's os, sys and time (and optbuild.common's
projectroot, quickhash and signatures, which need no more).

**Record.** A ``build`` that ends ok (exit 0) writes ``<build folder>/.optbuild/noop.json``
(atomically, after the steps' records beside it) holding:

- the invocation: the arguments after ``build``, kept as written and compared as
  ``answer_args`` reads them: all but ``-j/--jobs N`` and ``-k/--keep-going``, which cannot
  change a no-op's answer (``-C`` enters through the project root it leads to), the project
  root and build folder, and keyed digests of the
  environment that reaches the answer: every ``OPTBUILD_*`` variable (except
  ``OPTBUILD_DEBUG_FASTPATH``), every ``CUDA_*`` and ``NVIDIA_*`` one, ``LD_LIBRARY_PATH``
  and ``LD_PRELOAD``. Some are secrets (``OPTBUILD_SIGNING_KEY``...), so each digest is a
  blake2b keyed with a random per-user salt, ``$XDG_CACHE_HOME/optbuild/noop-salt`` (else
  ``~/.cache/optbuild/noop-salt``), which only its owner may read (0600, refused
  otherwise): the stamp itself holds nothing worth guessing from, and follows the umask as
  every file optbuild writes does. Without a usable salt, nothing is recorded;
- the interpreter: ``sys.executable``, ``sys.version`` and ``sys.path`` (as at start-up);
- host facts: the content of /proc/sys/kernel/random/boot_id (a reboot may bring another
  driver, GPU or kernel), the names under /dev starting with ``nvidia`` (GPUs, MIG
  capabilities) and the content of /proc/driver/nvidia/version (the driver). The
  fingerprint has no file or environment override for ``build`` beyond
  ``CUDA_VISIBLE_DEVICES``, which the environment digest covers;
- the stat signature (mtime_ns, ctime_ns, size, inode; or "absent") of everything the
  whole answer was read from: optbuild.toml, every recipe none of whose steps was recorded,
  the templates, every folder a recipe pattern scans, project-local kind files, every file
  the FileHasher was asked about that no one step owns (the modules that pyimports follows
  from a kind), the folder holding each of these (a new module beside them is seen), the
  source file of every non-stdlib module the build had imported (optbuild and its step
  kinds, pydantic...), every ``sys.path`` entry (installing or upgrading a package changes
  site-packages), the interpreter and the lock file. A folder that did not change while the
  build ran is signed by the names it holds (``names_signature``): a file saved by renaming
  a new one over it leaves them as they were (its own signature tells), a file added or
  removed does not. optbuild.lock's folder (the project's) is signed so too when only the
  build's own writes there changed it (the lock file, a first build's build/ and cache/),
  which its times cannot tell from anyone else's change (``note_written_folder``);
- per step, in the order the build reported them: the signatures of what that step alone
  was decided from (its recipe file, its own key files and the folders whose names decide
  them, ``Step.key_folders``: none for a file its recipe names, the folder of a listed data
  folder's files or of a Python file whose imports resolve there; its
  cache entry, present or absent, so that a cache pulled later is seen; its blobs, its step
  folder and outputs: a blob whose output is its hard link, recorded with the output's
  signature, is checked by the output's alone, as unlinking or replacing either name changes
  the inode's ctime), by their place in one table after the whole answer's (steps share
  files: the fast path stats each once; ``optbuild.common.sigtable``, where a folder of cache
  entries vouches for the entries in it with one stat). Beside the stamp, in ``noop-steps.json`` (named by
  the stamp's ``part``, read only when a step's own file changed or could not vouch): each
  step's places in that table, its recipe, the steps it reads, what it said as the no-op that
  follows says it (a step built or restored is cached; its key, reasons, error and warnings)
  and, for a deploy step, the model name it publishes; and per recipe, the recipes its steps
  read from. When only some steps' files changed, a build loads what that reaches
  (``optbuild.common.noopreach``);
- what the build said (its step lines, the reasons it grouped, its counts) and its
  cache-statistics record.

Nothing is recorded after ``--json``, ``--retry-failed``, ``--no-build`` or ``--remote URL``
(the stamp keeps its arguments verbatim, and a URL may carry credentials). ``--no-remote``
is recorded as any argument is: its stamp serves only ``build --no-remote``.

**A remote cache** (``[remote] url``, $OPTBUILD_REMOTE): only a local miss asks it, and
its contents are described by no local signature. So with one configured, the stamp is
recorded only when every selected step ended in the local cache (cached, built or restored
in this run: the next build finds each there, so the remote cannot change its answer; the
stamp's signatures of the local entries see one that goes). A step left out of the local
cache (unavailable on this host, say) declines: the next build would ask the remote, which
may hold it by then. The replayed statistics record the remote with zero counts, as a
normal no-op's that never asks it.

A normal build removes the stamp before it starts, so a build that fails, is interrupted or
crashes leaves none.

**Racy timestamps** (git's racy-clean problem). A file changed within one timestamp tick of
the moment its signature was taken could change again without changing the signature. So
an input (anything outside the build and cache folders) whose mtime or ctime is not older
than ``RACY_NS`` (2 s: coarse and skewed clocks, 2 s file systems) before the build
*started* cannot vouch for what the build read by its times: it may have changed after.
Such an input up to ``HASH_MAX`` (``TEXT_MAX`` for a recipe or a module) vouches by content
instead, where the build knows what it read (the TOML text it loaded, the source it
compiled, the bytes it hashed) and the file still holds that: the digest is recorded and
each no-op reads the file and checks it (a project written just before its build, a recipe
edited and built at once). A recipe folder
that young vouches by its names when they give the recipes the build loaded. A product (in
the build or cache folders: outputs, cache entries, blobs, the lock file) is racy by its own
file system's clock, read as the recording begins (``signatures.file_system_clock``: an
unnamed file made there), with no margin: git's rule, since whatever changes it later is
stamped at or after that reading; where no clock can be read, by the 2 s margin against
the moment of recording. A racy product is read and its content digest recorded when it is
small or is the lock file (a build that changed a step rewrites it), a folder signed by its
names, else it cannot vouch either. A cache
entry that the build marked used (gc's last use, refreshed every few minutes) right after
reading and checking it whole keeps the signature that mark gave, as the decision memo
does. A step's own file that cannot vouch leaves that step to be decided again (with what
it reaches); any other makes the stamp unusable. An unusable stamp is still written, saying
why; the next normal build records a clean one.
"""

from __future__ import annotations

import os
import sys
import time

from optbuild.common.projectroot import CONFIG_NAME
from optbuild.common.quickhash import blake2b
from optbuild.common.sigtable import names_digest

FORMAT = 6  # 5 signatures as JSON lists; 4 content digests by blake2b; 3 held the steps' records itself
STAMP = os.path.join(".optbuild", "noop.json")  # under the build folder
STEPS = os.path.join(".optbuild", "noop-steps.json")  # the steps' records, read when some changed
SALT_NAME = "noop-salt"  # under $XDG_CACHE_HOME/optbuild
SALT_BYTES = 32
HASH_MAX = 256 << 10  # racy products up to this size are content-checked, larger ones decline
# A racy recipe or module up to this size too: the build parsed it whole, which costs far more
# than the no-op's read and hash (a recipe of 10,000 steps is 500 KB)
TEXT_MAX = 4 << 20
DEBUG_ENV = "OPTBUILD_DEBUG_FASTPATH"
# whether a build server runs the build does not change its answer
_ENV_IGNORED = (DEBUG_ENV, "OPTBUILD_SERVER", "OPTBUILD_SERVER_IDLE_S", "OPTBUILD_DEBUG_SERVER")
NOT_RECORDED = ("--json", "--retry-failed", "--no-build", "--remote")
# build's options that take no value, and those that take one (``answer_args`` keeps the token
# after any other option as the value it may be: that costs at most a normal build)
_FLAGS = ("--json", "--skip-unavailable", "--no-skip-unavailable", "--retry-failed", "--no-remote",
          "-k", "--keep-going", "--no-build", "-h", "--help")
_VALUED = ("-S", "--set", "--remote", "--executor", "--scheduler", "--download")
_ENV_PREFIXES = ("OPTBUILD_", "CUDA_", "NVIDIA_")
_ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
CACHED = ("cached", "built", "restored")  # all "cached" in the no-op that follows

_started_ns: int | None = None
_argv: list[str] | None = None
_sys_path: list[str] | None = None
_written_folders: dict[str, frozenset[str]] = {}  # ``note_written_folder``


def debug(message: str) -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        print(f"optbuild: fast path: {message}", file=sys.stderr)


def mark_start(argv: list[str], *, started_ns: int | None = None, sys_path: list[str] | None = None) -> None:
    """Called first by the CLI: the time, arguments and sys.path the build starts with (a
    build server passes its client's)."""
    global _started_ns, _argv, _sys_path
    _started_ns = time.time_ns() if started_ns is None else started_ns
    _argv = list(argv)
    _sys_path = python_path() if sys_path is None else list(sys_path)


def note_written_folder(path: str) -> None:
    """The names the folder ``path`` holds before the build writes there (the project's
    folder, where optbuild.lock is replaced whole and the first build makes build/ and
    cache/): ``vouched_folder`` then tells the build's own writes from anyone else's change,
    which its times cannot."""
    try:
        _written_folders[path] = frozenset(os.listdir(path))
    except OSError:
        _written_folders.pop(path, None)  # a build server's earlier build noted it


def vouched_folder(path: str, written: set[str]) -> str | None:
    """The names signature of ``path`` when it holds the names it held before the build
    (``note_written_folder``), those of ``written`` (what the build itself writes there: the
    lock file, the build and cache folders) aside; else None."""
    before = _written_folders.get(path)
    try:
        now = frozenset(os.listdir(path))
    except OSError:
        return None
    if before is None or now - written != before - written:
        return None
    return names_digest(now)


def invocation() -> tuple[list[str] | None, int | None]:
    """The arguments and start time ``mark_start`` was given (None, None before it)."""
    return _argv, _started_ns


def started_ns() -> int:
    """When the build started (mark_start), or now."""
    return time.time_ns() if _started_ns is None else _started_ns


def python_path() -> list[str]:
    """sys.path with its entries made absolute (as the imports will resolve them here)."""
    cwd = os.getcwd()
    return [os.path.abspath(os.path.join(cwd, p)) for p in sys.path]


def split_build_args(argv: list[str]) -> tuple[str | None, list[str]] | None:
    """(-C folder or None, the arguments after ``build``); None for any other command."""
    split = split_command_args(argv)
    return (split[1], split[2]) if split is not None and split[0] == "build" else None


def answer_args(command: str, args: list[str]) -> list[str] | None:
    """The arguments after ``command`` (``build`` or ``plan``) that can change the answer a
    stamp replays, compared with those of the recorded build. Left out of a build's: ``-j/--jobs
    N`` (how many steps run at once: a no-op runs none) and ``-k/--keep-going`` (whether a
    failed or unavailable step stops the build: an ok build, and so the no-op after it, has
    none that would), as ``-j 2``, ``-j2``, ``--jobs 2``, ``--jobs=2`` (N in digits), ``-k``
    and ``--keep-going``. Plain string handling (no argparse on the fast path) that reads them
    as argparse does: none after ``--`` or in the place of an option's value, and none between
    two targets (argparse refuses ``build a -j 2 b``, which ``build a b``'s stamp must not
    answer: then all are kept). Any other argument or spelling (``--job 2``, ``-kj2``) stays
    and is compared as written. A ``plan`` has neither option (``plan -j 2`` is an error, which
    no stamp answers): None, equal to nothing, when one of its arguments may be an option only
    ``build`` has; else all of them."""
    if command != "build":
        return None if any(map(_build_only, args)) else list(args)
    kinds: list[str] = []  # per argument: "drop", "option", "value", "value?" (perhaps a target), "target"
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            kinds.extend(["target"] * (len(args) - i))
            break
        if arg in ("-j", "--jobs") and i + 1 < len(args) and _count(args[i + 1]):
            kinds.extend(["drop", "drop"])
            i += 2
            continue
        if arg in ("-k", "--keep-going") or (arg.startswith("--jobs=") and _count(arg[7:])) \
                or (arg.startswith("-j") and _count(arg[2:])):
            kind = "drop"
        elif not arg.startswith("-") or arg == "-" or arg[1:2].isdigit() or arg[1:2] == ".":
            kind = "target"  # argparse takes "-5" for an argument, as no option looks like it
        elif arg in _FLAGS or "=" in arg:
            kind = "option"
        else:  # an option that takes a value, or one of another spelling that may
            kinds.append("option")
            i += 1
            if i < len(args):
                if args[i] == "--":  # its value, or the end of the options: the rest as written
                    kinds.extend(["value"] * (len(args) - i))
                    break
                kinds.append("value" if arg in _VALUED else "value?")
                i += 1
            continue
        kinds.append(kind)
        i += 1
    kept = [a for a, kind in zip(args, kinds) if kind != "drop"]
    # between two targets, a dropped argument joins what argparse refuses: all kept as written
    joined = "".join("t" if kind in ("target", "value?") else "d" if kind == "drop" else "o" for kind in kinds)
    return list(args) if any(joined[j - 1] == "t" and joined[j:].lstrip("d")[:1] == "t"
                             for j in range(1, len(joined)) if joined[j] == "d") else kept


def _build_only(arg: str) -> bool:
    """Whether argparse may read ``arg`` as (or as holding) an option that ``build`` has and
    ``plan`` has not: ``-j``, ``-k`` (alone or among short flags before ``-S``), or
    ``--jobs``, ``--keep-going``, ``--no-build`` (or an abbreviation of one)."""
    if arg.startswith("--"):
        name = arg.partition("=")[0]
        return len(name) > 2 and any(o.startswith(name) for o in ("--jobs", "--keep-going", "--no-build"))
    if arg.startswith("-"):
        for c in arg[1:]:
            if c in "jk":
                return True
            if c == "S":  # the rest is its value
                break
    return False


def _count(text: str) -> bool:
    """Whether ``text`` is a count of jobs as argparse reads it (a plain one: 0 or more)."""
    return text.isascii() and text.isdigit()


def split_command_args(argv: list[str]) -> tuple[str, str | None, list[str]] | None:
    """(``build`` or ``plan``, -C folder or None, the arguments after the command); None for
    any other command."""
    directory, i = None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-C", "--directory") and i + 1 < len(argv):
            directory, i = argv[i + 1], i + 2
        elif arg.startswith("--directory="):
            directory, i = arg.partition("=")[2], i + 1
        elif arg.startswith("-C") and len(arg) > 2:
            directory, i = arg[2:], i + 1
        else:
            break
    if i >= len(argv) or argv[i] not in ("build", "plan"):
        return None
    return argv[i], directory, argv[i + 1:]


def _build_dir_setting(config_text: str) -> str:
    """``[project] build_dir`` as a plain one-line string, read without a TOML parser. Only a
    guess: the stamp found there must name this folder, and optbuild.toml must be unchanged
    since the build that parsed it properly wrote that stamp."""
    table = ""
    for line in config_text.splitlines():
        text = line.strip()
        if text.startswith("["):
            table = text.strip("[] \t").split("]")[0].strip()
            continue
        name, sep, value = text.partition("=")
        if table == "project" and sep and name.strip() == "build_dir":
            value = value.strip()
            if value[:1] in ("'", '"'):
                end = value.find(value[0], 1)
                if end > 0:
                    return value[1:end]
    return "build"


def build_dir_of(root: str) -> str:
    """The build folder of the project at ``root`` as ``_build_dir_setting`` guesses it."""
    try:
        with open(os.path.join(root, CONFIG_NAME), encoding="utf-8", errors="replace") as f:
            setting = _build_dir_setting(f.read())
    except OSError:
        setting = "build"
    return os.path.abspath(os.path.join(root, setting))


def content_digest(path: str) -> str:
    """The digest of a file's bytes, as the cache names blobs (a file the build hashed is
    checked against the digest it was read with)."""
    with open(path, "rb") as f:
        return bytes_digest(f.read())


def bytes_digest(data: bytes) -> str:
    """``optbuild.common.digest.digest_bytes``, without importing that module (sqlite3 and
    more: 10 ms of a no-op's 40)."""
    from blake3 import blake3

    return blake3(data).hexdigest()


def salt_path() -> str:
    """Where this user's salt lives: beside the node cache, outside any project (a build
    folder that is copied or shared takes no salt with it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "optbuild", SALT_NAME)


def _read_salt(path: str) -> bytes:
    """The salt at ``path``; PermissionError when anyone but its owner (this user) could
    read it, since a salt others know no longer hides what it keys."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} is not private to this user (mode {st.st_mode & 0o777:o}, "
                                  f"owner {st.st_uid}); remove it and a new one is made")
        data = os.read(fd, SALT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != SALT_BYTES:
        raise ValueError(f"{path} holds {len(data)} bytes, not {SALT_BYTES}; remove it and a new one is made")
    return data


def _make_salt(path: str) -> None:
    """A new random salt at ``path`` (0600, in a 0700 folder), unless another build made one
    first: the file appears whole or not at all (a hard link of a finished temp file)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(SALT_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def salt(*, create: bool) -> bytes:
    """This user's salt; with ``create``, made when there is none. OSError or ValueError
    when there is none (and not ``create``) or it cannot be trusted."""
    path = salt_path()
    if create and not os.path.lexists(path):
        _make_salt(path)
    return _read_salt(path)


def salt_id(key: bytes) -> str:
    """Names the salt a stamp was keyed with, so that a stamp of another user (or of another
    $XDG_CACHE_HOME) is declined as such; reveals nothing of the salt."""
    return blake2b()(b"optbuild noop salt id", digest_size=8, key=key).hexdigest()


def env_digests(key: bytes) -> dict[str, str]:
    """Digests, keyed with the salt ``key``, of the environment variables the answer can
    depend on: any of them may be a secret (a signing key), so no digest is one an
    attacker could compute from a guess."""
    hasher = blake2b()
    return {name: hasher(value.encode(errors="surrogateescape"), digest_size=16, key=key).hexdigest()
            for name, value in sorted(os.environ.items())
            if (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES) and name not in _ENV_IGNORED}


def host_facts() -> dict[str, object]:
    """What tells this boot and its GPUs apart: the boot id, /dev/nvidia*, the driver."""

    def read(path: str) -> str | None:
        try:
            with open(path, "rb") as f:
                return f.read(4096).decode(errors="replace")
        except OSError:
            return None

    try:
        devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    except OSError:
        devices = []
    return {"boot_id": read("/proc/sys/kernel/random/boot_id"), "nvidia_devices": devices,
            "nvidia_driver": read("/proc/driver/nvidia/version")}


def python_identity() -> dict[str, object]:
    return {"executable": sys.executable, "version": sys.version, "path": build_path()}


def build_path() -> list[str]:
    """The sys.path of the build: as the client gave it, or this process's."""
    return _sys_path if _sys_path is not None else python_path()


def shown(path: str, root: str) -> str:
    if path == root:
        return "the project folder"
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


# --- recording ------------------------------------------------------------------------
def stamp_path(build_dir: os.PathLike | str) -> str:
    return os.path.join(os.fspath(build_dir), STAMP)


def steps_path(build_dir: os.PathLike | str) -> str:
    return os.path.join(os.fspath(build_dir), STEPS)


def forget(build_dir: os.PathLike | str) -> None:
    """Remove the stamp: called before a normal build, so that only an ok build leaves one."""
    try:
        os.unlink(stamp_path(build_dir))
    except FileNotFoundError:
        pass
    except OSError as exc:  # a read-only build folder: fail safe, never a stale stamp
        debug(f"cannot remove the stamp ({exc}); it may stay in place, unusable")
