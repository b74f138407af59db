"""Materialisation: an entry's outputs made into a folder (a step's build folder), sharing
bytes with the blobs, swapped in whole; and the checks of whether a folder still holds them.

Restored outputs are reflinks of the blobs where the file system can clone, else hard
links, else copies; so an edit through a hard link reaches the blob, whose stat signature
then changes, and it is re-read, found corrupt and dropped before it is served again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from optbuild.common.digest import digest_bytes
from optbuild.common.errors import CacheError
from optbuild.store.content import ContentStore
from optbuild.store.entry import ActionEntry, OutputFile, check_relative_path
from optbuild.store.files import copy_hashing, owned_name, owner_dead, remove

_FICLONE = 0x40049409  # Linux ioctl: make a file share another's extents (btrfs, XFS, bcachefs)
_HIDDEN = re.compile(r"\..+\.(\d+@[^@]+@(?:new|old)-[0-9a-f]{12})")  # materialize's siblings


class BlobGone(CacheError):
    """A blob vanished (gc, a user) or proved corrupt while it was being restored: the
    entry is a miss, and the step rebuilds rather than fails."""


class Materializer(ContentStore):
    """Restores entries of a cache folder's blobs into folders outside it."""

    _reflinks = True  # until the file system says it cannot clone

    @contextmanager
    def lock_dest(self, dest: Path) -> Iterator[None]:
        """Held while ``dest`` is checked and restored, so concurrent restores do not race."""
        with self.lock("dest-" + digest_bytes(str(dest).encode())):
            yield

    def materialize(self, entry: ActionEntry, dest: Path) -> None:
        """Make the folder ``dest`` hold exactly the entry's outputs, read-only.

        Files are reflinks of the blobs where the file system can clone (free, and an edit
        stays in the copy), else hard links (free), else copies. Each blob is verified
        first (a stat when unchanged); one that is gone or corrupt raises BlobGone. The
        tree is built in a hidden sibling and swapped in, so ``dest`` is never half
        populated: a reader sees the old tree, nothing, or the new tree. Folders stay
        writable so that users can delete the tree. The caller sweeps the leftovers of killed
        swaps (``sweep_leftovers``), once a run and folder: a listing of the folder per
        restore made restoring a recipe of N steps cost N² names.
        """
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        hidden = f".{dest.name}."
        staging = dest.parent / (hidden + owned_name("new"))
        old = dest.parent / (hidden + owned_name("old"))
        staging.mkdir()
        try:
            self._populate(entry, staging)
            with suppress(FileNotFoundError):
                os.rename(dest, old)
            os.rename(staging, dest)
        finally:
            remove(staging)
            remove(old)

    def _populate(self, entry: ActionEntry, folder: Path) -> None:
        root = folder.resolve()
        parents = {p.as_posix() for name in entry.outputs for p in Path(name).parents}
        for name, output in sorted(entry.outputs.items()):
            try:
                check_relative_path(name)
            except ValueError as exc:
                raise CacheError(f"entry {entry.key}: {exc}") from None
            target = folder / name
            if name in parents or not target.parent.resolve().is_relative_to(root):
                raise CacheError(f"entry {entry.key}: output path {name!r} cannot be written")
            target.parent.mkdir(parents=True, exist_ok=True)
            self._place(output, name, target)

    def _place(self, output: OutputFile, name: str, target: Path) -> None:
        """Put the verified blob of ``output`` at ``target``: a reflink, a hard link or a copy."""
        source = self.blob_path(output.digest)
        problem, _size = self._blob_problem(output.digest)
        if problem == "missing":
            raise BlobGone(f"blob {output.digest} of {name} is not in the cache")
        if problem is not None:
            raise BlobGone(f"blob {output.digest} of {name} is {problem}")
        if self._reflinks and self._reflink(source, target):
            os.chmod(target, 0o444)
            self.hasher.record(target, output.digest)
            return
        try:
            os.link(source, target)
        except FileNotFoundError:
            raise BlobGone(f"blob {output.digest} of {name} is not in the cache") from None
        except OSError:  # another file system, link limit, links forbidden: copy
            if copy_hashing(source, target) != output.digest:
                raise BlobGone(f"blob {output.digest} of {name} changed while it was copied") from None
            os.chmod(target, 0o444)
            self.hasher.record(target, output.digest)
        else:  # the link changed the blob's ctime: record it again, just verified
            with suppress(OSError):
                self.hasher.record(source, output.digest)

    def _reflink(self, source: Path, target: Path) -> bool:
        """Clone ``source`` into a new file ``target`` (shared extents, copy on write);
        False, with nothing left at ``target``, where the file system cannot."""
        try:
            with open(source, "rb") as src, open(target, "xb") as dst:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            return True
        except OSError as exc:
            target.unlink(missing_ok=True)
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.EXDEV, errno.ENOSYS):
                self._reflinks = False  # this file system never will: stop asking
            return False

    def sweep_leftovers(self, folder: Path) -> None:
        """Remove the hidden trees that restores killed mid-swap left in ``folder``.

        One listing: the restorer runs it once a run in each folder it restores into, even
        when nothing needs restoring there, so that a leftover is found even when its step's
        outputs never need restoring again.
        """
        with suppress(OSError):  # an unreadable or read-only folder: the restore itself says so
            for sibling in Path(folder).iterdir():
                match = _HIDDEN.fullmatch(sibling.name)
                if match and owner_dead(match.group(1)):
                    remove(sibling)

    def is_materialized(self, entry: ActionEntry, dest: Path) -> bool:
        """Whether ``dest`` already holds exactly the entry's outputs (cheap: no copy made).

        Every output is there as a regular file with the right size and digest, and
        nothing else is there. The digest is the stat cache's: of the blob when the file is
        its hard link (so an edit of the blob counts), else of the file itself.
        """
        dest = Path(dest)
        wanted_dirs = {p.as_posix() for name in entry.outputs for p in Path(name).parents} - {"."}
        try:
            if _listing(str(dest), wanted_dirs) != set(entry.outputs):
                return False
            return all(self._holds(dest / name, output) for name, output in entry.outputs.items())
        except OSError:
            return False

    def _holds(self, path: Path, output: OutputFile) -> bool:
        """Whether ``path`` is a regular file with ``output``'s bytes (a stat, when unchanged)."""
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != output.size:
            return False
        blob = self.blob_path(output.digest)
        with suppress(FileNotFoundError):
            linked = os.stat(blob)
            if (linked.st_dev, linked.st_ino) == (st.st_dev, st.st_ino):
                path = blob  # one inode: the blob's record is kept up to date
        return self.hasher.digest(path) == output.digest

    def changed_outputs(self, entry: ActionEntry, dest: Path) -> list[str]:
        """Names of the entry's outputs that ``dest`` no longer holds intact (a step that
        wrote into its input, say). A blob the change reached, through a hard link, is
        deleted, so that no later build is served it."""
        changed = []
        for name, output in sorted(entry.outputs.items()):
            try:
                if self._holds(Path(dest) / name, output):
                    continue
            except OSError:
                pass
            changed.append(name)
            self._blob_problem(output.digest)
        return changed


def _listing(folder: str, wanted_dirs: set[str]) -> set[str] | None:
    """The relative names of everything but folders under ``folder``; None when a folder
    there is not one of ``wanted_dirs`` or is a symbolic link (os.scandir: a stat-free walk,
    as a no-op looks at every step's folder). OSError when ``folder`` cannot be listed."""
    found: set[str] = set()
    stack = [("", folder)]
    while stack:
        prefix, path = stack.pop()
        with os.scandir(path) as entries:
            for item in entries:
                name = prefix + item.name
                if item.is_dir():
                    if name not in wanted_dirs or item.is_symlink():
                        return None
                    stack.append((name + "/", item.path))
                else:
                    found.add(name)
    return found
