"""The remote cache's CAS as the dask executor uses it: blobs checked, uploaded, downloaded.

These lean on ``RemoteSession``'s transfer primitives (the stall watchdog, the circuit
breaker, the digest check of every download), so a transfer here behaves, and fails, as a
remote-cache transfer does. Failures raise ``CasError`` with the reason.
"""

from __future__ import annotations

from pathlib import Path

from optbuild.store.local import LocalStore
from optbuild.store.remote import RemoteSession, _Failed, _Rejected


class CasError(Exception):
    """A blob could not be checked, uploaded or downloaded; the message says why."""


def require_usable(session: RemoteSession) -> None:
    """CasError unless the session can both read and write the remote."""
    if not (session._usable() and session._usable(writing=True)):
        raise CasError(f"the remote cache {session.url} is needed by the dask executor, but it is not "
                       f"usable: {session._off_reason()}")
    try:  # paths are known once connected
        session._call("connecting", lambda touch: session.store.filesystem())
    except (_Failed, _Rejected) as exc:
        raise CasError(f"cannot use the remote cache {session.url}: {exc}") from None


def ensure_blob(session: RemoteSession, source: Path, digest: str, size: int, label: str) -> bool:
    """Upload ``source`` (a verified blob of this host, ``digest``) unless the remote holds a
    blob of that size already. True when it was uploaded."""
    try:
        if session._call(f"checking blob {digest[:8]}", session.store._blob_size, digest) == size:
            return False
        session._upload_blob(source, digest, size, label)
        return True
    except (_Failed, _Rejected) as exc:
        raise CasError(f"could not upload {label} to {session.url}: {exc}") from None
    except OSError as exc:
        raise CasError(f"could not upload {label}: {exc}") from None


def download(session: RemoteSession, digest: str, size: int | None, store: LocalStore, label: str) -> Path:
    """Fetch blob ``digest`` into ``store`` (checked against its digest and size); its path."""
    if store.blob_ok(digest, size):
        return store.blob_path(digest)
    scratch = store.new_tmp_dir("fetch")
    try:
        session._download_blob(digest, size, scratch / digest, store, label)
    except (_Failed, _Rejected) as exc:
        raise CasError(f"could not download {label} from {session.url}: {exc}") from None
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return store.blob_path(digest)
