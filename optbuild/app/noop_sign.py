"""Signing what an ok build's answer was read from, for the no-op stamp
(``optbuild.app.noop_record``): each path's stat signature, or, where it changed too recently
for its times to vouch, the content the build read of it; and when it cannot vouch at all."""

from __future__ import annotations

import os
import stat
import time

from optbuild.common import signatures, usermodule
from optbuild.common.noopstamp import (
    HASH_MAX,
    TEXT_MAX,
    bytes_digest,
    content_digest,
    shown,
    vouched_folder,
)
from optbuild.common.signatures import changed_within, file_system_clock, of_stat, signature
from optbuild.common.sigtable import names_signature


def _written_beside(project) -> set[str]:
    """The names a build writes in the lock file's folder: the lock file, and the build and
    cache folders where they lie there (a first build makes them)."""
    lock = os.path.abspath(project.lock_file)
    return {os.path.basename(p) for p in (lock, os.path.abspath(project.build_dir), os.path.abspath(project.cache_dir))
            if os.path.dirname(p) == os.path.dirname(lock)}


class Signer:
    """Signs what a build's answer was read from (``sign``), for one recording: the moment the
    build started, the cache entries it marked used (``vouched``: a signature it may keep),
    optbuild.lock and the names the build writes beside it, and what the build read of each
    file by content (the TOML texts it loaded, the sources it compiled, the files it hashed)."""

    def __init__(self, ws, started: int, root: str, earlier: dict[str, str]):
        self.started = started
        self.root = root
        self.vouched = ws.store.refreshed
        self.lock = os.path.abspath(ws.project.lock_file)
        self.written = _written_beside(ws.project)
        self.recorded_ns = time.time_ns()
        # before any product is signed: what changes after this is stamped at or after it
        self.clocks = dict(filter(None, (file_system_clock(os.path.abspath(ws.project.build_dir)),
                                         file_system_clock(os.path.abspath(ws.store.root)))))
        self.blobs = os.path.join(os.path.abspath(ws.store.root), "cas") + os.sep
        self._blobs_clock = self.clock_of(self.blobs)
        self.texts = ws.project.texts
        self.hashed = getattr(ws.hasher, "read", {})
        self.earlier = earlier  # what the stamp this build started from content-checked
        self._folders: dict[str, list[int] | str] = {}  # a folder's signature, once (steps share one)
        self._contents: dict[str, str | None] = {}  # a young file's ``_by_content``, once (a recipe's steps share it)

    def sign(self, inputs: set[str], products: set[str], *, folders: dict[str, str] | None = None
             ) -> tuple[dict[str, list[int] | str], dict[str, str], str | None]:
        """The signatures of ``inputs`` and ``products``, the content digests of those changed
        too recently for theirs, and why they cannot vouch for what was read (None: they can).
        Inputs: older than the build's start (less the margin), or content-checked against what
        the build read when small and known (``_by_content``); a folder by the names it holds (a
        file saved by renaming a new one over it leaves them as they were; its own signature
        tells), those of ``folders`` so too however young (the recipe folders), and the lock
        file's folder so too when only the build's own writes there changed them. Products:
        with times before their file system's clock, read before any was signed (else older
        than now less the margin), or with the signature the build's own mark of use
        gave (``vouched``: a cache entry read and checked just before), or content-checked when
        small (the lock file, whatever its size: a build that changed a step rewrites it), or,
        a folder, by its names."""
        sigs: dict[str, list[int] | str] = {}
        digests: dict[str, str] = {}
        racy = []
        for path in sorted(inputs):
            sig = sigs[path] = self._input(path, folders or {})
            if not changed_within(sig, self.started):
                continue
            if (digest := self._by_content(path, sig)) is not None:
                digests[path] = digest
            else:
                racy.append(shown(path, self.root))
        unusable = None
        if racy:
            more = f" and {len(racy) - 3} more" if len(racy) > 3 else ""
            unusable = f"{', '.join(racy[:3])}{more} changed within {signatures.RACY_NS / 1e9:g} s of the build's start"
        for path in sorted(products):
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                sigs[path] = "absent"
                continue
            sig = sigs[path] = of_stat(st)
            if unusable is not None or not self._young(sig, self.clocks.get(st.st_dev)) or self.vouched.get(path) == sig:
                continue
            if stat.S_ISREG(st.st_mode) and (sig[2] <= HASH_MAX or path == self.lock):
                digests[path] = content_digest(path)
                if signature(path) == sig:
                    continue
            elif stat.S_ISDIR(st.st_mode):  # a step's folder: its files are signed
                sigs[path] = names_signature(path)
                continue
            unusable = f"{shown(path, self.root)} was written as the recording began"
        return sigs, digests, unusable

    def clock_of(self, path: str) -> int | None:
        """Now as the file system holding ``path`` stamps times, read before signing began
        (None where it was not read: a file system other than the build folder's and the cache's)."""
        try:
            return self.clocks.get(os.stat(path).st_dev)
        except OSError:
            return None

    def _young(self, sig: list[int], clock: int | None) -> bool:
        """Whether a product changed too recently for its signature ``sig`` to vouch for it: at
        or after ``clock``, its file system's now read before signing (``file_system_clock``),
        else within the racy margin of the recording."""
        return changed_within(sig, clock, margin_ns=0) if clock is not None else changed_within(sig, self.recorded_ns)

    def linked(self, sigs: dict[str, list[int] | str]) -> list[str]:
        """The blobs in ``sigs`` an output vouches for: a name of the same inode (an output is
        restored as a hard link of its blob) recorded with the same signature, not racy (as any
        product: ``_young``, on the cache's clock). Unlinking or replacing either name changes
        the inode's ctime, which that signature holds: one stat checks both (10,000 steps,
        10,000 stats fewer a no-op)."""
        outputs = {tuple(sig) for path, sig in sigs.items()
                   if isinstance(sig, list) and not path.startswith(self.blobs)}
        return [path for path, sig in sigs.items() if path.startswith(self.blobs) and isinstance(sig, list)
                and tuple(sig) in outputs and not self._young(sig, self._blobs_clock)]

    def _by_content(self, path: str, sig: list[int] | str) -> str | None:
        """The digest by which the young input ``path`` vouches: what the build read of it,
        where the file still holds that (None: it cannot vouch). Once a path: the 10,000 steps
        of one recipe would otherwise hash its text 10,000 times."""
        if path not in self._contents:
            digest = self._as_read(path, sig)
            self._contents[path] = digest if digest is not None and _holds(path, digest) else None
        return self._contents[path]

    def _as_read(self, path: str, sig: list[int] | str) -> str | None:
        """The digest of what the build read of the file ``path``: the TOML text it loaded,
        the source it compiled, the bytes it hashed (all of them, where more than one, and
        alike), or, for a file it did not read, what its start found it unchanged against.
        None where unknown, read differently, or larger than HASH_MAX (each no-op reads it
        whole; TEXT_MAX for a text the build parsed whole)."""
        parsed = path in self.texts or path in usermodule.compiled
        if not isinstance(sig, list) or sig[2] > (TEXT_MAX if parsed else HASH_MAX):
            return None
        seen = []
        if (text := self.texts.get(path)) is not None:
            seen.append(bytes_digest(text.encode()))
        if path in usermodule.compiled:
            seen.append(usermodule.compiled[path])
        if path in self.hashed:
            seen.append(self.hashed[path])  # None: it changed while the build read it
        if not seen and path in self.earlier:
            seen.append(self.earlier[path])
        return seen[0] if seen and None not in seen and len(set(seen)) == 1 else None

    def _input(self, path: str, folders: dict[str, str]) -> list[int] | str:
        """An input's signature: a folder that did not change since before the build started
        by the names it holds (as it held them all along, then), else by its times, but for
        ``folders``, signed by names however young (and not kept for the steps' own)."""
        if (found := self._folders.get(path)) is not None:
            return found
        if (names := folders.get(path)) is not None:
            return names
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return "absent"
        sig: list[int] | str = of_stat(st)
        if not stat.S_ISDIR(st.st_mode):
            return sig
        if path == os.path.dirname(self.lock) and (names := vouched_folder(path, self.written)) is not None:
            sig = names
        elif not changed_within(sig, self.started):
            sig = names_signature(path)
        self._folders[path] = sig
        return sig


def _holds(path: str, digest: str) -> bool:
    """Whether the file ``path`` holds what ``digest`` names (not so where it changed since it
    was read, or where it was read as text with other line ends than its bytes)."""
    try:
        return content_digest(path) == digest
    except OSError:
        return False
