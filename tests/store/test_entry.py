"""Action entries: whatever bytes arrive, parsing either gives a sound entry or says why not."""

from __future__ import annotations

import base64
import json

import pytest

from optbuild.common.digest import digest_bytes
from optbuild.store.entry import (
    CARRYING_FORMAT,
    FORMAT,
    MAX_CARRIED_BYTES,
    MAX_CARRIED_TOTAL,
    MAX_JSON_DEPTH,
    EntryError,
    check_relative_path,
    parse_entry,
)

KEY = digest_bytes(b"key")


def entry_doc(**changes: object) -> dict:
    doc = {"key": KEY, "step": "r:s", "kind": "text", "ingredients": {},
           "outputs": {"model.onnx": {"digest": digest_bytes(b"m"), "size": 1}}}
    return {**doc, **changes}


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_sound_entry_parses():
    assert parse_entry(json.dumps(entry_doc()).encode(), KEY).outputs["model.onnx"].size == 1


@pytest.mark.parametrize("data", [
    b"[" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    json.dumps(entry_doc(metrics={"m": nested(MAX_JSON_DEPTH)})).encode(),
])
def test_bytes_nesting_deeper_than_the_bound_are_refused_before_parsing(data):
    with pytest.raises(EntryError, match=f"deeper than {MAX_JSON_DEPTH}"):
        parse_entry(data, KEY)


def test_brackets_inside_strings_do_not_count_as_nesting():
    doc = entry_doc(metrics={"note": "[" * 1000 + '\\"{' * 100})
    assert parse_entry(json.dumps(doc).encode(), KEY).metrics["note"].startswith("[[[")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_and_refused(value):
    data = json.dumps(entry_doc(duration_s=0.5)).replace("0.5", value).encode()
    with pytest.raises(EntryError):
        parse_entry(data, KEY)


@pytest.mark.parametrize(("name", "why"), [
    ("x" * 256, "part over 255 bytes"),
    ("/".join(["d"] * 40), "40 folders deep"),
    ("a/" * 600 + "b", "bytes long"),
    ("line\nbreak", "control characters"),
    ("\ud800.txt", "not valid Unicode"),
    ("../up", "escapes"),
    ("/abs", "escapes"),
    ("a\\b", "escapes"),
    ("a//b", "escapes"),
])
def test_output_names_a_file_system_cannot_create_are_refused(name, why):
    with pytest.raises(EntryError, match=why):
        check_relative_path(name)
    doc = entry_doc(outputs={name: {"digest": digest_bytes(b"m"), "size": 1}})
    with pytest.raises(EntryError):
        parse_entry(json.dumps(doc).encode(), KEY)


@pytest.mark.parametrize("changes", [
    {"key": digest_bytes(b"other")},
    {"outputs": {}},
    {"outputs": {"a": {"digest": "0" * 32, "size": 1}}},
    {"outputs": {"a": {"digest": digest_bytes(b"a"), "size": -1}}},
    {"outputs": {"a": {"digest": digest_bytes(b"a"), "size": 1}, "a/b": {"digest": digest_bytes(b"b"), "size": 1}}},
    {"primary": "missing.onnx"},
    {"log": "not-a-digest"},
])
def test_entries_that_break_a_rule_are_refused(changes):
    with pytest.raises(EntryError):
        parse_entry(json.dumps(entry_doc(**changes)).encode(), KEY)


def carrying_doc(blob: bytes = b"m", **changes: object) -> dict:
    """An entry of format 3 whose one output, ``blob``, travels inside it."""
    digest = digest_bytes(blob)
    doc = entry_doc(format=CARRYING_FORMAT, outputs={"model.onnx": {"digest": digest, "size": len(blob)}},
                    inline={digest: base64.b64encode(blob).decode()})
    return {**doc, **changes}


def test_an_entry_carrying_its_small_blob_gives_back_exactly_its_bytes():
    entry = parse_entry(json.dumps(carrying_doc(b"small model")).encode(), KEY)
    assert entry.carried() == {digest_bytes(b"small model"): b"small model"}
    local = entry.uncarried()
    assert local.format == FORMAT and "inline" not in local.model_dump()


def test_an_entry_carrying_nothing_is_written_as_format_2_without_the_field():
    """So an optbuild that reads only format 2 (extra fields refused) still uses it."""
    entry = parse_entry(json.dumps(entry_doc()).encode(), KEY)
    assert entry.carrying({}) is entry
    assert json.loads(entry.model_dump_json()).keys() == entry_doc(format=FORMAT).keys() | {
        "primary", "log", "metrics", "duration_s", "created_at", "built_on", "digest_function"}
    carrying = entry.carrying({digest_bytes(b"m"): b"m"})
    assert carrying.format == CARRYING_FORMAT and parse_entry(carrying.model_dump_json().encode(), KEY) == carrying


@pytest.mark.parametrize(("changes", "why"), [
    ({"format": FORMAT}, "format 2 carries no blob"),
    ({"inline": {digest_bytes(b"other"): base64.b64encode(b"other").decode()}}, "which it does not name"),
    ({"inline": {digest_bytes(b"m"): base64.b64encode(b"M").decode()}}, "is corrupt"),
    ({"inline": {digest_bytes(b"m"): "not base64!"}}, "not carried in base64"),
    ({"outputs": {"model.onnx": {"digest": digest_bytes(b"m"), "size": 2}}}, "is corrupt"),
])
def test_a_carried_blob_that_is_not_what_the_entry_names_is_refused(changes, why):
    with pytest.raises(EntryError, match=why):
        parse_entry(json.dumps(carrying_doc(**changes)).encode(), KEY)


def test_what_an_entry_carries_is_bounded():
    big = b"x" * (MAX_CARRIED_BYTES + 1)
    with pytest.raises(EntryError, match=f"larger than {MAX_CARRIED_BYTES} bytes"):
        parse_entry(json.dumps(carrying_doc(big)).encode(), KEY)
    blobs = [bytes([n]) * MAX_CARRIED_BYTES for n in range(MAX_CARRIED_TOTAL // MAX_CARRIED_BYTES + 1)]
    outputs = {f"o{n}": {"digest": digest_bytes(b), "size": len(b)} for n, b in enumerate(blobs)}
    inline = {digest_bytes(b): base64.b64encode(b).decode() for b in blobs}
    with pytest.raises(EntryError, match=f"at most {MAX_CARRIED_TOTAL}"):
        parse_entry(json.dumps(entry_doc(format=CARRYING_FORMAT, outputs=outputs, inline=inline)).encode(), KEY)


def test_an_entry_of_a_later_format_is_another_optbuilds():
    with pytest.raises(EntryError, match="entry format 4 is not this optbuild's"):
        parse_entry(json.dumps(entry_doc(format=4)).encode(), KEY)
