"""The remote's files behind an fsspec URL: blobs and entries read, written and published
atomically, every local path kept under the remote's root. The raw operations a session runs."""

from __future__ import annotations

import inspect
import os
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from optbuild.common.digest import new_hasher
from optbuild.store.entry import MAX_CARRIED_BYTES, MAX_ENTRY_BYTES
from optbuild.store.layout import blob_name, entry_name
from optbuild.store.remote.errors import Rejected, RemoteMissing
from optbuild.store.remote.signing import SIGNATURE_LINE

_RENAMING = {"file", "local", "sftp", "ssh"}  # protocols whose mv is an atomic rename
_LOCAL = {"file", "local"}  # protocols whose paths are this host's paths (symlinks resolvable)
_CHUNK = 8 << 20
# S3 servers known to honour ``If-None-Match: *`` on a PUT (AWS, since 2024-08): a server that
# ignores the header replaces the object silently, so elsewhere an entry is read before it is written
IF_NONE_MATCH_HOSTS = (".amazonaws.com", ".amazonaws.com.cn")
_BATCH = 256  # entries read by one concurrent request batch: the watchdog sees progress after each


def redact(url: str) -> str:
    """``url`` without credentials (user:password@ in the authority)."""
    return re.sub(r"(://)[^/@]*@", r"\1***@", url)


