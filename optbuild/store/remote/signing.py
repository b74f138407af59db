"""Action entries as the remote holds them: encoded with an HMAC signature line naming the key
that signed them, and decoded only when valid (key, digests, paths, signature)."""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Literal

from optbuild.store.entry import (
    MAX_ENTRY_BYTES,
    ActionEntry,
    EntryError,
    canonical_json,
    parse_entry,
)
from optbuild.store.remote.errors import Rejected

SIGNATURE_PREFIX = b"optbuild-hmac-sha256 "
KEY_ID_HEX = 16
SIGNATURE_LINE = len(SIGNATURE_PREFIX) + KEY_ID_HEX + 1 + 64 + 1  # the longest: with a key id
# "<prefix><key id> <hmac>"; lines without a key id were written before key ids existed
_SIGNATURE = re.compile(rb"optbuild-hmac-sha256 (?:([0-9a-f]{%d}) )?([0-9a-f]{64})" % KEY_ID_HEX)


# --- entry encoding and validation ---------------------------------------------------
def sign(body: bytes, key: bytes) -> str:
    """HMAC-SHA256 of an entry's exact bytes."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def key_id(key: bytes) -> str:
    """A name for a signing key that tells nothing of it (an HMAC of a constant): it lets a
    reader tell an entry signed with another key (someone's good result, left alone) from
    one whose signature fails under the key it names (altered or forged: replaced)."""
    return hmac.new(key, b"optbuild signing key id", hashlib.sha256).hexdigest()[:KEY_ID_HEX]


def signature_line(body: bytes, key: bytes) -> bytes:
    """The line that signs ``body`` with ``key``, its newline included."""
    return SIGNATURE_PREFIX + f"{key_id(key)} {sign(body, key)}".encode() + b"\n"


def encode_entry(entry: ActionEntry, key: bytes | None) -> bytes:
    """The entry's canonical JSON; with a signing key, behind a line carrying its HMAC.

    The signature covers the bytes as sent, so a reader checks it before parsing anything.
    """
    body = canonical_json(entry.model_dump(mode="json"))
    return body if key is None else signature_line(body, key) + body


Verdict = Literal["valid", "unsigned", "bad", "foreign"]
_REFUSALS: dict[Verdict, str] = {
    "unsigned": "it is not signed, and a signing key is configured",
    "bad": "it is badly signed: its signature does not match (the entry was altered, or written without "
           "the signing key)",
    "foreign": "its signature does not match: it was signed with another key than this host's",
}


def check_signature(data: bytes, signing_key: bytes) -> tuple[Verdict, bytes]:
    """(verdict, body) of an entry's bytes under this host's key: "valid"; "unsigned" (no
    signature line); "bad" (a line that is no signature, or one that fails under the key it
    names, or names none: nobody's good result); "foreign" (it names another key)."""
    if not data.startswith(SIGNATURE_PREFIX):
        return "unsigned", data
    line, _, body = data.partition(b"\n")
    match = _SIGNATURE.fullmatch(line)
    if match is None:
        return "bad", body
    named, mac = match.groups()
    if named is not None and named.decode() != key_id(signing_key):
        return "foreign", body
    return ("valid" if hmac.compare_digest(mac, sign(body, signing_key).encode()) else "bad"), body


def decode_entry(data: bytes, expected_key: str, signing_key: bytes | None) -> ActionEntry:
    """The entry in ``data`` if it is safe to use as the entry of ``expected_key``.

    Raises Rejected saying why not: too large or too deep, not validly signed with this
    host's key (when one is configured; checked before the bytes are parsed), not an entry,
    filed under another key, or any rule of ``store.entry`` broken (digests, output names).
    """
    if len(data) > MAX_ENTRY_BYTES + SIGNATURE_LINE:
        raise Rejected(f"it is larger than {MAX_ENTRY_BYTES} bytes")
    if signing_key is not None:
        verdict, data = check_signature(data, signing_key)
        if verdict != "valid":
            raise Rejected(_REFUSALS[verdict])
    elif data.startswith(SIGNATURE_PREFIX):
        data = data.partition(b"\n")[2]
    try:
        return parse_entry(data, expected_key)
    except EntryError as exc:
        raise Rejected(str(exc)) from None


def signed_by_another(data: bytes, expected_key: str, signing_key: bytes | None) -> bool:
    """Whether ``data`` is a valid entry of ``expected_key`` signed with a key this host
    lacks: one that names another key, or any signature at all when this host has none.

    Such an entry is someone's good result that this host cannot vouch for: replacing it
    would make every host holding the real key rebuild. An entry that is unsigned, invalid,
    or whose signature fails under this host's key while naming it (or naming none) is no
    one's good result, and a key holder replaces it.
    """
    if signing_key is None:
        line, _, body = data.partition(b"\n")
        if _SIGNATURE.fullmatch(line) is None:
            return False
    else:
        verdict, body = check_signature(data, signing_key)
        if verdict != "foreign":
            return False
    try:
        parse_entry(body, expected_key)
    except EntryError:
        return False
    return True


def replaced_fault(data: bytes, signing_key: bytes | None, refusal: Rejected) -> str:
    """What is wrong with an unacceptable remote entry that this host replaces, blaming the entry."""
    if signing_key is not None:
        verdict, _body = check_signature(data, signing_key)
        if verdict != "valid":  # "foreign" only in this host's own slot, where no other key belongs
            return "unsigned" if verdict == "unsigned" else "badly signed"
    return f"unusable ({refusal})"
