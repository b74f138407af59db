"""What ``optbuild cache verify`` finds in a whole remote."""

from __future__ import annotations

from dataclasses import dataclass, field

from optbuild.store.entry import ActionEntry


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
