"""The no-op stamp's table of signatures: every path the answer was read from, once, in one
order (the whole answer's first, then the steps' own, which name theirs by place), and the
fast path's check of it, which is most of a no-op's time at 10,000 steps.

Each stat signature (mtime_ns, ctime_ns, size, inode) is packed in 32 bytes and the table's
rows are one base64 string: parsing 32,000 rows of four integers from JSON cost 28 ms of a
40 ms stamp, decoding the string 3. A folder signed by the names it holds keeps that signature
by place (``named``).

**Folders that vouch for their files.** optbuild writes a cache entry by name only (a
finished file renamed in, or removed; its use mark changes its times, never its bytes), and
each of those changes the folder's own signature. So where the recorded entries in one
folder (``ac/5e/``) are as recorded, and the folder's signature was the same before and
after checking them and before the cache's file system's clock, read first (git's racy
rule, with no margin: a cold build's last folders, written a moment before it ends, vouch
too; ``grouped``), the folder's one stat vouches for them all on the next no-op: 10,000 entries in 256 folders are 256 stats, not 10,000 (a third of
the no-op). A folder that changed sends the fast path to its entries one by one, so only
the steps whose own entries changed are decided again. An entry rewritten in place, which
optbuild never does, is seen by the next build that reads it, not by the fast path (the
step folders and outputs, which others may edit, are always checked one by one; so are
blobs, read-only but shared with outputs). The rows a folder vouches for come last, folder
by folder (``Group``).

Standard library only (os, struct, binascii): the fast path imports this.
"""

from __future__ import annotations

import binascii
import os
import struct
from collections.abc import Iterator

from optbuild.common.signatures import changed_within, signature

ROW = struct.Struct("<qqqQ")  # mtime_ns, ctime_ns, size, inode
ABSENT = ROW.pack(-1, -1, -1, 0)  # no file there (no stat gives a size of -1)
NAMED = ROW.pack(-2, -2, -2, 0)  # a folder signed by its names: see ``named``
NAMES = "names:"  # a folder's signature by the names it holds (``names_signature``)

Sig = list[int] | str


class Group:
    """Rows ``start`` to ``end`` of the table lie in ``folder``, which vouches for them while
    its own signature is ``sig``."""

    __slots__ = ("end", "folder", "row", "sig", "start")

    def __init__(self, folder: str, sig: list[int], start: int, end: int):
        self.folder, self.sig, self.start, self.end = folder, sig, start, end
        self.row = ROW.pack(*sig)  # struct.error when it is no signature


