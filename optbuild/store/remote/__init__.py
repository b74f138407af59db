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
valid entry; the last one wins, and both name blobs that are present. An entry that a read of
the run found missing is written, where the remote makes it atomic, only if still missing
(``Writing._seen_absent``), not read again first.

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
``cache push`` / ``cache pull`` over a workspace are ``optbuild.app.transfer``. This package, as
all of ``optbuild.store``, imports nothing above the store layer: warnings go to any
``EventSink`` (a Reporter is one), and the settings come as plain values.

Modules: ``config`` (which remote a run uses), ``signing`` (entries as the remote holds
them), ``filesystem`` (its files, the raw operations), ``session`` (one run's use of it:
lookups, batched ones (``prefetch``) included, fetches, the breaker), ``writing`` (its
pushes), ``audit`` (what ``cache verify`` finds), ``errors``.

This package imports nothing heavy: fsspec (and s3fs, gcsfs, ...) load on the first remote
operation, so a fully cached build never pays for them.
"""

from optbuild.store.remote.audit import RemoteAudit
from optbuild.store.remote.config import ENV_URL, open_remote
from optbuild.store.remote.errors import EventSink, Rejected, RemoteMissing, TransferError
from optbuild.store.remote.filesystem import RemoteStore, redact
from optbuild.store.remote.session import RemoteSession, RemoteStats, TransferProgress
from optbuild.store.remote.signing import SIGNATURE_PREFIX, decode_entry, encode_entry, key_id, sign

__all__ = ["ENV_URL", "SIGNATURE_PREFIX", "EventSink", "Rejected", "RemoteAudit", "RemoteMissing", "RemoteSession",
           "RemoteStats", "RemoteStore", "TransferError", "TransferProgress", "decode_entry", "encode_entry",
           "key_id", "open_remote", "redact", "sign"]
