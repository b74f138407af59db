"""What the last run decided, so that the next one re-checks only what could have changed.

A step's key is computed every run (its action, from the recipe, the stat-cached digests
of its files and its upstream outputs): keys and what rebuilds are exactly those of a
computation from scratch. What the memo spares is the cost after the key, which at fleet
scale is most of a no-op's: reading and validating each cache entry, re-checking each of its
blobs, and walking each step folder to see that it still holds the outputs.

For each step that ended cached, built or restored, ``build/.optbuild/decisions.json`` keeps
its key, what its entry says that the build needs (outputs, main output, log, warnings and
the metrics the lock file records) and the stat signatures (``os.lstat``: device, inode,
size, mtime, ctime) of its entry file, its blobs, its step folder and the outputs there. A
step whose key is the one recorded, and whose files all still have those signatures, takes
the recorded entry and needs no restoring; any other step is decided as without a memo. The
guarantees are the no-op fast path's (``cli.noop``): a file younger than ``RACY_NS`` when its
signature is taken is not vouched for (a racy timestamp). A build's own products are all
young when their step settles, so ``save`` looks at them again at the end of the run: one
now older than ``RACY_NS`` and small (``CHECK_MAX``) has its content checked (a blob or
output against its digest, the entry file against the entry, a folder against its listing:
git's answer to racy-clean files) and is then vouched for; any other is not recorded, and
its step is checked in full next time; an entry whose last use gc would soon count as old is
refreshed as a hit through the store refreshes it (and the signature that gives is vouched
for, the one before having been checked); a vanished or pulled entry or blob has another
signature. The memo holds only what the local cache and the build folder hold, so a damaged
or foreign memo is ignored: it costs speed, never correctness.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from optbuild.common.digest import ALGORITHM, DIGEST_HEX, hash_file
from optbuild.common.signatures import RACY_NS, changed_within
from optbuild.common.statefile import read_state, write_state
from optbuild.store.entry import FORMAT as ENTRY_FORMAT
from optbuild.store.entry import ActionEntry, OutputFile, check_relative_path, read_entry
from optbuild.store.layout import blob_name, entry_name
from optbuild.store.local import LocalStore

FORMAT = 2  # 1 held signatures in another order
NAME = "decisions.json"  # under <build folder>/.optbuild/
_HEX = frozenset("0123456789abcdef")
MAX_METRICS_BYTES = 4096  # a step whose metrics are larger is not remembered (its entry is read)
CHECK_MAX = 256 << 10  # a young product up to this size is content-checked at save (cli.noop's HASH_MAX)

Sig = tuple[int, int, int, int, int]  # mtime_ns, ctime_ns, size, inode, device (``signatures``' order)


def _sig(path: str) -> Sig | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


@dataclass
class Remembered:
    """One step as the last run left it. The signatures are in the order of the paths they
    are of (None: not vouched for): ``cache`` of its entry file then its blobs (sorted), ``folder``
    of its step folder, subfolders and outputs (``folder_paths``)."""

    key: str
    entry: dict[str, Any]  # the fields of its ActionEntry that a build reads (not the key material)
    cache: list[Sig | None]
    folder: list[Sig | None]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "entry": self.entry, "cache": self.cache, "folder": self.folder}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Remembered:
        return cls(doc["key"], doc["entry"], _sigs(doc["cache"]), _sigs(doc["folder"]))


class DecisionMemo:
    """The memo of one build folder and cache; ``entry`` and ``materialized`` answer from it,
    ``remember`` and ``save`` write the next one."""

    def __init__(self, build_dir: Path, store: LocalStore, *, used: bool = True):
        """``used``: False for a run that decides a few steps of many (``Scheduler``'s
        ``memo``): the memo is neither read nor written, since reading it all would cost more
        than it spares. Its records of the steps that run changed go stale, which costs the
        next run that reads them a store lookup each, never a wrong answer: a record serves
        only a step whose key, entry, blobs and folder are all as it says."""
        self.build_dir = build_dir
        self.path = build_dir / ".optbuild" / NAME
        self.store = store
        self.used = used
        self._cache = str(store.root.resolve())
        self._root = str(store.root)  # paths as text (``store.layout``): a no-op asks 10,000 times
        self._old = self._load() if used else {}
        self._new: dict[str, Remembered] = {}
        self._unchanged: set[str] = set()  # steps whose remembered entry served this run
        self._dests: dict[str, str] = {}  # step -> its folder, for the records made this run
        self._in_place: set[str] = set()  # steps whose folder was as remembered this run
        self._changed = False  # a record was made, dropped or refreshed: the memo is written at save

    def _load(self) -> dict[str, Remembered]:
        if (doc := read_state(self.path, format=FORMAT, cache=self._cache)) is None:
            return {}  # absent, damaged or foreign: decide in full
        try:
            return {sid: Remembered.from_json(r) for sid, r in doc["steps"].items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            return {}

    def entry(self, sid: str, key: str, spec_kind: str, ingredients: dict[str, Any]) -> ActionEntry | None:
        """The entry of ``key`` as remembered, when nothing it was read from changed (its
        last use is refreshed when it is old, as the store does); else None (ask the store)."""
        old = self._old.get(sid)
        if old is None or old.key != key:
            return None
        try:
            paths = self._cache_paths(key, old.entry)
            if not _unchanged(paths, old.cache):
                return None
            found = ActionEntry.model_construct(  # every field given: pydantic copies the defaults of the others
                format=ENTRY_FORMAT, digest_function=ALGORITHM, key=key, kind=spec_kind, ingredients=ingredients,
                **{**old.entry, "outputs": _outputs(old.entry)})
        except (TypeError, ValueError, KeyError, AttributeError):  # a damaged memo: ask the store
            return None
        entry_sig = old.cache[0]
        assert entry_sig is not None  # _unchanged vouched for it
        try:  # as a hit through the store does; the signature that gives is vouched for: the one before was just checked
            if self.store.refresh_use(paths[0], entry_sig[0]):
                old.cache[0] = _sig(paths[0])
                self._changed = True
        except OSError:
            pass
        self._unchanged.add(sid)
        return found

    def materialized(self, sid: str, key: str, dest: Path) -> bool:
        """Whether ``dest`` is as the last run left it for ``key``: the folder (so nothing was
        added or removed), its subfolders and every output have their recorded signatures."""
        old = self._old.get(sid)
        if old is None or old.key != key:
            return False
        try:
            if not _unchanged(folder_paths(str(dest), old.entry["outputs"]), old.folder):
                return False
        except (TypeError, ValueError, KeyError, AttributeError):
            return False
        self._in_place.add(sid)
        return True

    def remember(self, sid: str, entry: ActionEntry, dest: Path | None) -> None:
        """Note that ``sid`` settled ok with ``entry``, just checked (restored in ``dest``;
        None for a dry run, whose folder is not vouched for). Signatures are taken now, right
        after the check; a path changed within RACY_NS of now is left out (checked in full
        next time). A step whose metrics are large is not remembered: its entry is read."""
        old = self._old.get(sid)
        if old is not None and old.key == entry.key and sid in self._unchanged and sid in self._in_place:
            self._new[sid] = old  # checked against its signatures just now
            return
        self._changed = True
        fields: dict[str, Any] = {"step": entry.step, "primary": entry.primary, "log": entry.log,
                  "outputs": {n: [o.digest, o.size] for n, o in entry.outputs.items()},
                  "metrics": entry.metrics, "duration_s": entry.duration_s, "created_at": entry.created_at,
                  "built_on": entry.built_on}
        try:
            if len(json.dumps(entry.metrics, default=str)) > MAX_METRICS_BYTES:
                return
        except (TypeError, ValueError, RecursionError):
            return
        now = time.time_ns()
        folder = folder_paths(str(dest), fields["outputs"]) if dest is not None else []
        self._new[sid] = Remembered(entry.key, fields, _vouched(self._cache_paths(entry.key, fields), now),
                                    _vouched(folder, now))
        if dest is not None:
            self._dests[sid] = str(dest)

    def forget(self, sid: str) -> None:
        """Drop what is remembered of ``sid``: its folder was emptied (its outputs stay on the
        remote cache), so the next run decides it in full."""
        if self._old.pop(sid, None) is not None or self._new.pop(sid, None) is not None:
            self._changed = True

    def save(self) -> None:
        """Write the memo of this run (atomically; best effort: a memo not written only costs
        speed). Steps not decided this run keep their record. A run that changed no record (a
        no-op) writes nothing: 7 MB of JSON at 10,000 steps."""
        if not self.used:
            return
        self._vouch_young()
        if not self._changed:
            return
        steps = {sid: r.to_json() for sid, r in {**self._old, **self._new}.items()}
        doc = {"format": FORMAT, "cache": self._cache, "steps": steps}
        with suppress(OSError):  # not made: nothing is written
            self.path.parent.mkdir(exist_ok=True)
        write_state(self.path, self.build_dir, doc, "the decision memo")

    def _vouch_young(self) -> None:
        """The signatures left out of this run's records as young: each path now older than
        RACY_NS whose content checks out is vouched for (see the module's docstring)."""
        now = time.time_ns()
        for sid, record in self._new.items():
            if None not in record.cache and None not in record.folder:
                continue
            self._changed = True
            try:
                checks: list[Callable[[str], bool]] = [partial(_entry_holds, record=record)]
                checks += [partial(_file_holds, digest=d) for d in _digests(record.entry)]
                record.cache = _recheck(self._cache_paths(record.key, record.entry), record.cache, checks, now)
                if (dest := self._dests.get(sid)) is not None:
                    expected = _folder_contents(dest, record.entry["outputs"])
                    folder = folder_paths(dest, record.entry["outputs"])
                    record.folder = _recheck(folder, record.folder,
                                             [partial(_holds, expected=expected[p]) for p in folder], now)
            except (OSError, TypeError, ValueError, KeyError, AttributeError):
                continue  # left as it was: checked in full next run

    def _cache_paths(self, key: str, fields: dict[str, Any]) -> list[str]:
        """The entry file of ``key`` (a digest computed here), then the blobs ``fields`` name:
        as text, each digest checked (a memo is a file, and no name read from it may point
        outside the cache)."""
        paths = [f"{self._root}/{entry_name(key)}"]
        for digest in _digests(fields):
            if len(digest) != DIGEST_HEX or not _HEX.issuperset(digest):
                raise ValueError(f"not a digest: {digest[:80]!r}")
            paths.append(f"{self._root}/{blob_name(digest)}")
        return paths



def _sigs(value: Any) -> list[Sig | None]:
    return [None if s is None else (int(s[0]), int(s[1]), int(s[2]), int(s[3]), int(s[4])) for s in value]


def _unchanged(paths: list[str], sigs: list[Sig | None]) -> bool:
    """Whether every path has the signature recorded for it (none is vouched for without one)."""
    return len(paths) == len(sigs) and all(sig is not None and _sig(p) == sig for p, sig in zip(paths, sigs))


def _vouched(paths: list[str], now: int) -> list[Sig | None]:
    """The signatures of ``paths``; None for one changed within RACY_NS of ``now`` (or absent)."""
    sigs: list[Sig | None] = []
    for path in paths:
        sig = _sig(path)
        sigs.append(sig if sig is not None and not changed_within(sig, now, RACY_NS) else None)
    return sigs


def _recheck(paths: list[str], sigs: list[Sig | None], checks: list[Callable[[str], bool]],
             now: int) -> list[Sig | None]:
    """``sigs`` with each None (young when taken) replaced by the path's signature when it is
    now older than RACY_NS, it is small, its content passes its check, and the signature is
    the same after the check as before it (nothing wrote meanwhile)."""
    result = list(sigs)
    for i, (path, sig) in enumerate(zip(paths, sigs)):
        if sig is not None:
            continue
        before = _sig(path)
        if before is None or changed_within(before, now, RACY_NS) or before[2] > CHECK_MAX:
            continue
        if checks[i](path) and _sig(path) == before:
            result[i] = before
    return result


def _entry_holds(path: str, record: Remembered) -> bool:
    """Whether the entry file at ``path`` is the entry ``record`` remembers."""
    entry = read_entry(Path(path), record.key)
    return ({n: [o.digest, o.size] for n, o in entry.outputs.items()} == record.entry["outputs"]
            and entry.log == record.entry["log"] and entry.primary == record.entry["primary"])


def _file_holds(path: str, digest: str) -> bool:
    """Whether ``path`` is a regular file whose bytes have ``digest``."""
    return stat.S_ISREG(os.lstat(path).st_mode) and hash_file(Path(path))[0] == digest


def _holds(path: str, expected: str | frozenset[str]) -> bool:
    """A folder holds exactly the names ``expected`` (a set); a file has the digest ``expected``."""
    if isinstance(expected, frozenset):
        return not os.path.islink(path) and frozenset(os.listdir(path)) == expected
    return _file_holds(path, expected)


def _folder_contents(dest: str, outputs: dict[str, Any]) -> dict[str, str | frozenset[str]]:
    """What each of ``folder_paths`` must hold: a folder its names, an output its digest."""
    names: dict[str, set[str]] = {dest: set()}
    expected: dict[str, str | frozenset[str]] = {}
    for name, (digest, _size) in outputs.items():
        parts = name.split("/")
        for i in range(len(parts)):
            parent = os.path.join(dest, *parts[:i])
            names.setdefault(parent, set()).add(parts[i])
        expected[os.path.join(dest, *parts)] = digest
    expected.update({folder: frozenset(children) for folder, children in names.items()})
    return expected


def _digests(fields: dict[str, Any]) -> list[str]:
    """The blobs an entry names: its outputs' and its log's."""
    found = {digest for digest, _size in fields["outputs"].values()}
    if fields.get("log"):
        found.add(fields["log"])
    return sorted(found)


def _outputs(fields: dict[str, Any]) -> dict[str, OutputFile]:
    """The outputs as the entry names them: each name a safe relative path, as an entry's
    (a restore writes there), their digests checked by ``_cache_paths``."""
    outputs = {}
    for name, (digest, size) in fields["outputs"].items():
        if not isinstance(size, int):
            raise TypeError("an output's size is not a number")
        outputs[check_relative_path(name)] = OutputFile.model_construct(digest=digest, size=size)
    return outputs


def folder_paths(dest: str, outputs: dict[str, Any]) -> list[str]:
    """The step folder, its subfolders and its outputs: what ``materialized`` re-checks (and
    what the no-op stamp signs of a step, ``app/noop_record``)."""
    paths = {dest}
    for name in outputs:
        parts = name.split("/")
        paths.update(os.path.join(dest, *parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(paths)