class SigTable:
    """The paths, their packed rows, the names signatures by place, and the groups of rows
    that one folder vouches for (the table's tail, from ``groups[0].start``)."""

    def __init__(self, paths: list[str], rows: bytes, named: dict[str, str], groups: list[Group]):
        if len(rows) != ROW.size * len(paths):
            raise ValueError(f"{len(rows)} bytes of signatures for {len(paths)} paths")
        self.paths, self.rows, self.named, self.groups = paths, rows, named, groups

    @classmethod
    def of(cls, sigs: dict[str, Sig], groups: list[Group] | None = None) -> SigTable:
        """The table of ``sigs`` (a path's stat signature, "absent", or by names), in their order."""
        rows = bytearray()
        named: dict[str, str] = {}
        for i, sig in enumerate(sigs.values()):
            if isinstance(sig, list):
                rows += ROW.pack(*sig)
            elif sig == "absent":
                rows += ABSENT
            else:
                rows += NAMED
                named[str(i)] = sig
        return cls(list(sigs), bytes(rows), named, groups or [])

    @classmethod
    def from_json(cls, doc: dict) -> SigTable:
        """The table as ``to_json`` wrote it; ValueError, KeyError or TypeError when damaged."""
        try:
            groups = [Group(folder, list(sig), int(start), int(end)) for folder, sig, start, end in doc["groups"]]
        except struct.error as exc:
            raise ValueError(f"a folder's signature is damaged: {exc}") from None
        paths = doc["paths"]
        if not isinstance(paths, list) or not isinstance(doc["named"], dict):
            raise TypeError("the table of signatures is damaged")
        return cls(paths, binascii.a2b_base64(doc["rows"]), doc["named"], groups)

    def to_json(self) -> dict:
        return {"paths": self.paths, "rows": binascii.b2a_base64(self.rows, newline=False).decode(),
                "named": self.named, "groups": [[g.folder, g.sig, g.start, g.end] for g in self.groups]}

    def sig(self, i: int) -> Sig:
        """The signature recorded for place ``i``."""
        row = self.rows[ROW.size * i:ROW.size * (i + 1)]
        if row == ABSENT:
            return "absent"
        if row == NAMED:
            return self.named[str(i)]
        return list(ROW.unpack(row))

    def sigs(self, places: list[int]) -> dict[str, Sig]:
        return {self.paths[i]: self.sig(i) for i in places}

    def changed(self) -> Iterator[int]:
        """The places whose file is not as recorded, in order; a group's rows only where its
        folder changed."""
        end = self.groups[0].start if self.groups else len(self.paths)
        yield from self._changed(0, end)
        for group in self.groups:
            if _row(group.folder) != group.row:
                yield from self._changed(group.start, group.end)

    def _changed(self, start: int, end: int) -> Iterator[int]:
        paths, rows, named, size, stat, pack = self.paths, self.rows, self.named, ROW.size, os.stat, ROW.pack
        for i in range(start, end):  # ``_row``, inlined: a call a file is a tenth of the check
            try:
                st = stat(paths[i])
            except (FileNotFoundError, NotADirectoryError):
                row = ABSENT
            else:
                row = pack(st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
            if row != rows[size * i:size * (i + 1)]:
                recorded = named.get(str(i))
                if recorded is None or names_signature(paths[i]) != recorded:
                    yield i


def _row(path: str) -> bytes:
    """``path``'s signature now, packed as a row."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    return ROW.pack(st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def names_signature(path: str) -> str:
    """A folder's signature by the names it holds, not by its times: a file replaced there
    under the same name (optbuild.lock, written whole) leaves it as it was; a name added or
    removed changes it. "absent" when it cannot be listed."""
    try:
        return names_digest(os.listdir(path))
    except OSError:
        return "absent"


def names_digest(names) -> str:
    from optbuild.common.quickhash import blake2b

    return NAMES + blake2b()("\0".join(sorted(names)).encode(errors="surrogateescape"), digest_size=16).hexdigest()


def grouped(sigs: dict[str, Sig], steps: dict[str, dict], *, first: int, under: str, clock_ns: int | None
            ) -> tuple[dict[str, Sig], list[Group]]:
    """``sigs`` reordered so that the rows from ``first`` on that lie in a folder under
    ``under`` (the cache) able to vouch for them come last, folder by folder, and those
    groups; each step's ``paths`` places follow. A folder vouches when its signature is the
    same before and after its rows were found as recorded (a file renamed in between changes
    it) and its times are before ``clock_ns``, its file system's now, read before it was
    (git's racy rule, on the file system's own clock: whatever changes the folder after
    that reading stamps it at or after it). None: no folder vouches."""
    paths = list(sigs)
    by_folder: dict[str, list[int]] = {}
    for i in range(first, len(paths)):
        if paths[i].startswith(under) and (isinstance(sig := sigs[paths[i]], list) or sig == "absent"):
            by_folder.setdefault(os.path.dirname(paths[i]), []).append(i)
    groups: list[tuple[str, list[int], list[int]]] = []
    for folder, places in sorted(by_folder.items()):
        before = signature(folder)
        if clock_ns is None or not isinstance(before, list) or changed_within(before, clock_ns, margin_ns=0):
            continue
        if all(signature(paths[i]) == sigs[paths[i]] for i in places) and signature(folder) == before:
            groups.append((folder, before, places))
    moved = {i for _, _, places in groups for i in places}
    order = [i for i in range(len(paths)) if i not in moved] + [i for _, _, places in groups for i in places]
    place = {old: new for new, old in enumerate(order)}
    for step in steps.values():
        step["paths"] = [place[i] for i in step["paths"]]
    start, found = len(order) - len(moved), []
    for folder, sig, places in groups:
        found.append(Group(folder, sig, start, start + len(places)))
        start += len(places)
    return {paths[i]: sigs[paths[i]] for i in order}, found
