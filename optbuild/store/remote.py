"""The remote cache: the local store's layout behind an fsspec URL, shared between hosts.

    <url>/cas/<2 hex>/<62 hex>        blobs (BLAKE3-256, so any copy is as good)
    <url>/ac/<2 hex>/<62 hex>.json    action entries (ActionEntry JSON, optionally signed)
    <url>/ac/<2 hex>/<62 hex>.<key id>.json   a key holder's entry beside one signed with another key
    <url>/tmp/                        uploads in flight, on file systems that can rename

Reading (a local miss): the entry is fetched by key and validated (its key, every digest
a BLAKE3-256 digest, output paths inside the output folder, the HMAC signature when a signing key is
configured); every blob it names is downloaded to a temporary file, checked against its
size and digest and only then put into the local store; the entry is stored locally last.
Anything wrong is a miss with a warning, never a wrong hit, and nothing unverified reaches
the local store.

Writing (after a local build): blobs first, then the entry, so the remote never names a
blob it lacks. Blobs already there are skipped (unless one was found corrupt in this run).
On file systems that rename (file://, a shared mount) everything is written under tmp/ and
renamed into place; on object stores (s3://, gs://, ...) a single PUT (or a completed
multipart upload) is atomic per object. Two writers of one key each publish a complete,
valid entry; the last one wins, and both name blobs that are present.

Signing: a signed entry names the key that signed it (``key_id``). An entry that is
unsigned, or whose signature fails under the key it names, is no one's good result: a key
holder replaces it, blaming the entry. An entry signed with another key is never replaced,
so a misconfigured host cannot undo the build farm's signed results; a key holder keeps its
own entry beside it (``entry_path(key, slot)``) and reads it there from then on, so a
forged key id costs it one build, not one per build. A host without a key never replaces a
signed entry.

On a local file system (file://, a mount) every path is resolved before it is read,
written or renamed into, and refused unless it stays under the remote's root: a symbolic
link planted in the remote (``cas/ab -> /home/you``) cannot redirect a transfer.

Faults (connection refused, timeouts, HTTP errors, slow responses) never fail a build: each
is a warning event and an error count; after ``max_errors`` of them the remote is disabled
for the rest of the run (circuit breaker) and steps build locally.

What a whole run did with the caches (hits, misses, the stats file) is ``optbuild.builder.runstats``;
``cache push`` / ``cache pull`` over a workspace are ``optbuild.cli.transfer``. This module, as
all of ``optbuild.store``, imports nothing above the store layer: warnings go to any
``EventSink`` (a Reporter is one), and the settings come as plain values.

This module imports nothing heavy: fsspec (and s3fs, gcsfs, ...) load on the first remote
operation, so a fully cached build never pays for them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from optbuild.common.digest import hash_file, new_hasher
from optbuild.common.events import Event, warning
from optbuild.store.entry import (
    MAX_ENTRY_BYTES,
    ActionEntry,
    EntryError,
    canonical_json,
    is_digest,
    parse_entry,
)

if TYPE_CHECKING:
    from optbuild.store.local import LocalStore

ENV_URL = "OPTBUILD_REMOTE"
SIGNATURE_PREFIX = b"optbuild-hmac-sha256 "
_KEY_ID_HEX = 16
_SIGNATURE_LINE = len(SIGNATURE_PREFIX) + _KEY_ID_HEX + 1 + 64 + 1  # the longest: with a key id
# "<prefix><key id> <hmac>"; lines without a key id were written before key ids existed
_SIGNATURE = re.compile(rb"optbuild-hmac-sha256 (?:([0-9a-f]{%d}) )?([0-9a-f]{64})" % _KEY_ID_HEX)
_OFF = {"off", "none", "no", "false", "0"}
_RENAMING = {"file", "local", "sftp", "ssh"}  # protocols whose mv is an atomic rename
_LOCAL = {"file", "local"}  # protocols whose paths are this host's paths (symlinks resolvable)
_CHUNK = 8 << 20
_SLOWEST_UPLOAD_BPS = 1 << 20  # an upload's first progress report may come only after this rate


class _Failed(Exception):
    """A remote operation failed; it has been counted and reported. The message says how."""


class Rejected(Exception):
    """What the remote sent is not acceptable (corrupt, unsigned, unsafe)."""


class RemoteMissing(Exception):
    """A remote folder on this host's file system that does not exist (an unmounted share):
    never created, as a folder made in its place would take what belongs on the share."""


class TransferError(Exception):
    """A blob could not be checked, uploaded or downloaded (``RemoteSession``'s blob
    methods, which the dask executor uses); the message says why."""


class EventSink(Protocol):
    """Where a session's warnings go: ``optbuild.builder.report.Reporter`` is one (this layer
    imports nothing above it, so it names only the one method it calls)."""

    def emit(self, event: Event) -> None: ...


# --- configuration ---------------------------------------------------------------------
def open_remote(url: str, override: str | bool | None = None, *, project_root: Path | None = None,
                environ: dict[str, str] | None = None, **settings: Any) -> RemoteStore | None:
    """The remote for this run, or None: ``--no-remote`` (False) > ``--remote URL`` (str) >
    $OPTBUILD_REMOTE (a URL, or off/none/0 to disable) > ``url`` (``[remote] url``).

    ``settings`` are RemoteStore's keyword arguments (``[remote]``'s other fields).
    Nothing is imported or contacted here.
    """
    environ = os.environ if environ is None else environ
    if override is False:
        return None
    chosen = override if isinstance(override, str) and override else None
    if chosen is None:
        env = environ.get(ENV_URL, "").strip()
        if env.lower() in _OFF:
            return None
        chosen = env or url
    if not chosen:
        return None
    if "://" not in chosen and not chosen.startswith("/") and project_root is not None:
        chosen = str((project_root / chosen).resolve())  # a plain relative path: from the project root
    return RemoteStore(chosen, environ=environ, **settings)


def redact(url: str) -> str:
    """``url`` without credentials (user:password@ in the authority)."""
    return re.sub(r"(://)[^/@]*@", r"\1***@", url)


# --- entry encoding and validation ---------------------------------------------------
def sign(body: bytes, key: bytes) -> str:
    """HMAC-SHA256 of an entry's exact bytes."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def key_id(key: bytes) -> str:
    """A name for a signing key that tells nothing of it (an HMAC of a constant): it lets a
    reader tell an entry signed with another key (someone's good result, left alone) from
    one whose signature fails under the key it names (altered or forged: replaced)."""
    return hmac.new(key, b"optbuild signing key id", hashlib.sha256).hexdigest()[:_KEY_ID_HEX]


