"""The remote as one build (or push, or pull) uses it: lookups, fetches and pushes that never
fail a build, counted, behind a circuit breaker."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optbuild.common.digest import hash_file
from optbuild.common.events import warning
from optbuild.store.entry import ActionEntry
from optbuild.store.remote.audit import Auditing
from optbuild.store.remote.crossings import DOWN, Crossings
from optbuild.store.remote.errors import EventSink, Failed, Rejected, RemoteMissing, TransferError, describe
from optbuild.store.remote.filesystem import RemoteStore
from optbuild.store.remote.listing import Listing
from optbuild.store.remote.signing import SIGNATURE_PREFIX, decode_entry, key_id, signed_by_another
from optbuild.store.remote.writing import Writing

if TYPE_CHECKING:
    from optbuild.store.local import LocalStore


_SLOWEST_UPLOAD_BPS = 1 << 20  # an upload's first progress report may come only after this rate
ANY_MAIN = object()  # lookup: whatever main output the entry names
_PARALLEL_BLOBS = 4  # an entry's blobs downloaded at once


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
    requests: int = 0  # asked of the remote: one per object read, size checked or written, one per listing
    bytes_down: int = 0
    bytes_up: int = 0
    blobs_down: int = 0
    blobs_up: int = 0
    entries_up: int = 0
    signature_mismatches: int = 0  # signed entries this host could not verify, so left in place
    disabled: bool = False


@dataclass
class RemoteSession(Writing, Auditing, Listing):
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
    crossings: Crossings = field(default_factory=Crossings)  # each blob's transfers, per host
    _suspect: set[str] = field(default_factory=set)  # remote blobs found corrupt: re-upload
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _checked: bool = False
    _uploads: list[Future[str]] = field(default_factory=list)
    _pool: ThreadPoolExecutor | None = None
    _miss_reasons: dict[str, str] = field(default_factory=dict)  # key -> why the remote gave nothing
    _last_fault: str = ""
    _told_unchecked: bool = False  # the warning that signatures go unchecked was given
    _prefetched: dict[str, bytes | None] = field(default_factory=dict)  # key -> its entry's bytes; None: absent
    _listed: set[str] | None = None  # the keys the remote held an entry for when listed (prefetch_listing)
    _absent: set[str] = field(default_factory=set)  # keys a lookup found no entry of (Writing.push)
    _blobs: dict[str, int] | None = None  # digest -> size of the blobs listed once (holds_blobs)
    _blobs_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return self.store.display_url

    # --- reporting and the breaker -----------------------------------------------------
    def warn(self, message: str, *, step: str | None = None, key: str | None = None,
             error: str | None = None) -> None:
        event = warning(f"remote {self.url}: {message}", source="remote", step=step, key=key, error=error)
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
        detail = describe(exc)
        with self._lock:
            self._last_fault = detail
        self.warn(f"{what} failed: {detail} (error {errors} of at most {self.store.max_errors})",
                  error=detail)
        if trip or fatal:
            self.warn(f"disabled for the rest of this run after {errors} error(s); steps build locally")

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, upload_size: int | None = None,
              missing_ok: bool = False, requests: int = 1) -> Any:
        """Run ``fn(*args, touch)`` in a daemon thread under the stall watchdog.

        Every remote operation runs here, so here it is counted: ``requests``, what ``fn``
        asks of the remote (``stats.requests``): one object read, size checked or written, or
        one listing (however many pages the store answers it in); a batch of reads counts one
        a path. Counted when asked, whether or not it then succeeds.

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
            raise Failed(self._off_reason())
        self._count(requests=requests)
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
                raise Failed("cancelled")
            limit = self.store.timeout_s + (0 if alive[0] else slack)
            if time.monotonic() - last[0] > limit:
                stall = TimeoutError(f"no response for {self.store.timeout_s:g}s")
                self._fault(what, stall)
                raise Failed(describe(stall))
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
        raise Failed(describe(error)) from None

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
    def lookup(self, key: str, step: str = "", main: str | None | object = ANY_MAIN) -> ActionEntry | None:
        """The remote entry of ``key`` if it exists and is acceptable; only the entry is read.
        ``main``: the main output the step declares, which the entry must name (the key does
        not hold it, so a task sent to a Dask node could have named another).

        None otherwise; ``miss_reason(key)`` then says why when the remote was unreachable,
        off, or sent something refused.
        """
        if not self._usable():
            self._remember_miss(key, f"the remote cache was not asked: {self._off_reason()}")
            return None
        try:
            entry = self._decode(self._fetch(key, step, self._answered(key)), key)
            if main is not ANY_MAIN and entry.primary != main:
                raise Rejected(f"it names {entry.primary} as the step's main output, where the step's is {main}")
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except Failed as exc:
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

    def holds(self, entry: ActionEntry, step: str = "") -> bool:
        """Whether the remote's entry of ``entry.key`` is one this host accepts and names the
        same outputs and main output as ``entry`` (a Dask node checks an upstream step's main
        output against it). Counts no hit or miss."""
        if not self._usable():
            return False
        try:
            found = decode_entry(self._fetch(entry.key, step), entry.key, self.store.signing_key)
        except (FileNotFoundError, Failed, Rejected):
            return False
        return found.outputs == entry.outputs and found.primary == entry.primary

    def _fetch(self, key: str, step: str, data: bytes | None = None) -> bytes:
        """The bytes of the entry of ``key`` this host reads (``data``: the plain one, when
        already read): the one signed with its key where one lies beside the plain one."""
        if data is None:
            try:
                data = self._read(key, None, step)
            except FileNotFoundError:
                self._note_absent(key)
                raise
        signing_key = self.store.signing_key
        if signing_key is not None and self._beside(key, data):
            data = self._read(key, key_id(signing_key), step)
        return data

    def _read(self, key: str, slot: str | None, step: str = "") -> bytes:
        """The bytes of the entry of ``key`` (in ``slot``); FileNotFoundError when there is none."""
        return self._call(f"reading the entry of {step or key[:8]}", self.store._read_entry, key, slot,
                          missing_ok=True)

    def _note_absent(self, key: str) -> None:
        """A lookup of this run found no entry of ``key`` (its plain one: not this host's beside
        another's), read or listed; so ``Writing.push`` may write one without reading it first."""
        with self._lock:
            self._absent.add(key)

    def _decode(self, data: bytes, key: str) -> ActionEntry:
        """``decode_entry`` under this host's key; a host without one that meets a signed
        entry is told, once a session, that it uses such entries unchecked."""
        if self.store.signing_key is None and data.startswith(SIGNATURE_PREFIX):
            self._tell_unchecked()
        return decode_entry(data, key, self.store.signing_key)

    def _tell_unchecked(self) -> None:
        with self._lock:
            told, self._told_unchecked = self._told_unchecked, True
        if not told:
            self.warn("its entries are signed, but this host has no signing key, so it cannot check their "
                      "signatures and uses them unchecked: set [remote] signing_key_env in optbuild.toml to "
                      "the NAME of the environment variable that holds the key (e.g. OPTBUILD_SIGNING_KEY), "
                      "and set that variable")

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
            carried = entry.carried()  # checked when the entry was read
            wanted = [(d, sizes.get(d), f"{label} {names.get(d, 'log')}") for d in sorted(entry.blob_digests())
                      if d not in carried and not local.blob_ok(d, sizes.get(d))]
            if wanted:
                scratch = local.new_tmp_dir("remote")
                self._download_blobs(wanted, scratch, local)
            self._store_carried(carried, local)
            entry = entry.uncarried()
            local.put_action(entry)
        except Rejected as exc:
            self._count(misses=1, rejected=1)
            self.warn(f"entry of {label} not used: {exc}; building it locally", step=step, key=entry.key)
            self._remember_miss(entry.key, f"its remote copy was unusable ({exc})")
            return None
        except Failed as exc:
            self._remember_miss(entry.key, f"the remote cache could not be reached ({exc})")
            return None
        except OSError as exc:  # the local side (disk full...): not the remote's fault
            self.warn(f"could not store what was fetched for {label}: {describe(exc)}", step=step)
            self._remember_miss(entry.key, f"what the remote sent could not be stored ({describe(exc)})")
            return None
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        if hit and not self.dry_run:
            self._count(hits=1)
        return entry

    def _store_carried(self, carried: dict[str, bytes], local: LocalStore) -> None:
        """Store the blobs an entry carried (digest -> bytes, checked) that ``local`` lacks."""
        for digest, data in sorted(carried.items()):
            self._count(bytes_down=len(data))
            self.crossings.count(digest, DOWN)
            local.put_bytes(data, f"blob {digest[:12]}, carried in a remote entry")

    # --- single blobs (the dask executor: inputs sent to its nodes, outputs fetched back) --
    def require_read_write(self) -> None:
        """TransferError unless the remote can be read and written now (and is connected:
        its paths are known only then)."""
        if not (self._usable() and self._usable(writing=True)):
            raise TransferError(f"the remote cache {self.url} is needed by the dask executor, but it is not "
                                f"usable: {self._off_reason()}")
        try:
            self._call("connecting", lambda touch: self.store.filesystem(), requests=0)  # asks nothing
        except (Failed, Rejected) as exc:
            raise TransferError(f"cannot use the remote cache {self.url}: {exc}") from None

    def ensure_blob(self, source: Path, digest: str, size: int, label: str) -> bool:
        """Upload ``source`` (a verified blob of this host, ``digest``) unless the remote
        holds a blob of that size already. True when it was uploaded."""
        try:
            if self._call(f"checking blob {digest[:8]}", self.store._blob_size, digest) == size:
                return False
            self._upload_blob(source, digest, size, label)
            return True
        except (Failed, Rejected) as exc:
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
        except (Failed, Rejected) as exc:
            raise TransferError(f"could not download {label} from {self.url}: {exc}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return local.blob_path(digest)

    def _download_blobs(self, wanted: list[tuple[str, int | None, str]], scratch: Path, local: LocalStore) -> None:
        """Download (digest, size, label) blobs into ``local``, a few at once (each under its
        own watchdog); the first failure is raised once all have ended."""
        if len(wanted) == 1:
            digest, size, label = wanted[0]
            self._download_blob(digest, size, scratch / digest, local, label)
            return
        with ThreadPoolExecutor(max_workers=min(_PARALLEL_BLOBS, len(wanted)),
                                thread_name_prefix="optbuild-fetch") as pool:
            futures = [pool.submit(self._download_blob, digest, size, scratch / digest, local, label)
                       for digest, size, label in wanted]
        for future in futures:
            future.result()

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
            self.crossings.count(digest, DOWN)
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

    # --- counters ----------------------------------------------------------------------
    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {"url": self.url, **self.stats.__dict__}
