"""Writing to the remote: a session's pushes (blobs first, then the entry) and write-through
uploads in the background. A part of ``RemoteSession`` (``session`` holds the breaker and
the counters it uses)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from optbuild.common.errors import CacheError
from optbuild.store.entry import MAX_CARRIED_TOTAL, ActionEntry
from optbuild.store.remote.crossings import UP
from optbuild.store.remote.errors import Failed, Rejected, describe
from optbuild.store.remote.parts import SessionParts
from optbuild.store.remote.signing import (
    decode_entry,
    encode_entry,
    key_id,
    replaced_fault,
    signed_by_another,
)

if TYPE_CHECKING:
    from optbuild.store.local import LocalStore


class Writing(SessionParts):
    """``RemoteSession``'s writing half: a mixin, whose fields, breaker and counters are the
    session's."""

    def push(self, entry: ActionEntry, local: LocalStore, step: str = "", *,
             skip_if_present: bool = False, carry: bool = True) -> str:
        """Upload ``entry``'s blobs (those the remote lacks), then the entry; with ``carry``,
        small blobs travel inside the entry instead (``ActionEntry.carrying``), so that one
        request restores a small step. Without it every blob is stored as a blob, as a Dask
        node reads its inputs: by digest.

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
            slot, acceptable, keep, fault = None, False, False, None  # as _destination answers for none
            if not (create := self._seen_absent(entry.key)):
                slot, acceptable, keep, fault = self._destination(entry.key, label, step)
            if (refusal := self._refusal(entry.key, label, step, acceptable, keep, skip_if_present)) is not None:
                return refusal
            sizes = {o.digest: o.size for o in entry.outputs.values()}
            names = {o.digest: n for n, o in sorted(entry.outputs.items(), reverse=True)}
            carried: dict[str, bytes] = {}
            for digest in sorted(entry.blob_digests()):
                source = local.blob_path(digest)
                if not local.blob_ok(digest, sizes.get(digest)):
                    self.warn(f"not pushing {label}: its local blob {digest[:8]}… is missing or corrupt")
                    return "failed"
                size = source.stat().st_size
                with self._lock:
                    suspect = digest in self._suspect  # found corrupt there: stored again, as a blob
                if carry and not suspect and self._carries(size, carried):
                    carried[digest] = local.read_blob(digest)
                    continue
                if not suspect and self._call(f"checking blob {digest[:8]}", self.store._blob_size,
                                              digest) == size:
                    continue
                self._upload_blob(source, digest, size, f"{label} {names.get(digest, 'log')}")
                with self._lock:
                    self._suspect.discard(digest)
            data = encode_entry(entry.carrying(carried), self.store.signing_key)
            if create and not self._call(f"writing the entry of {label}",
                                         partial(self.store._write_entry, create=True), entry.key, None, data):
                create = False  # another host stored one since it was read: decided on, as any
                slot, acceptable, keep, fault = self._destination(entry.key, label, step)
                if (refusal := self._refusal(entry.key, label, step, acceptable, keep, skip_if_present)) is not None:
                    return refusal
            if not create:
                self._call(f"writing the entry of {label}", self.store._write_entry, entry.key, slot, data)
            self._count(entries_up=1, bytes_up=len(data))
            for digest in carried:
                self.crossings.count(digest, UP)
            if fault is not None:
                self.warn(f"remote entry for {label} is {fault}: replaced", step=step, key=entry.key)
            return "uploaded"
        except Failed:
            return "failed"
        except Rejected as exc:
            self._count(rejected=1)
            self.warn(f"not pushing {label}: {exc}", step=step, key=entry.key)
            return "failed"
        except (OSError, CacheError) as exc:  # the local side: a blob gone or corrupt since it was checked
            self.warn(f"not pushing {label}: {describe(exc)}")
            return "failed"

    def _seen_absent(self, key: str) -> bool:
        """Whether ``push`` writes the entry of ``key`` only if there is still none, not reading
        it first (``_destination``): a read of this run found none (a lookup's, a listing's),
        and the remote makes such a write atomic (``RemoteStore.creates_entries``). Each such
        read serves one push.

        That read is no proof that none is there now (another host may have stored one while
        this one built), and entries of one key are not interchangeable: one signed with a key
        this host lacks must be left in place. A write that replaces nothing keeps that rule:
        where the remote holds one after all, it refuses, and push reads it then and decides as
        ever. So a step built here costs its lookup and its upload, not a read besides."""
        with self._lock:
            if key not in self._absent:
                return False
            self._absent.discard(key)
        return self.store.creates_entries()

    def _refusal(self, key: str, label: str, step: str, acceptable: bool, keep: bool,
                 skip_if_present: bool) -> str | None:
        """What ``push`` answers without writing, given ``_destination``'s answers: "present"
        (``skip_if_present`` and an acceptable entry is there) or "refused" (it must be kept)."""
        if acceptable and skip_if_present:
            return "present"
        if keep:
            self.warn(f"not replacing the signed entry of {label} with an unsigned one: this host "
                      f"has no signing key", step=step, key=key)
            return "refused"
        return None

    def _carries(self, size: int, carried: dict[str, bytes]) -> bool:
        """Whether a blob of ``size`` bytes travels inside its entry, beside those ``carried``
        already: small enough, and room left."""
        inline_max = self.store.inline_max
        return 0 < inline_max and size <= inline_max and sum(map(len, carried.values())) + size <= MAX_CARRIED_TOTAL

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
                self.warn(f"upload failed: {describe(exc)}")
        if pool is not None:
            pool.shutdown(wait=True)

    def _upload_blob(self, source: Path, digest: str, size: int, label: str) -> None:
        with self._progress("up", label, size) as counted:
            def fn(touch: Callable[[int], None]) -> None:
                self.store._upload(source, self.store.blob_path(digest), counted(touch))

            self._call(f"uploading blob {digest[:8]} of {label}", fn, upload_size=size)
            self._count(bytes_up=size, blobs_up=1)
            self.crossings.count(digest, UP)

    def _destination(self, key: str, label: str, step: str) -> tuple[str | None, bool, bool, str | None]:
        """(slot, acceptable, keep, fault): where this host's entry of ``key`` goes, and
        ``_existing_entry``'s answers for what lies there now. A key holder meeting an entry
        signed with another key writes beside it, in the slot of its own key. Not asked before
        a write that replaces nothing (``_seen_absent``), only once such a write was refused."""
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