def signature_line(body: bytes, key: bytes) -> bytes:
    """The line that signs ``body`` with ``key``, its newline included."""
    return SIGNATURE_PREFIX + f"{key_id(key)} {sign(body, key)}".encode() + b"\n"


def encode_entry(entry: ActionEntry, key: bytes | None) -> bytes:
    """The entry's canonical JSON; with a signing key, behind a line carrying its HMAC.

    The signature covers the bytes as sent, so a reader checks it before parsing anything.
    """
    body = canonical_json(entry.model_dump(mode="json"))
    return body if key is None else signature_line(body, key) + body


Verdict = Literal["valid", "unsigned", "bad", "foreign"]
_REFUSALS: dict[Verdict, str] = {
    "unsigned": "it is not signed, and a signing key is configured",
    "bad": "it is badly signed: its signature does not match (the entry was altered, or written without "
           "the signing key)",
    "foreign": "its signature does not match: it was signed with another key than this host's",
}


def check_signature(data: bytes, signing_key: bytes) -> tuple[Verdict, bytes]:
    """(verdict, body) of an entry's bytes under this host's key: "valid"; "unsigned" (no
    signature line); "bad" (a line that is no signature, or one that fails under the key it
    names, or names none: nobody's good result); "foreign" (it names another key)."""
    if not data.startswith(SIGNATURE_PREFIX):
        return "unsigned", data
    line, _, body = data.partition(b"\n")
    match = _SIGNATURE.fullmatch(line)
    if match is None:
        return "bad", body
    named, mac = match.groups()
    if named is not None and named.decode() != key_id(signing_key):
        return "foreign", body
    return ("valid" if hmac.compare_digest(mac, sign(body, signing_key).encode()) else "bad"), body


def decode_entry(data: bytes, expected_key: str, signing_key: bytes | None) -> ActionEntry:
    """The entry in ``data`` if it is safe to use as the entry of ``expected_key``.

    Raises Rejected saying why not: too large or too deep, not validly signed with this
    host's key (when one is configured; checked before the bytes are parsed), not an entry,
    filed under another key, or any rule of ``store.entry`` broken (digests, output names).
    """
    if len(data) > MAX_ENTRY_BYTES + _SIGNATURE_LINE:
        raise Rejected(f"it is larger than {MAX_ENTRY_BYTES} bytes")
    if signing_key is not None:
        verdict, data = check_signature(data, signing_key)
        if verdict != "valid":
            raise Rejected(_REFUSALS[verdict])
    elif data.startswith(SIGNATURE_PREFIX):
        data = data.partition(b"\n")[2]
    try:
        return parse_entry(data, expected_key)
    except EntryError as exc:
        raise Rejected(str(exc)) from None


def signed_by_another(data: bytes, expected_key: str, signing_key: bytes | None) -> bool:
    """Whether ``data`` is a valid entry of ``expected_key`` signed with a key this host
    lacks: one that names another key, or any signature at all when this host has none.

    Such an entry is someone's good result that this host cannot vouch for: replacing it
    would make every host holding the real key rebuild. An entry that is unsigned, invalid,
    or whose signature fails under this host's key while naming it (or naming none) is no
    one's good result, and a key holder replaces it.
    """
    if signing_key is None:
        line, _, body = data.partition(b"\n")
        if _SIGNATURE.fullmatch(line) is None:
            return False
    else:
        verdict, body = check_signature(data, signing_key)
        if verdict != "foreign":
            return False
    try:
        parse_entry(body, expected_key)
    except EntryError:
        return False
    return True


def replaced_fault(data: bytes, signing_key: bytes | None, refusal: Rejected) -> str:
    """What is wrong with an unacceptable remote entry that this host replaces, blaming the entry."""
    if signing_key is not None:
        verdict, _body = check_signature(data, signing_key)
        if verdict != "valid":  # "foreign" only in this host's own slot, where no other key belongs
            return "unsigned" if verdict == "unsigned" else "badly signed"
    return f"unusable ({refusal})"


