"""Sizes: one parser for what people write, one formatter for what the tool prints."""

from __future__ import annotations

import pytest

from optbuild.common.units import human_size, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("1024", 1024), ("0", 0), ("10 GiB", 10 * 2**30), ("500MB", 500 * 10**6), ("1.5G", 1_500_000_000),
    ("2 kib", 2048), ("3Mi", 3 * 2**20), ("1 TB", 10**12), ("7 B", 7), (" 20 GiB ", 20 * 2**30),
    (".5k", 500), ("1.5 KiB", 1536),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("", "not a size"), ("big", "not a size"), ("-5 GB", "not a size"), ("1e9", "not a size"),
    ("10 XB", "unknown unit 'XB'"), ("5 G B", "not a size"), ("1,5G", "not a size"),
])
def test_parse_size_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size(text)


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (int(1.2 * 2**20), "1.2 MiB"),
    (2**20 - 1, "1.0 MiB"),  # rounds up into the next unit, never "1024.0 KiB"
    (20 * 2**30, "20.0 GiB"), (3 * 2**40, "3.0 TiB"), (5 * 2**50, "5.0 PiB"),
])
def test_human_size(size, text):
    assert human_size(size) == text


@pytest.mark.parametrize("size", [0, 7, 1536, 20 * 2**30])
def test_what_human_size_prints_parses_back(size):
    assert parse_size(human_size(size)) == size
