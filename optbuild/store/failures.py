"""Remembered failures: a step that failed deterministically, by its action key.

A step that fails in its own code (a StepError, a tool's exception) fails the same way on
the same inputs, parameters, tools and host: everything its key covers. Running it again
costs minutes and says nothing new, so ``build -k`` and ``plan`` report the remembered
failure instead, until the key changes or ``--retry-failed`` asks for a new attempt.
Failures that may not repeat (a killed worker, a full disk, a cancelled build, an input
edited mid-build) are never remembered.

Records live in ``cache/failed/<key>.json``, on this machine only: the remote cache shares
results, not one host's failures. A record is written whole (temp file, rename) and read
with the same bounds as an entry; a damaged one is a miss, removed where the cache is
writable.
"""

from __future__ import annotations

import json
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from optbuild.common.atomic import write_atomic
from optbuild.store.entry import EntryError, check_digest, check_json_bounds

FORMAT = 1
MAX_LOG_CHARS = 256 << 10  # the log's tail: enough to read the failure, small enough to keep
MAX_AGE_S = 7 * 24 * 3600.0  # gc forgets older failures (a forgotten one just runs again)


@dataclass(frozen=True)
class Failure:
    key: str
    step: str
    error: str
    log: str  # the tail of the step's log
    created_at: float

    def describe(self) -> str:
        """The remembered message, and when and how to run the step again."""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created_at))
        return (f"{self.error}\n(remembered: it failed this way on {when} with this same key; it runs "
                "again when its inputs, parameters or tools change, or with --retry-failed)")


class FailureStore:
    def __init__(self, root: Path, *, writable: bool = True):
        self.folder = root / "failed"
        self.writable = writable

    def _path(self, key: str) -> Path:
        return self.folder / f"{check_digest(key, 'key')}.json"

    def get(self, key: str) -> Failure | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            check_json_bounds(data)
            doc = json.loads(data)
            if doc.get("format") != FORMAT or doc.get("key") != key:
                raise EntryError("not a failure record of this key")
            return Failure(key=key, step=str(doc["step"]), error=str(doc["error"]),
                           log=str(doc["log"]), created_at=float(doc["created_at"]))
        except (EntryError, ValueError, KeyError, TypeError, AttributeError):
            if self.writable:
                path.unlink(missing_ok=True)
            return None

    def put(self, key: str, step: str, error: str, log: bytes) -> None:
        text = log.decode(errors="replace")[-MAX_LOG_CHARS:]
        record = {"format": FORMAT, **asdict(Failure(key, step, error, text, time.time()))}
        write_atomic(self._path(key), json.dumps(record, sort_keys=True).encode())

    def drop(self, key: str) -> None:
        if self.writable:
            self._path(key).unlink(missing_ok=True)

    def prune(self, max_age_s: float = MAX_AGE_S) -> int:
        """Forget failures recorded more than ``max_age_s`` ago (and temp files as old: their
        writer is gone); how many went. Plain files only: nothing else is followed or
        removed. Keys change with every edit, so records would otherwise pile up."""
        oldest = time.time() - max_age_s
        dropped = 0
        try:
            names = list(self.folder.iterdir())
        except FileNotFoundError:
            return 0
        for path in names:
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_mtime < oldest:
                path.unlink(missing_ok=True)
                dropped += 1
        return dropped