# --- the store -------------------------------------------------------------------------
class RemoteStore:
    """Where the remote is and how to talk to it; one per workspace.

    The file system object is made on first use (importing fsspec and the protocol's
    driver then) and shared by the sessions (one per build or command) made from it.
    """

    def __init__(self, url: str, *, read: bool = True, write: bool = True, timeout_s: float = 10.0,
                 max_errors: int = 3, signing_key_env: str | None = None,
                 endpoint_url: str | None = None, options: dict[str, Any] | None = None,
                 environ: dict[str, str] | None = None):
        self.url = url
        self.display_url = redact(url)
        self.read = read
        self.write = write
        self.timeout_s = timeout_s
        self.max_errors = max_errors
        self.signing_key_env = signing_key_env
        self.endpoint_url = endpoint_url
        self.options = options or {}
        environ = os.environ if environ is None else environ
        secret = environ.get(signing_key_env) if signing_key_env else None
        self.signing_key: bytes | None = secret.encode() if secret else None
        self._fs: Any = None
        self._root = ""
        self._renames = False
        self._real_root: str | None = None  # the root with symlinks resolved, on a local file system
        self._lock = threading.Lock()

    def session(self, reporter: EventSink | None = None, *, dry_run: bool = False,
                progress: TransferProgress | None = None) -> RemoteSession:
        return RemoteSession(self, reporter, dry_run=dry_run, progress=progress)

    # --- file system (lazy) ----------------------------------------------------------
    def filesystem(self) -> tuple[Any, str]:
        with self._lock:
            if self._fs is None:
                fs, root, protocols = self._connect()
                self._renames = bool(protocols & _RENAMING)
                if protocols & _LOCAL:
                    self._real_root = os.path.realpath(root or "/")
                self._fs, self._root = fs, root
            return self._fs, self._root

    def _connect(self) -> tuple[Any, str, set[str]]:
        import fsspec
        from fsspec.core import split_protocol

        protocol = (split_protocol(self.url)[0] or "file").lower()
        options = dict(self.options)
        if protocol in ("s3", "s3a"):
            if self.endpoint_url:
                options.setdefault("endpoint_url", self.endpoint_url)
            config = dict(options.pop("config_kwargs", None) or {})
            config.setdefault("connect_timeout", self.timeout_s)
            config.setdefault("read_timeout", self.timeout_s)
            config.setdefault("retries", {"total_max_attempts": 1})  # the breaker counts failures instead
            options["config_kwargs"] = config
            options.setdefault("use_listings_cache", False)  # other writers change the remote
            options.setdefault("skip_instance_cache", True)
        elif self.endpoint_url:
            options.setdefault("endpoint_url", self.endpoint_url)
        fs, root = fsspec.core.url_to_fs(self.url, **options)
        if protocol in ("s3", "s3a") and isinstance(getattr(fs, "retries", None), int):
            fs.retries = min(fs.retries, 2)  # s3fs's own retry loop sleeps between tries
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if protocols & _LOCAL and not os.path.isdir(root):
            raise RemoteMissing(f"the remote cache's folder {root} does not exist (is its share mounted?): "
                                f"create it first, e.g. `mkdir -p {root}`; optbuild does not create it")
        return fs, root.rstrip("/"), protocols

    def blob_path(self, digest: str) -> str:
        return f"{self._root}/cas/{digest[:2]}/{digest[2:]}"

    def entry_path(self, key: str, slot: str | None = None) -> str:
        """Where the entry of ``key`` lies; ``slot``: the key id of a signing key whose
        holders keep their entry beside one signed with another key (``RemoteSession.push``)."""
        name = key[2:] if slot is None else f"{key[2:]}.{slot}"
        return f"{self._root}/ac/{key[:2]}/{name}.json"

    def _inside(self, path: str) -> str:
        """``path``, if it resolves to a place under the remote's root; else Rejected.

        Checked before every read, write and rename on a local file system, so a symbolic
        link planted in the remote cannot send a download's source or an upload's bytes
        anywhere else on this host. (Object stores have no links: nothing to check.)
        """
        if self._real_root is None:
            return path
        real = os.path.realpath(path)
        if real != self._real_root and not real.startswith(self._real_root.rstrip(os.sep) + os.sep):
            shown = path[len(self._root) + 1:] if path.startswith(self._root + "/") else path
            raise Rejected(f"{shown} leads outside the remote's folder (to {real}) through a symbolic link")
        return path

    # --- raw operations (run under RemoteSession._call) --------------------------------
    def _read_entry(self, key: str, slot: str | None, touch: Callable[[int], None]) -> bytes:
        fs, _ = self.filesystem()  # first: the paths are known once connected
        return fs.cat_file(self._inside(self.entry_path(key, slot)), start=0,
                           end=MAX_ENTRY_BYTES + _SIGNATURE_LINE + 1)

    def _blob_size(self, digest: str, touch: Callable[[int], None]) -> int | None:
        fs, _ = self.filesystem()
        try:
            return int(fs.info(self._inside(self.blob_path(digest)))["size"])
        except FileNotFoundError:
            return None

    def _download(self, remote: str, local: Path, expected: int | None,
                  touch: Callable[[int], None]) -> None:
        fs, _ = self.filesystem()
        if self._renames:  # a mounted file system: copy in chunks, so a stall is seen
            with fs.open(self._inside(remote), "rb") as src, open(local, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    touch(len(chunk))
                    if expected is not None and dst.tell() > expected:
                        raise Rejected(f"it is larger than the {expected} bytes recorded")
            return
        fs.get_file(remote, str(local), callback=_callback(touch, expected))

    def _hash_blob(self, digest: str, size: int, touch: Callable[[int], None]) -> str:
        """The digest of the remote blob, streamed (blobs can be larger than memory), no
        more than ``size`` bytes of it read."""
        fs, _ = self.filesystem()
        hasher, seen = new_hasher(), 0
        with fs.open(self._inside(self.blob_path(digest)), "rb") as src:
            while chunk := src.read(_CHUNK):
                seen += len(chunk)
                if seen > size:
                    raise Rejected(f"it is larger than the {size} bytes listed")
                hasher.update(chunk)
                touch(len(chunk))
        return hasher.hexdigest()

    def _upload(self, local: Path, remote: str, touch: Callable[[int], None]) -> None:
        fs, _ = self.filesystem()
        if not self._renames:
            fs.put_file(str(local), remote, callback=_callback(touch, None))
            return
        tmp = self._tmp_name()
        self._inside(tmp)
        fs.makedirs(tmp.rsplit("/", 1)[0], exist_ok=True)
        try:
            with open(local, "rb") as src, fs.open(self._inside(tmp), "wb") as dst:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    touch(len(chunk))
                _fsync(dst)
            self._publish(tmp, remote)
        finally:
            _quiet_rm(fs, tmp)

    def _write_entry(self, key: str, slot: str | None, data: bytes, touch: Callable[[int], None]) -> None:
        fs, _ = self.filesystem()
        dest = self.entry_path(key, slot)
        if not self._renames:
            fs.pipe_file(dest, data)
            return
        tmp = self._tmp_name()
        self._inside(tmp)
        fs.makedirs(tmp.rsplit("/", 1)[0], exist_ok=True)
        try:
            with fs.open(self._inside(tmp), "wb") as dst:
                dst.write(data)
                _fsync(dst)
            self._publish(tmp, dest)
        finally:
            _quiet_rm(fs, tmp)

    def _publish(self, tmp: str, dest: str) -> None:
        fs, _ = self.filesystem()
        self._inside(dest)
        fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        fs.mv(self._inside(tmp), self._inside(dest))  # a rename: readers see the old object, or the whole new one

    def _tmp_name(self) -> str:
        return f"{self._root}/tmp/{os.getpid()}-{uuid.uuid4().hex}"

    def _list(self, prefix: str, touch: Callable[[int], None]) -> dict[str, int]:
        fs, _ = self.filesystem()
        try:
            found = fs.find(f"{self._root}/{prefix}", detail=True)
        except FileNotFoundError:
            return {}
        return {path: int(info.get("size") or 0) for path, info in found.items()}


def _callback(touch: Callable[[int], None], expected: int | None) -> Any:
    """An fsspec callback that reports progress to ``touch`` and stops oversized downloads.

    The size is checked as bytes arrive, not only against the size the server announces:
    a server may announce none (chunked) or lie, and must not fill the disk.
    """
    from fsspec.callbacks import Callback

    class _Progress(Callback):
        def set_size(self, size: int | None) -> None:
            super().set_size(size)
            if expected is not None and size is not None and size != expected:
                raise Rejected(f"it has {size} bytes where {expected} were recorded")
            touch(0)

        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            if expected is not None and self.value > expected:
                raise Rejected(f"it is larger than the {expected} bytes recorded")
            touch(inc)

    return _Progress()


def _fsync(handle: Any) -> None:
    try:
        handle.flush()
        os.fsync(handle.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file: nothing to sync
        pass


def _quiet_rm(fs: Any, path: str) -> None:
    with suppress(Exception):  # already renamed away, or the remote went down
        fs.rm_file(path)


# --- progress ----------------------------------------------------------------------------
class TransferProgress:
    """Hooks for showing transfers (``cache push/pull`` draw a bar or print lines)."""

    def start(self, direction: str, label: str, total: int | None) -> Any:
        return None

    def advance(self, token: Any, nbytes: int) -> None:
        pass

    def finish(self, token: Any, ok: bool) -> None:
        pass


# --- one run ---------------------------------------------------------------------------
@dataclass
class RemoteStats:
    hits: int = 0  # entries found and fetched intact (dry runs: found)
    misses: int = 0  # keys the remote does not have, or has unusable (then also rejected)
    rejected: int = 0  # entries or blobs refused: corrupt, unsigned, unsafe, incomplete
    errors: int = 0  # failed operations: refused, timed out, HTTP errors
    bytes_down: int = 0
    bytes_up: int = 0
    blobs_down: int = 0
    blobs_up: int = 0
    entries_up: int = 0
    signature_mismatches: int = 0  # signed entries this host could not verify, so left in place
    disabled: bool = False


@dataclass
class RemoteSession:
    """The remote as one build (or push, or pull) uses it: counters and circuit breaker.

    Every method is safe to call from the executor's threads and, but for the single-blob
    ones (TransferError), never raises for a remote fault: it warns, counts, and answers
    "miss" / "not uploaded".
    """

    store: RemoteStore
    reporter: EventSink | None = None
    dry_run: bool = False
    progress: TransferProgress | None = None
    cancel: threading.Event | None = None
    stats: RemoteStats = field(default_factory=RemoteStats)
    _suspect: set[str] = field(default_factory=set)  # remote blobs found corrupt: re-upload
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _checked: bool = False
    _uploads: list[Any] = field(default_factory=list)
    _pool: Any = None
    _miss_reasons: dict[str, str] = field(default_factory=dict)  # key -> why the remote gave nothing
    _last_fault: str = ""

    @property
    def url(self) -> str:
        return self.store.display_url

    # --- reporting and the breaker -----------------------------------------------------
    def warn(self, message: str, **extra: Any) -> None:
        event = warning(f"remote {self.url}: {message}", source="remote", **extra)
        if self.reporter is not None:
            self.reporter.emit(event)

    def _usable(self, writing: bool = False) -> bool:
        with self._lock:
            if not self._checked:
                self._checked = True
                if self.store.signing_key_env and self.store.signing_key is None:
                    self.stats.disabled = True
                    missing = self.store.signing_key_env
                else:
                    missing = None
            else:
                missing = None
            usable = not self.stats.disabled and (self.store.write if writing else self.store.read)
        if missing:
            self.warn(f"signing_key_env names ${missing}, which is not set: the remote is not used "
                      "(entries could be neither verified nor signed)")
        return usable

    def _fault(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.stats.errors += 1
            if self.stats.disabled:  # an operation that was in flight when the breaker tripped
                return
            errors = self.stats.errors
            trip = not self.stats.disabled and errors >= self.store.max_errors
            fatal = isinstance(exc, (ImportError, ValueError, TypeError, RemoteMissing))  # unusable configuration
            if trip or fatal:
                self.stats.disabled = True
        detail = _describe(exc)
        with self._lock:
            self._last_fault = detail
        self.warn(f"{what} failed: {detail} (error {errors} of at most {self.store.max_errors})",
                  error=detail)
        if trip or fatal:
            self.warn(f"disabled for the rest of this run after {errors} error(s); steps build locally")

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, upload_size: int | None = None,
              missing_ok: bool = False) -> Any:
        """Run ``fn(*args, touch)`` in a daemon thread under the stall watchdog.

        ``touch(nbytes)`` is called by transfers as they make progress; a call that shows
        none for ``timeout_s``, before its first byte or between two, is abandoned as timed
        out, whatever size its entry claims (a remote that claims a huge blob and then
        stalls must not hold a build). Only an upload, whose size is this host's own file
        and whose driver may report progress once a whole part is sent, gets until its
        first report the time to send ``upload_size`` bytes at 1 MiB/s besides.
        FileNotFoundError passes through when ``missing_ok``; Rejected passes through;
        anything else is a fault.
        """
        if self.stats.disabled:  # tripped while a multi-call operation was under way
            raise _Failed(self._off_reason())
        last = [time.monotonic()]
        alive = [False]

        def touch(nbytes: int) -> None:
            last[0] = time.monotonic()
            alive[0] = True

        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn(*args, touch)
            except BaseException as exc:  # handed to the waiting thread
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=target, name="optbuild-remote", daemon=True).start()
        slack = (upload_size or 0) / _SLOWEST_UPLOAD_BPS
        while not done.wait(0.05):
            if self.cancel is not None and self.cancel.is_set():
                raise _Failed("cancelled")
            limit = self.store.timeout_s + (0 if alive[0] else slack)
            if time.monotonic() - last[0] > limit:
                stall = TimeoutError(f"no response for {self.store.timeout_s:g}s")
                self._fault(what, stall)
                raise _Failed(_describe(stall))
        error = box.get("error")
        if error is None:
            return box.get("value")
        if isinstance(error, FileNotFoundError) and missing_ok:
            raise error
        if isinstance(error, Rejected):
            raise error
        if isinstance(error, KeyboardInterrupt):
            raise error
        self._fault(what, error)
        raise _Failed(_describe(error)) from None

    def _off_reason(self) -> str:
        """Why this session does not use the remote now (it is off, or has been switched off)."""
        with self._lock:
            disabled, errors, last = self.stats.disabled, self.stats.errors, self._last_fault
        if disabled and errors:
            return f"it was switched off after {errors} error(s) (last: {last})"
        if disabled:
            return f"${self.store.signing_key_env}, which signing_key_env names, is not set"
        return "reading it is off ([remote] read = false)"

    def _remember_miss(self, key: str, reason: str) -> None:
        with self._lock:
            self._miss_reasons[key] = reason

    def miss_reason(self, key: str) -> str | None:
        """Why the remote gave nothing for ``key`` in this run, when it is more than "the
        remote does not have it": it could not be reached, or what it had was refused."""
        with self._lock:
            return self._miss_reasons.get(key)

    # --- reading -----------------------------------------------------------------------
    def lookup(self, key: str, step: str = "") -> ActionEntry | None:
        """The remote entry of ``key`` if it exists and is acceptable; only the entry is read.

        None otherwise; ``miss_reason(key)`` then says why when the remote was unreachable,
        off, or sent something refused.
        """
        if not self._usable():
            self._remember_miss(key, f"the remote cache was not asked: {self._off_reason()}")
            return None
        try:
            data = self._read(key, None, step)
            if self._beside(key, data):
                data = self._read(key, key_id(self.store.signing_key), step)  # type: ignore[arg-type]
            entry = decode_entry(data, key, self.store.signing_key)
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except _Failed as exc:
            self._remember_miss(key, f"the remote cache could not be reached ({exc})")
            return None
        except Rejected as exc:
            self._count(misses=1, rejected=1)
            self.warn(f"entry of {step or key} rejected: {exc}", step=step, key=key)
            self._remember_miss(key, f"its remote entry was rejected ({exc})")
            return None
        if self.dry_run:
            self._count(hits=1)
        return entry

    def _read(self, key: str, slot: str | None, step: str = "") -> bytes:
        """The bytes of the entry of ``key`` (in ``slot``); FileNotFoundError when there is none."""
        return self._call(f"reading the entry of {step or key[:8]}", self.store._read_entry, key, slot,
                          missing_ok=True)

    def _beside(self, key: str, data: bytes) -> bool:
        """Whether this host keeps its entry of ``key`` in its own slot: the entry ``data`` is a
        valid one signed with another key, which this host must neither use nor replace.

        So a misconfigured host never undoes the farm's entries, and an entry whose key id
        was forged costs a key holder one build, not one on every build.
        """
        return self.store.signing_key is not None and signed_by_another(data, key, self.store.signing_key)

    def fetch(self, entry: ActionEntry, local: LocalStore, step: str = "", *,
              hit: bool = True) -> ActionEntry | None:
        """Download what ``entry`` names into ``local``, verified, then store the entry there
        (a cache hit, unless not ``hit``: the outputs of a step built for this run).

        Returns the entry (now a local hit), or None when anything was missing, corrupt or
        failed; nothing unverified is left in the local store. The caller holds the local
        store's shared gc lock (and the key's lock).
        """
        if not self._usable():
            self._remember_miss(entry.key, f"the remote cache was not asked: {self._off_reason()}")
            return None
        label = step or entry.step
        names = {o.digest: n for n, o in sorted(entry.outputs.items(), reverse=True)}
        sizes = {o.digest: o.size for o in entry.outputs.values()}
        scratch: Path | None = None
        try:
            for digest in sorted(entry.blob_digests()):
                size = sizes.get(digest)
                if local.blob_ok(digest, size):
                    continue
                if scratch is None:
                    scratch = local.new_tmp_dir("remote")
                self._download_blob(digest, size, scratch / digest, local,
                                    f"{label} {names.get(digest, 'log')}")
            local.put_action(entry)
        except Rejected as exc:
            self._count(misses=1, rejected=1)
            self.warn(f"entry of {label} not used: {exc}; building it locally", step=step, key=entry.key)
            self._remember_miss(entry.key, f"its remote copy was unusable ({exc})")
            return None
        except _Failed as exc:
            self._remember_miss(entry.key, f"the remote cache could not be reached ({exc})")
            return None
        except OSError as exc:  # the local side (disk full...): not the remote's fault
            self.warn(f"could not store what was fetched for {label}: {_describe(exc)}", step=step)
            self._remember_miss(entry.key, f"what the remote sent could not be stored ({_describe(exc)})")
            return None
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        if hit and not self.dry_run:
            self._count(hits=1)
        return entry

    # --- single blobs (the dask executor: inputs sent to its nodes, outputs fetched back) --
    def require_read_write(self) -> None:
        """TransferError unless the remote can be read and written now (and is connected:
        its paths are known only then)."""
        if not (self._usable() and self._usable(writing=True)):
            raise TransferError(f"the remote cache {self.url} is needed by the dask executor, but it is not "
                                f"usable: {self._off_reason()}")
        try:
            self._call("connecting", lambda touch: self.store.filesystem())
        except (_Failed, Rejected) as exc:
            raise TransferError(f"cannot use the remote cache {self.url}: {exc}") from None

    def ensure_blob(self, source: Path, digest: str, size: int, label: str) -> bool:
        """Upload ``source`` (a verified blob of this host, ``digest``) unless the remote
        holds a blob of that size already. True when it was uploaded."""
        try:
            if self._call(f"checking blob {digest[:8]}", self.store._blob_size, digest) == size:
                return False
            self._upload_blob(source, digest, size, label)
            return True
        except (_Failed, Rejected) as exc:
            raise TransferError(f"could not upload {label} to {self.url}: {exc}") from None
        except OSError as exc:
            raise TransferError(f"could not upload {label}: {exc}") from None

    def download_blob(self, digest: str, size: int | None, local: LocalStore, label: str) -> Path:
        """Fetch blob ``digest`` into ``local`` (checked against its digest and size); its path."""
        if local.blob_ok(digest, size):
            return local.blob_path(digest)
        scratch = local.new_tmp_dir("fetch")
        try:
            self._download_blob(digest, size, scratch / digest, local, label)
        except (_Failed, Rejected) as exc:
            raise TransferError(f"could not download {label} from {self.url}: {exc}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return local.blob_path(digest)

    def _download_blob(self, digest: str, size: int | None, tmp: Path, local: LocalStore,
                       label: str) -> None:
        with self._progress("down", label, size) as counted:
            def fn(touch: Callable[[int], None]) -> None:
                self.store._download(self.store.blob_path(digest), tmp, size, counted(touch))

            try:
                self._call(f"downloading blob {digest[:8]} of {label}", fn, missing_ok=True)
            except FileNotFoundError:
                raise Rejected(f"it names blob {digest[:8]}…, which the remote lacks") from None
            got, nbytes = hash_file(tmp)
            self._count(bytes_down=nbytes, blobs_down=1)
            if got != digest or (size is not None and nbytes != size):
                with self._lock:
                    self._suspect.add(digest)
                raise Rejected(f"remote blob {digest[:8]}… is corrupt ({nbytes} bytes hashing to "
                                f"{got[:8]}…)")
            if local.put_file(tmp, move=True).digest != digest:  # changed under us: never file it
                raise Rejected(f"blob {digest[:8]}… changed while it was stored")

    @contextmanager
    def _progress(self, direction: str, label: str, size: int | None) -> Iterator[Callable[..., Any]]:
        """One blob transfer's progress: yields a function that wraps the transfer's byte
        callback so that it also advances the progress display, which is finished (done or
        failed) when the block ends."""
        token = self.progress.start(direction, label, size) if self.progress else None
        ok = False

        def counted(touch: Callable[[int], None]) -> Callable[[int], None]:
            def counting(nbytes: int) -> None:
                touch(nbytes)
                if self.progress and nbytes:
                    self.progress.advance(token, nbytes)
            return counting

        try:
            yield counted
            ok = True
        finally:
            if self.progress:
                self.progress.finish(token, ok)

    # --- writing -----------------------------------------------------------------------
    def push(self, entry: ActionEntry, local: LocalStore, step: str = "", *,
             skip_if_present: bool = False) -> str:
        """Upload ``entry``'s blobs (those the remote lacks), then the entry.

        Returns "uploaded", "present" (``skip_if_present`` and the remote already has an
        acceptable entry for the key), "refused" (the remote holds a valid signed entry and
        this host has no key: it is left alone; a key holder meeting one signed with another
        key uploads its own beside it), "failed" or "off" (remote disabled or read-only). The
        caller holds the local store's shared gc lock so the blobs stay put.
        """
        if not self._usable(writing=True):
            return "off"
        label = step or entry.step
        try:
            slot, acceptable, keep, fault = self._destination(entry.key, label, step)
            if acceptable and skip_if_present:
                return "present"
            if keep:
                self.warn(f"not replacing the signed entry of {label} with an unsigned one: this host "
                          f"has no signing key", step=step, key=entry.key)
                return "refused"
            sizes = {o.digest: o.size for o in entry.outputs.values()}
            names = {o.digest: n for n, o in sorted(entry.outputs.items(), reverse=True)}
            for digest in sorted(entry.blob_digests()):
                source = local.blob_path(digest)
                if not local.blob_ok(digest, sizes.get(digest)):
                    self.warn(f"not pushing {label}: its local blob {digest[:8]}… is missing or corrupt")
                    return "failed"
                size = source.stat().st_size
                with self._lock:
                    suspect = digest in self._suspect
                if not suspect and self._call(f"checking blob {digest[:8]}", self.store._blob_size,
                                              digest) == size:
                    continue
                self._upload_blob(source, digest, size, f"{label} {names.get(digest, 'log')}")
                with self._lock:
                    self._suspect.discard(digest)
            data = encode_entry(entry, self.store.signing_key)
            self._call(f"writing the entry of {label}", self.store._write_entry, entry.key, slot, data)
            self._count(entries_up=1, bytes_up=len(data))
            if fault is not None:
                self.warn(f"remote entry for {label} is {fault}: replaced", step=step, key=entry.key)
            return "uploaded"
        except _Failed:
            return "failed"
        except Rejected as exc:
            self._count(rejected=1)
            self.warn(f"not pushing {label}: {exc}", step=step, key=entry.key)
            return "failed"
        except OSError as exc:
            self.warn(f"not pushing {label}: {_describe(exc)}")
            return "failed"

    def push_later(self, entry: ActionEntry, local: LocalStore, step: str = "") -> None:
        """``push`` in the background (write-through), so later steps build meanwhile.

        Runs under its own shared gc lock; ``drain`` waits for every upload to end.
        """
        if not self._usable(writing=True):
            return
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="optbuild-upload")
            self._uploads.append(self._pool.submit(self._push_held, entry, local, step))

    def _push_held(self, entry: ActionEntry, local: LocalStore, step: str) -> str:
        with local.shared_gc_lock():
            return self.push(entry, local, step)

    def drain(self) -> None:
        """Wait for the background uploads (a cancelled run makes them give up at once)."""
        with self._lock:
            pending, self._uploads = self._uploads, []
            pool, self._pool = self._pool, None
        for future in pending:
            try:
                future.result()
            except Exception as exc:  # push reports its own faults; this is a bug
                self.warn(f"upload failed: {_describe(exc)}")
        if pool is not None:
            pool.shutdown(wait=True)

    def _upload_blob(self, source: Path, digest: str, size: int, label: str) -> None:
        with self._progress("up", label, size) as counted:
            def fn(touch: Callable[[int], None]) -> None:
                self.store._upload(source, self.store.blob_path(digest), counted(touch))

            self._call(f"uploading blob {digest[:8]} of {label}", fn, upload_size=size)
            self._count(bytes_up=size, blobs_up=1)

    def _destination(self, key: str, label: str, step: str) -> tuple[str | None, bool, bool, str | None]:
        """(slot, acceptable, keep, fault): where this host's entry of ``key`` goes, and
        ``_existing_entry``'s answers for what lies there now. A key holder meeting an entry
        signed with another key writes beside it, in the slot of its own key."""
        acceptable, keep, fault = self._existing_entry(key, None)
        if not keep:
            return None, acceptable, keep, fault
        self._count(signature_mismatches=1)
        if self.store.signing_key is None:
            return None, acceptable, keep, fault
        self.warn(f"signature mismatch: the remote entry of {label} is signed with another key than this "
                  f"host's (${self.store.signing_key_env}), or its key id was altered: it is left in place, and "
                  f"this host's entry is stored beside it", step=step, key=key)
        slot = key_id(self.store.signing_key)
        return (slot, *self._existing_entry(key, slot))

    def _existing_entry(self, key: str, slot: str | None) -> tuple[bool, bool, str | None]:
        """(acceptable, keep, fault) for the remote's entry of ``key`` (in ``slot``): whether
        this host would use it; whether it is a valid entry signed with a key this host lacks
        (another key, or none), which this host must not replace (never so in this host's own
        slot); and, for one that is neither, what is wrong with it (None when there is none)."""
        try:
            data = self._read(key, slot)
        except FileNotFoundError:
            return False, False, None
        keep = slot is None and signed_by_another(data, key, self.store.signing_key)
        try:
            decode_entry(data, key, self.store.signing_key)
        except Rejected as exc:
            return False, keep, None if keep else replaced_fault(data, self.store.signing_key, exc)
        return True, keep, None

    # --- audit -------------------------------------------------------------------------
    def audit(self, *, rehash: bool = False) -> RemoteAudit:
        """Check the whole remote: every entry acceptable, every blob it names present with
        the size it records for it (and with ``rehash``, downloaded and hashed: each entry
        whose blob is not what it records is named). Nothing is changed."""
        report = RemoteAudit(signed=self.store.signing_key is not None, rehashed=rehash)
        if not self._usable():
            report.problems.append("remote not readable")
            return report
        try:
            listed = self._call("listing entries", self.store._list, "ac")
            blobs = self._call("listing blobs", self.store._list, "cas")
        except _Failed as exc:
            report.problems.append(f"cannot list the remote: {exc}")
            return report
        sizes = {}
        for path, size in blobs.items():
            parts = path.rsplit("/", 2)
            sizes[parts[-2] + parts[-1]] = size
        report.blobs = len(sizes)
        entries = [entry for path in sorted(listed) if (entry := self._audited_entry(path, report)) is not None]
        uses: dict[str, list[tuple[ActionEntry, str | None]]] = {}  # digest -> (entry, output name; None: log)
        for entry in entries:
            for name, output in sorted(entry.outputs.items()):
                uses.setdefault(output.digest, []).append((entry, name))
                _check_size(entry, name, output.size, sizes.get(output.digest), report)
            if entry.log is not None:
                uses.setdefault(entry.log, []).append((entry, None))
                _check_size(entry, None, None, sizes.get(entry.log), report)
        if rehash:
            for digest in sorted(set(sizes) & set(uses)):
                self._audit_digest(digest, sizes[digest], uses[digest], report)
        if not report.signed:
            report.shared = [f"blob {digest} is an output of {', '.join(sorted(steps))}"
                             for digest, named in sorted(uses.items())
                             if len(steps := {entry.step for entry, name in named if name is not None}) > 1]
        report.orphan_blobs = len(set(sizes) - set(uses))
        return report

    def _audited_entry(self, path: str, report: RemoteAudit) -> ActionEntry | None:
        """The acceptable entry at ``path`` (from the listing of ac/), or None: not an entry's
        file, gone since the listing, or a problem (recorded in ``report``)."""
        folder, name = path.rsplit("/", 2)[-2:]
        if not name.endswith(".json"):
            return None
        stem, _, slot = name[: -len(".json")].partition(".")
        key = folder + stem
        report.entries += 1
        if not is_digest(key) or (slot and not re.fullmatch(f"[0-9a-f]{{{_KEY_ID_HEX}}}", slot)):
            report.problems.append(f"{path}: not where an entry belongs")
            return None
        shown = key if not slot else f"{key} (beside it, signed with key {slot})"
        try:
            data = self._read(key, slot or None)
            return decode_entry(data, key, self.store.signing_key)
        except FileNotFoundError:  # removed since the listing
            return None
        except _Failed as exc:
            report.problems.append(f"entry {shown}: could not be read ({exc})")
        except Rejected as exc:
            report.problems.append(f"entry {shown}: {exc}")
        return None

    def _audit_digest(self, digest: str, size: int, named: list[tuple[ActionEntry, str | None]],
                      report: RemoteAudit) -> None:
        """Download blob ``digest`` and hash it; a blob that is not what its entries record
        is reported with every entry and output that names it."""
        try:
            got = self._call(f"hashing blob {digest[:8]}", self.store._hash_blob, digest, size, missing_ok=True)
        except (FileNotFoundError, _Failed, Rejected) as exc:
            report.problems.append(f"blob {digest}: could not be read ({exc})")
            return
        if got == digest:
            return
        for entry, name in named:
            report.problems.append(f"entry {entry.key} ({entry.step}) {_what(name)}: blob {digest} is corrupt "
                                   f"(its bytes hash to {got})")

    # --- counters ----------------------------------------------------------------------
    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {"url": self.url, **self.stats.__dict__}


@dataclass
class RemoteAudit:
    """What ``RemoteSession.audit`` found. Without signatures it can say only that every blob
    is what its entry records, never that the entry is the true one: ``shared`` lists what a
    rewired entry would look like."""

    signed: bool = False  # entries were checked against this host's signing key
    rehashed: bool = False  # blobs were downloaded and hashed, not only sized
    entries: int = 0
    blobs: int = 0
    orphan_blobs: int = 0
    problems: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # blobs that entries of several steps name as outputs

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        checked = "sizes and digests" if self.rehashed else "sizes (--rehash: digests too)"
        verdict = "PROBLEMS FOUND" if not self.ok else "all intact" if self.signed else "no problem found, unsigned"
        lines = [f"remote: checked {self.entries} entries and {self.blobs} blobs ({checked}): {verdict}"]
        lines += [f"  {p}" for p in self.problems]
        if self.orphan_blobs:
            lines.append(f"  {self.orphan_blobs} blobs that no entry names")
        if not self.signed and self.entries:
            lines.append("  note: the entries are not signed: each names blobs that are what it records, but an "
                         "entry rewired to another build's intact blob cannot be told from a true one "
                         "(set [remote] signing_key_env)")
            lines += [f"  note: {line} (identical outputs, or a rewired entry)" for line in self.shared]
        return "\n".join(lines)


def _check_size(entry: ActionEntry, name: str | None, recorded: int | None, actual: int | None,
                report: RemoteAudit) -> None:
    """Report the blob of ``entry``'s output ``name`` (None: its log, whose size no entry
    records) when it is missing or not of the size the entry records."""
    what = f"entry {entry.key} ({entry.step}) {_what(name)}"
    digest = entry.log if name is None else entry.outputs[name].digest
    if actual is None:
        report.problems.append(f"{what} names missing blob {digest}")
    elif recorded is not None and actual != recorded:
        report.problems.append(f"{what}: blob {digest} holds {actual} bytes, the entry records {recorded}")


def _what(name: str | None) -> str:
    return "log" if name is None else f"output {name}"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
