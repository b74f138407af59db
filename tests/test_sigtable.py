"""The no-op stamp's table of signatures (optbuild.common.sigtable): what it records of each
path, and when a folder of cache entries may vouch for the entries in it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from optbuild.common.signatures import file_system_clock, of_stat, signature
from optbuild.common.sigtable import SigTable, grouped, names_signature


def _entries(root: Path, names: list[str]) -> dict[str, list[int] | str]:
    """Files under root/ac/5e, and their signatures as a recording takes them."""
    folder = root / "ac" / "5e"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text(name)
    return {str(folder / name): signature(str(folder / name)) for name in names}


def _later() -> int:
    """A recording an hour from now: every file here is older than the racy margin then."""
    return time.time_ns() + 3600 * 10**9


def test_a_table_gives_back_each_kind_of_signature_it_was_made_of(tmp_path):
    (tmp_path / "file").write_text("x")
    sigs = {str(tmp_path / "file"): signature(str(tmp_path / "file")), str(tmp_path / "gone"): "absent",
            str(tmp_path): names_signature(str(tmp_path))}
    table = SigTable.from_json(json.loads(json.dumps(SigTable.of(sigs).to_json())))
    assert table.sigs(list(range(3))) == sigs
    assert list(table.changed()) == []
    (tmp_path / "gone").write_text("")  # a name in the folder, and a file where none was
    assert list(table.changed()) == [1, 2]


@pytest.mark.parametrize("damage", [{"rows": "AAAA"}, {"groups": [["/x", [1, 2], 0, 0]]}, {"paths": "x"}])
def test_a_damaged_table_is_refused_as_such(tmp_path, damage):
    (tmp_path / "file").write_text("x")
    doc = SigTable.of({str(tmp_path / "file"): signature(str(tmp_path / "file"))}).to_json()
    with pytest.raises((ValueError, TypeError)):
        SigTable.from_json({**doc, **damage})


def test_entries_as_recorded_in_an_old_folder_are_left_to_it_and_moved_last(tmp_path):
    sigs = {str(tmp_path / "recipe.toml"): "absent", **_entries(tmp_path, ["a.json", "b.json"])}
    steps = {"s": {"paths": [0, 1, 2]}, "t": {"paths": [2]}}
    order, groups = grouped(sigs, steps, first=0, under=str(tmp_path / "ac") + os.sep, clock_ns=_later())
    assert list(order) == list(sigs) and [(g.folder, g.start, g.end) for g in groups] == [
        (str(tmp_path / "ac" / "5e"), 1, 3)]
    table = SigTable.of(order, groups)
    assert list(table.changed()) == []
    (tmp_path / "ac" / "5e" / "a.json").write_text("rewritten in place")  # what optbuild never does
    assert list(table.changed()) == []  # the folder vouches for it: the fast path does not see it
    os.unlink(tmp_path / "ac" / "5e" / "b.json")
    assert list(table.changed()) == [1, 2]  # now each entry is checked on its own


def test_a_folder_whose_entry_changed_after_it_was_signed_is_not_left_to_vouch(tmp_path):
    sigs = _entries(tmp_path, ["a.json", "b.json"])
    entry = tmp_path / "ac" / "5e" / "a.json"
    shutil.copyfile(entry, tmp_path / "copy")
    os.replace(tmp_path / "copy", entry)  # renamed in after the recording signed it
    _, groups = grouped(sigs, {}, first=0, under=str(tmp_path / "ac") + os.sep, clock_ns=_later())
    assert groups == []


def test_a_folder_changed_as_its_file_systems_clock_was_read_is_not_left_to_vouch(tmp_path):
    """git's racy rule: a change within the same tick as the clock's reading could be
    followed by another that leaves the folder's times as they are."""
    sigs = _entries(tmp_path, ["a.json"])
    folder = os.stat(tmp_path / "ac" / "5e")
    same_tick = max(folder.st_mtime_ns, folder.st_ctime_ns)
    for clock in (same_tick, None):  # None: the cache could not tell its time (read-only)
        _, groups = grouped(sigs, {}, first=0, under=str(tmp_path / "ac") + os.sep, clock_ns=clock)
        assert groups == []
    _, groups = grouped(sigs, {}, first=0, under=str(tmp_path / "ac") + os.sep, clock_ns=same_tick + 1)
    assert len(groups) == 1


def test_the_whole_answers_rows_stay_first_and_the_steps_places_follow_the_move(tmp_path):
    sigs = _entries(tmp_path, ["shared.json", "own.json"])  # the whole answer's, then a step's
    sigs[str(tmp_path / "recipe.toml")] = "absent"  # the step's too
    steps = {"s": {"paths": [1, 2]}}
    order, groups = grouped(sigs, steps, first=1, under=str(tmp_path / "ac") + os.sep, clock_ns=_later())
    paths = list(order)
    assert paths[0] == str(tmp_path / "ac" / "5e" / "shared.json")  # never grouped
    assert [paths[i] for i in steps["s"]["paths"]] == [str(tmp_path / "ac" / "5e" / "own.json"),
                                                       str(tmp_path / "recipe.toml")]
    assert [(g.start, g.end) for g in groups] == [(2, 3)]


def test_a_file_systems_clock_is_read_from_a_file_made_there_that_leaves_no_trace(tmp_path):
    (tmp_path / "written-before").write_text("")
    folder_before = os.stat(tmp_path)
    clock = file_system_clock(str(tmp_path))
    if clock is None:
        pytest.skip("this file system makes no unnamed file (O_TMPFILE): products keep the 2 s margin")
    device, now = clock
    assert device == folder_before.st_dev and now >= (tmp_path / "written-before").stat().st_mtime_ns
    assert os.listdir(tmp_path) == ["written-before"] and signature(str(tmp_path)) == of_stat(folder_before)
    assert file_system_clock(str(tmp_path / "missing")) is None