# --- the store -------------------------------------------------------------------------
class RemoteStore:
    """Where the remote is and how to talk to it; one per workspace.

    The file system object is made on first use (importing fsspec and the protocol's
    driver then) and shared by the sessions (one per build or command) made from it.
    """

    def __init__(self, url: str, *, read: bool = True, write: bool = True, timeout_s: float = 10.0,
                 max_errors: int = 3, inline_max: int = MAX_CARRIED_BYTES, signing_key_env: str | None = None,
                 endpoint_url: str | None = None, options: dict[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None):
        self.url = url
        self.display_url = redact(url)
        self.read = read
        self.write = write
        self.timeout_s = timeout_s
        self.max_errors = max_errors
        self.inline_max = inline_max  # blobs up to this size travel inside their entry
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
        self._links = True  # whether hard links may make entries here (``creates_entries``)
        self._lock = threading.Lock()

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
        """Where the blob of ``digest`` lies on the remote (a ``layout.BlobStore``)."""
        return f"{self._root}/{blob_name(digest)}"

    def entry_path(self, key: str, slot: str | None = None) -> str:
        """Where the entry of ``key`` lies; ``slot``: the key id of a signing key whose
        holders keep their entry beside one signed with another key (``RemoteSession.push``)."""
        return f"{self._root}/{entry_name(key, slot)}"

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
    # _call counts each as one request (stats.requests), unless told how many it asks:
    # _read_entries, one a key. An operation that asks more must say so there.
    def _read_entry(self, key: str, slot: str | None, touch: Callable[[int], None]) -> bytes:
        fs, _ = self.filesystem()  # first: the paths are known once connected
        return fs.cat_file(self._inside(self.entry_path(key, slot)), start=0,
                           end=MAX_ENTRY_BYTES + SIGNATURE_LINE + 1)

    def _read_entries(self, keys: list[str], touch: Callable[[int], None]) -> dict[str, bytes | None]:
        """The entries of ``keys`` (None: the remote has none), read concurrently where the
        file system is asynchronous (s3fs, gcsfs...: one ``cat`` runs its requests together).
        A key whose read failed otherwise is left out, for ``lookup`` to ask again."""
        fs, _ = self.filesystem()
        found: dict[str, bytes | None] = {}
        for start in range(0, len(keys), _BATCH):
            batch = {self.entry_path(key): key for key in keys[start:start + _BATCH]}
            if getattr(fs, "async_impl", False):
                answers = fs.cat(list(batch), on_error="return", start=0, end=MAX_ENTRY_BYTES + SIGNATURE_LINE + 1)
            else:
                answers = {path: _answer(partial(self._read_entry, key, None, touch))
                           for path, key in batch.items()}
            for path, key in batch.items():
                data = answers.get(path)
                if isinstance(data, (bytes, FileNotFoundError)):
                    found[key] = data if isinstance(data, bytes) else None
            touch(len(batch))
        return found

    def _entry_keys(self, touch: Callable[[int], None]) -> set[str]:
        """The keys the remote holds an entry for (in any slot), from one listing of ac/."""
        keys = set()
        for path in self._list("ac", touch):
            folder, name = path.rsplit("/", 2)[-2:]
            keys.add(folder + name.partition(".")[0])
        return keys

    def _blob_sizes(self, touch: Callable[[int], None]) -> dict[str, int]:
        """Digest -> size of every blob the remote holds, from one listing of cas/."""
        return {folder + name: size for path, size in self._list("cas", touch).items()
                for folder, name in [path.rsplit("/", 2)[-2:]]}

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
        fs.get_file(remote, str(local), callback=transfer_callback(touch, expected))

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
            fs.put_file(str(local), remote, callback=transfer_callback(touch, None))
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

    def creates_entries(self) -> bool:
        """Whether ``_write_entry(create=True)`` is a create-if-absent that the remote makes
        atomic, so never replaces an entry another host stored since this one saw none: on a
        local or mounted folder a hard link (link(2) fails when the name exists), until one
        failed here for another reason (a share without hard links); on S3, a PUT with
        ``If-None-Match: *`` to a server known to honour it (``IF_NONE_MATCH_HOSTS``) through
        an s3fs and a botocore that send it. Elsewhere False: the entry is read first."""
        fs, _ = self.filesystem()
        if self._renames:
            return self._real_root is not None and self._links
        try:  # s3fs's and botocore's own attributes: another version that lacks them, a no
            client = getattr(fs, "_s3", None)  # s3fs's client, made by the first request
            if client is None or "mode" not in inspect.signature(fs._pipe_file).parameters:
                return False
            host = urlsplit(client.meta.endpoint_url).hostname or ""
            put = client.meta.service_model.operation_model("PutObject").input_shape.members
        except (AttributeError, TypeError, ValueError, LookupError):
            return False
        return "IfNoneMatch" in put and f".{host}".endswith(IF_NONE_MATCH_HOSTS)

    def _write_entry(self, key: str, slot: str | None, data: bytes, touch: Callable[[int], None], *,
                     create: bool = False) -> bool:
        """Store the entry of ``key`` (in ``slot``): True. With ``create`` (only where
        ``creates_entries``), only if there is none: False, and nothing written, when there is
        one (or the remote refused for a race, or a hard link failed: the caller reads it)."""
        fs, _ = self.filesystem()
        dest = self.entry_path(key, slot)
        if not self._renames:
            try:
                fs.pipe_file(dest, data, **({"mode": "create"} if create else {}))
            except OSError as exc:
                if create and _refused_create(exc):
                    return False
                raise
            return True
        tmp = self._tmp_name()
        self._inside(tmp)
        fs.makedirs(tmp.rsplit("/", 1)[0], exist_ok=True)
        try:
            with fs.open(self._inside(tmp), "wb") as dst:
                dst.write(data)
                _fsync(dst)
            return self._publish(tmp, dest, create=create)
        finally:
            _quiet_rm(fs, tmp)

    def _publish(self, tmp: str, dest: str, *, create: bool = False) -> bool:
        """Move ``tmp`` to ``dest``: True; with ``create``, link it there instead, which never
        replaces ``dest`` (False when it lies there, or the link failed; the caller removes ``tmp``)."""
        fs, _ = self.filesystem()
        self._inside(dest)
        fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        if create:
            try:
                os.link(self._inside(tmp), self._inside(dest))
            except FileExistsError:
                return False
            except OSError:  # no hard links on this share: read first from now on
                self._links = False
                return False
            return True
        fs.mv(self._inside(tmp), self._inside(dest))  # a rename: readers see the old object, or the whole new one
        return True

    def _tmp_name(self) -> str:
        return f"{self._root}/tmp/{os.getpid()}-{uuid.uuid4().hex}"

    def _list(self, prefix: str, touch: Callable[[int], None]) -> dict[str, int]:
        fs, _ = self.filesystem()
        try:
            found = fs.find(f"{self._root}/{prefix}", detail=True)
        except FileNotFoundError:
            return {}
        return {path: int(info.get("size") or 0) for path, info in found.items()}


def transfer_callback(touch: Callable[[int], None], expected: int | None) -> Any:
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


def _refused_create(exc: OSError) -> bool:
    """Whether S3 refused a create-if-absent: the object exists (412, which s3fs makes a
    FileExistsError when the reply names the condition) or is being written (409)."""
    code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
    return isinstance(exc, FileExistsError) or code in ("PreconditionFailed", "ConditionalRequestConflict")


def _answer(read: Callable[[], bytes]) -> bytes | BaseException:
    """``read()``'s bytes, or what it raised (as ``fs.cat(on_error="return")`` answers)."""
    try:
        return read()
    except Exception as exc:
        return exc


def _fsync(handle: Any) -> None:
    try:
        handle.flush()
        os.fsync(handle.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file: nothing to sync
        pass


def _quiet_rm(fs: Any, path: str) -> None:
    with suppress(Exception):  # already renamed away, or the remote went down
        fs.rm_file(path)
