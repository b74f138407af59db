"""Action entries: whatever bytes arrive, parsing either gives a sound entry or says why not."""

from __future__ import annotations

import json

import pytest

from optbuild.common.digest import digest_bytes
from optbuild.store.entry import MAX_JSON_DEPTH, EntryError, check_relative_path, parse_entry

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
