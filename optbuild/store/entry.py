"""The action entry: what a cached step produced, and from what.

Stored as JSON under ``ac/`` (local and remote alike). An entry is checked by the same
rules wherever it comes from (a fresh build, the local cache, a remote): its bytes are
bounded in size and nesting before they are parsed, every digest is a BLAKE3-256 digest,
and every output name is a safe relative path that a file system can hold, so no entry
can write outside its step's output folder, crash the parser, or poison the local cache
with a name that later restores cannot create.

This module is the store's one home for those rules: what a digest or key looks like
(``is_digest`` / ``check_digest``; the pattern itself is the digest function's, defined in
``optbuild.common.digest``), how an entry is read and validated (``parse_entry``, ``read_entry``),
and the canonical JSON that keys and remote entries are made of (``canonical_json``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from optbuild.common.digest import ALGORITHM, DIGEST_HEX, digest_bytes, is_digest
from optbuild.common.jsonfile import nests_deeper

FORMAT = 2  # 2: BLAKE3-256 digests, the digest function recorded
CARRYING_FORMAT = 3  # 3: 2, with small blobs carried inline (remote entries only: ``carried``)
MAX_CARRIED_BYTES = 64 << 10  # a blob up to this size may travel inside its entry...
MAX_CARRIED_TOTAL = 256 << 10  # ...while what one entry carries stays within this
_CARRIED_TEXT_MAX = 4 * -(-MAX_CARRIED_BYTES // 3)  # the base64 text of a blob that size
MAX_ENTRY_BYTES = 16 << 20  # an entry larger than this is not an entry
MAX_JSON_DEPTH = 64  # real entries nest about 8 deep; Python's parser recurses per level
MAX_OUTPUTS = 100_000
MAX_NAME_BYTES = 255  # one path component (NAME_MAX on Linux, macOS and Windows)
MAX_PATH_DEPTH = 32  # components in one output name
MAX_PATH_BYTES = 1024  # a whole output name
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class EntryError(ValueError):
    """Bytes or values that are not an acceptable action entry; the message says why."""


def check_digest(value: object, what: str = "digest") -> str:
    """Return ``value`` if it is a digest (a blob's, or an action key), else raise
    EntryError (a ValueError) naming ``what`` it should have been."""
    if not is_digest(value):
        shown = value[:80] if isinstance(value, str) else value  # a hostile entry's may be long
        raise EntryError(f"not a {what} ({DIGEST_HEX} lowercase hex digits): {shown!r}")
    return value  # type: ignore[return-value]  # is_digest: a str


def check_relative_path(name: str) -> str:
    """Return ``name`` if it is a safe output name, else raise EntryError saying why.

    Safe: relative, '/'-separated, no '.', '..' or empty parts, no backslash or control
    characters, and within the lengths every common file system can create. A name proven
    safe once is known (a no-op at 10,000 steps asks of the same few names 10,000 times).
    """
    if type(name) is str and name in _SAFE_NAMES:
        return name
    if not isinstance(name, str) or not name:
        raise EntryError(f"output name {name!r} is empty")
    shown = name if len(name) <= 80 else name[:77] + "..."
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in parts):
        raise EntryError(f"output path {shown!r} escapes the output folder")
    if _CONTROL.search(name):
        raise EntryError(f"output name {shown!r} holds control characters")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise EntryError(f"output name {shown!r} is not valid Unicode") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise EntryError(f"output name {shown!r} is {len(encoded)} bytes long (at most {MAX_PATH_BYTES})")
    if len(parts) > MAX_PATH_DEPTH:
        raise EntryError(f"output name {shown!r} is {len(parts)} folders deep (at most {MAX_PATH_DEPTH})")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise EntryError(f"output name {shown!r} has a part over {MAX_NAME_BYTES} bytes")
    if len(_SAFE_NAMES) >= _SAFE_NAMES_MAX:
        _SAFE_NAMES.clear()
    _SAFE_NAMES.add(name)
    return name


_SAFE_NAMES: set[str] = set()  # names check_relative_path passed, up to _SAFE_NAMES_MAX
_SAFE_NAMES_MAX = 1 << 16


class OutputFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str
    size: int

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        return check_digest(value)

    @field_validator("size")
    @classmethod
    def _size(cls, value: int) -> int:
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value


class ActionEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    digest_function: str = ALGORITHM  # of the key and every digest below (as Bazel's remote API)
    key: str
    step: str  # "recipe:step" that built it (informational: keys are content-based)
    kind: str
    outputs: dict[str, OutputFile]
    primary: str | None = None
    ingredients: dict[str, Any]  # the canonical key material, for plan/explain diffs
    log: str | None = None  # digest of the step's log blob
    metrics: dict[str, Any] = {}
    duration_s: float = 0.0
    created_at: float = 0.0
    built_on: str = ""  # hostname
    # digest -> base64 bytes of the small blobs a remote entry carries; left out when empty, so
    # an entry that carries none reads as format 2 did
    inline: dict[str, str] = Field(default_factory=dict, exclude_if=lambda carried: not carried)

    @field_validator("format", "digest_function")
    @classmethod
    def _this_optbuilds(cls, value: Any, info: ValidationInfo) -> Any:
        """An entry in another format, or of another digest function, is another optbuild's."""
        if info.field_name == "format" and value not in (FORMAT, CARRYING_FORMAT):
            raise ValueError(f"entry format {value} is not this optbuild's ({FORMAT} or {CARRYING_FORMAT})")
        if info.field_name == "digest_function" and value != ALGORITHM:
            raise ValueError(f"made with digest function {value[:40]!r}; this optbuild uses {ALGORITHM}")
        return value

    @field_validator("key", "log")
    @classmethod
    def _digests(cls, value: str | None) -> str | None:
        return value if value is None else check_digest(value)

    @field_validator("outputs")
    @classmethod
    def _safe_paths(cls, outputs: dict[str, OutputFile]) -> dict[str, OutputFile]:
        if not outputs:
            raise ValueError("an entry has at least one output")
        if len(outputs) > MAX_OUTPUTS:
            raise ValueError(f"{len(outputs)} outputs (at most {MAX_OUTPUTS})")
        for name in outputs:
            check_relative_path(name)
        folders = {name[:i] for name in outputs for i, c in enumerate(name) if c == "/"}
        clash = sorted(folders & outputs.keys())
        if clash:
            raise ValueError(f"output {clash[0]!r} is both a file and a folder")
        return outputs

    @model_validator(mode="after")
    def _primary(self) -> ActionEntry:
        if self.primary is not None and self.primary not in self.outputs:
            raise ValueError(f"its primary output {self.primary!r} is not one of its outputs")
        return self

    @model_validator(mode="after")
    def _carried_intact(self) -> ActionEntry:
        """What an entry carries inline is bounded, named by the entry, and hashes to its digest."""
        if not self.inline:
            return self
        if self.format != CARRYING_FORMAT:
            raise ValueError(f"an entry of format {self.format} carries no blob inline")
        self.carried()
        return self

    def carried(self) -> dict[str, bytes]:
        """Digest -> bytes of the blobs this entry carries inline, each checked against its digest
        and the size the entry records (ValueError when one is not what the entry says)."""
        sizes = {o.digest: o.size for o in self.outputs.values()}
        named, total, blobs = self.blob_digests(), 0, {}
        for digest, text in self.inline.items():
            if digest not in named:
                raise ValueError(f"it carries blob {digest[:12]!r}, which it does not name")
            too_large = f"its blob {digest[:8]}… is carried inline, but is larger than {MAX_CARRIED_BYTES} bytes"
            if len(text) > _CARRIED_TEXT_MAX:  # before decoding it
                raise ValueError(too_large)
            try:
                data = base64.b64decode(text, validate=True)
            except binascii.Error:
                raise ValueError(f"its blob {digest[:8]}… is not carried in base64") from None
            if len(data) > MAX_CARRIED_BYTES:
                raise ValueError(too_large)
            if digest_bytes(data) != digest or sizes.get(digest, len(data)) != len(data):
                raise ValueError(f"the blob {digest[:8]}… it carries is corrupt ({len(data)} bytes)")
            total += len(data)
            blobs[digest] = data
        if total > MAX_CARRIED_TOTAL:
            raise ValueError(f"it carries {total} bytes inline (at most {MAX_CARRIED_TOTAL})")
        return blobs

    def carrying(self, blobs: dict[str, bytes]) -> ActionEntry:
        """This entry carrying ``blobs`` (digest -> bytes: small blobs it names) inline, as the
        remote holds it: one request restores a small step, not one for the entry and one a blob.
        Nothing carried: the entry itself, which an optbuild that reads only format 2 still uses."""
        if not blobs:
            return self
        inline = {digest: base64.b64encode(data).decode("ascii") for digest, data in sorted(blobs.items())}
        return self.model_copy(update={"format": CARRYING_FORMAT, "inline": inline})

    def uncarried(self) -> ActionEntry:
        """This entry as a local cache holds it: its blobs stored beside it, none carried."""
        return self.model_copy(update={"format": FORMAT, "inline": {}}) if self.inline else self

    def blobs_apart(self) -> set[str]:
        """The blobs this entry names and does not carry: those stored beside it."""
        return self.blob_digests() - self.inline.keys()

    def blob_digests(self) -> set[str]:
        digests = {o.digest for o in self.outputs.values()}
        if self.log:
            digests.add(self.log)
        return digests


def check_json_bounds(data: bytes) -> None:
    """Raise EntryError if ``data`` is too large or nests too deep to be parsed safely.

    Runs before any parser sees the bytes: a hostile entry of 100,000 '[' would otherwise
    raise RecursionError inside json.loads (or pydantic) and take the process with it.
    """
    if len(data) > MAX_ENTRY_BYTES:
        raise EntryError(f"it is larger than {MAX_ENTRY_BYTES} bytes")
    if nests_deeper(data, MAX_JSON_DEPTH):
        raise EntryError(f"it nests deeper than {MAX_JSON_DEPTH} levels")


def parse_entry(data: bytes, expected_key: str) -> ActionEntry:
    """The entry in ``data``, if it is an acceptable entry filed under ``expected_key``.

    Raises EntryError saying why not; never anything else, whatever the bytes.
    """
    check_json_bounds(data)
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise EntryError("it is not valid JSON") from None
    return entry_from_doc(doc, expected_key)


def read_entry(path: Path, expected_key: str) -> ActionEntry:
    """``parse_entry`` of the file ``path``, no more of it read than an entry may hold.

    OSError when it cannot be read (FileNotFoundError when absent); EntryError otherwise.
    """
    with open(path, "rb") as f:
        return parse_entry(f.read(MAX_ENTRY_BYTES + 1), expected_key)


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON: an entry holding one is refused (it could not be
    stored back as it came)."""
    raise ValueError(f"it holds {name}, which JSON does not allow")


def entry_from_doc(doc: Any, expected_key: str) -> ActionEntry:
    """``parse_entry`` for a document already parsed (and bounded)."""
    if not isinstance(doc, dict):
        raise EntryError("it is not a JSON object")
    try:
        entry = ActionEntry.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:120]
        raise EntryError(f"it is not a valid entry ({where}: {first['msg']})") from None
    except RecursionError:
        raise EntryError("it nests too deep") from None
    if entry.key != expected_key:
        raise EntryError(f"it is filed under key {expected_key} but was made for {entry.key!r}")
    return entry


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, ASCII only, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()
