"""Sizes as people write and read them: one parser and one formatter for the whole tool.

Output for people goes through ``human_size``; JSON output keeps byte counts.
"""

from __future__ import annotations

import re
from decimal import Decimal

# Single letters and xB are decimal (as ccache and disk vendors count), xiB binary.
_UNITS = {"": 1, "b": 1} | {
    f"{letter}{suffix}": base**power
    for power, letter in enumerate("kmgt", start=1)
    for suffix, base in (("", 1000), ("b", 1000), ("i", 1024), ("ib", 1024))
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
_BINARY = ("KiB", "MiB", "GiB", "TiB", "PiB")


def parse_size(text: str) -> int:
    """Bytes in a size as config files write it: "10 GiB", "500MB", "1.5G", "1024".

    Case is ignored; K/M/G/T and kB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB (or
    Ki/Mi/Gi/Ti) powers of 1024. A fraction of a byte is dropped.
    """
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a size: {text!r} (write e.g. '20 GiB', '500 MB', '1.5G' or '1048576')")
    unit = match.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in size {text!r} "
                         "(use B, kB, MB, GB, TB or KiB, MiB, GiB, TiB)")
    return int(Decimal(match.group(1)) * _UNITS[unit])


def human_size(size: float) -> str:
    """"512 B", "1.2 MiB", "20.0 GiB": binary units with one decimal, so that every size
    the tool prints reads alike and parses back with ``parse_size``."""
    if size < 1024:
        return f"{size:.0f} B"
    value = float(size)
    for unit in _BINARY:
        value /= 1024
        if round(value, 1) < 1024 or unit == _BINARY[-1]:
            break
    return f"{value:.1f} {unit}"
