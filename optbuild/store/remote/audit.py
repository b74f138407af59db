"""What ``optbuild cache verify`` finds in a whole remote."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from optbuild.store.entry import ActionEntry, is_digest
from optbuild.store.remote.errors import Failed, Rejected
from optbuild.store.remote.parts import SessionParts
from optbuild.store.remote.signing import KEY_ID_HEX


@dataclass
class RemoteAudit:
    """What ``RemoteSession.audit`` found. Without signatures it can say only that every blob
    is what its entry records, never that the entry is the true one: ``shared`` lists what a
    rewired entry would look like."""

    signed: bool = False  # entries were checked against this host's signing key
    rehashed: bool = False  # blobs were downloaded and hashed, not only sized
    entries: int = 0
    blobs: int = 0
    orphan_blobs: int = 0
    problems: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # blobs that entries of several steps name as outputs

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        checked = "sizes and digests" if self.rehashed else "sizes (--rehash: digests too)"
        verdict = "PROBLEMS FOUND" if not self.ok else "all intact" if self.signed else "no problem found, unsigned"
        lines = [f"remote: checked {self.entries} entries and {self.blobs} blobs ({checked}): {verdict}"]
        lines += [f"  {p}" for p in self.problems]
        if self.orphan_blobs:
            lines.append(f"  {self.orphan_blobs} blobs that no entry names")
        if not self.signed and self.entries:
            lines.append("  note: the entries are not signed: each names blobs that are what it records, but an "
                         "entry rewired to another build's intact blob cannot be told from a true one "
                         "(set [remote] signing_key_env)")
            lines += [f"  note: {line} (identical outputs, or a rewired entry)" for line in self.shared]
        return "\n".join(lines)


def check_size(entry: ActionEntry, name: str | None, recorded: int | None, actual: int | None,
                report: RemoteAudit) -> None:
    """Report the blob of ``entry``'s output ``name`` (None: its log, whose size no entry
    records) when it is missing or not of the size the entry records."""
    what = f"entry {entry.key} ({entry.step}) {what_is(name)}"
    digest = entry.log if name is None else entry.outputs[name].digest
    if actual is None:
        report.problems.append(f"{what} names missing blob {digest}")
    elif recorded is not None and actual != recorded:
        report.problems.append(f"{what}: blob {digest} holds {actual} bytes, the entry records {recorded}")


def what_is(name: str | None) -> str:
    return "log" if name is None else f"output {name}"


class Auditing(SessionParts):
    """``RemoteSession``'s check of the whole remote (``cache verify``): a mixin, whose
    breaker and reads are the session's."""

    def audit(self, *, rehash: bool = False) -> RemoteAudit:
        """Check the whole remote: every entry acceptable, every blob it names present with
        the size it records for it (and with ``rehash``, downloaded and hashed: each entry
        whose blob is not what it records is named). Nothing is changed."""
        report = RemoteAudit(signed=self.store.signing_key is not None, rehashed=rehash)
        if not self._usable():
            report.problems.append("remote not readable")
            return report
        try:
            listed = self._call("listing entries", self.store._list, "ac")
            blobs = self._call("listing blobs", self.store._list, "cas")
        except Failed as exc:
            report.problems.append(f"cannot list the remote: {exc}")
            return report
        sizes = {}
        for path, size in blobs.items():
            parts = path.rsplit("/", 2)
            sizes[parts[-2] + parts[-1]] = size
        report.blobs = len(sizes)
        entries = [entry for path in sorted(listed) if (entry := self._audited_entry(path, report)) is not None]
        uses: dict[str, list[tuple[ActionEntry, str | None]]] = {}  # digest -> (entry, output name; None: log)
        for entry in entries:  # what an entry carries inline was checked with it, and needs no blob
            for name, output in sorted(entry.outputs.items()):
                uses.setdefault(output.digest, []).append((entry, name))
                if output.digest not in entry.inline:
                    check_size(entry, name, output.size, sizes.get(output.digest), report)
            if entry.log is not None:
                uses.setdefault(entry.log, []).append((entry, None))
                if entry.log not in entry.inline:
                    check_size(entry, None, None, sizes.get(entry.log), report)
        if rehash:
            for digest in sorted(set(sizes) & set(uses)):
                self._audit_digest(digest, sizes[digest], uses[digest], report)
        if not report.signed:
            report.shared = [f"blob {digest} is an output of {', '.join(sorted(steps))}"
                             for digest, named in sorted(uses.items())
                             if len(steps := {entry.step for entry, name in named if name is not None}) > 1]
        report.orphan_blobs = len(set(sizes) - set(uses))
        return report

    def _audited_entry(self, path: str, report: RemoteAudit) -> ActionEntry | None:
        """The acceptable entry at ``path`` (from the listing of ac/), or None: not an entry's
        file, gone since the listing, or a problem (recorded in ``report``)."""
        folder, name = path.rsplit("/", 2)[-2:]
        if not name.endswith(".json"):
            return None
        stem, _, slot = name[: -len(".json")].partition(".")
        key = folder + stem
        report.entries += 1
        if not is_digest(key) or (slot and not re.fullmatch(f"[0-9a-f]{{{KEY_ID_HEX}}}", slot)):
            report.problems.append(f"{path}: not where an entry belongs")
            return None
        shown = key if not slot else f"{key} (beside it, signed with key {slot})"
        try:
            data = self._read(key, slot or None)
            return self._decode(data, key)
        except FileNotFoundError:  # removed since the listing
            return None
        except Failed as exc:
            report.problems.append(f"entry {shown}: could not be read ({exc})")
        except Rejected as exc:
            report.problems.append(f"entry {shown}: {exc}")
        return None

    def _audit_digest(self, digest: str, size: int, named: list[tuple[ActionEntry, str | None]],
                      report: RemoteAudit) -> None:
        """Download blob ``digest`` and hash it; a blob that is not what its entries record
        is reported with every entry and output that names it."""
        try:
            got = self._call(f"hashing blob {digest[:8]}", self.store._hash_blob, digest, size, missing_ok=True)
        except (FileNotFoundError, Failed, Rejected) as exc:
            report.problems.append(f"blob {digest}: could not be read ({exc})")
            return
        if got == digest:
            return
        for entry, name in named:
            report.problems.append(f"entry {entry.key} ({entry.step}) {what_is(name)}: blob {digest} is corrupt "
                                   f"(its bytes hash to {got})")
