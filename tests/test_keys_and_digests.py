"""Digests, the stat cache and action keys."""

from __future__ import annotations

import os
import signal
import time

from optbuild.builder.keys import describe_changes
from optbuild.common.digest import FileHasher, hash_file
from optbuild.process.action import Action
from optbuild.store.entry import canonical_json


def old(path) -> None:
    then = time.time() - 10
    os.utime(path, (then, then))


def test_digest_is_content_based_and_matches_for_small_and_large_files(tmp_path):
    small, large = tmp_path / "s", tmp_path / "l"
    small.write_bytes(b"x" * 100)
    large.write_bytes(b"x" * (3 << 20))
    assert hash_file(small)[0] != hash_file(large)[0]
    copy = tmp_path / "l2"
    copy.write_bytes(large.read_bytes())
    assert hash_file(copy)[0] == hash_file(large)[0]


def test_a_large_file_is_hashed_in_a_child_forked_after_the_parent_hashed_on_every_core(tmp_path):
    """blake3's thread pool does not survive a fork: a child of a process that made it hashed
    a large file forever (verify's isolated child, forked from a step that had hashed)."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(4 << 20))  # large enough for the threaded hash
    digest, _ = hash_file(big)  # this process makes the pool
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang ends the child, which the parent sees as not 0
        os._exit(0 if hash_file(big)[0] == digest else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_stat_cache_reads_an_unchanged_file_once_across_runs(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(os.urandom(1 << 16))
    old(path)
    first = FileHasher(tmp_path / "stat.db")
    digest = first.digest(path)
    first.close()
    second = FileHasher(tmp_path / "stat.db")
    assert second.digest(path) == digest
    assert second.bytes_read == 0


def test_a_freshly_written_file_is_not_trusted_by_the_stat_cache(tmp_path):
    path = tmp_path / "fresh.bin"
    path.write_bytes(b"a" * 10)
    hasher = FileHasher(tmp_path / "stat.db")
    hasher.digest(path)
    hasher.close()
    again = FileHasher(tmp_path / "stat.db")
    again.digest(path)
    assert again.bytes_read == 10


def test_a_same_size_rewrite_with_restored_mtime_is_still_detected_by_ctime(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * 10)
    old(path)
    hasher = FileHasher(tmp_path / "stat.db")
    before = hasher.digest(path)
    hasher.flush()
    st = os.stat(path)
    time.sleep(0.01)
    path.write_bytes(b"b" * 10)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hasher.digest(path) != before


def test_canonical_encoding_ignores_key_order():
    assert (canonical_json({"b": 1, "a": [1, {"y": 2, "x": 1}]})
            == canonical_json({"a": [1, {"x": 1, "y": 2}], "b": 1}))
    def action(params):
        return Action(kind="k", version="1", params=params, inputs={}, files={}, tools={}, host={})

    assert action({"a": 1, "b": 2}).key == action({"b": 2, "a": 1}).key
    assert action({"a": 1}).key != action({"a": 2}).key


def test_describe_changes_names_each_changed_ingredient():
    old_ = {"kind": "export", "params": {"opset": 17}, "files": {"m.py": "1", "gone.py": "2"},
            "tools": {"torch": "2.12.0"}, "host": {"cpu.arch": "x86_64"}, "inputs": {"input": {"a": "1"}}}
    new = {"kind": "export", "params": {"opset": 18}, "files": {"m.py": "3", "new.py": "4"},
           "tools": {"torch": "2.13.0"}, "host": {"cpu.arch": "aarch64"}, "inputs": {"input": {"a": "2"}}}
    reasons = describe_changes(old_, new)
    assert "parameter opset: 17 -> 18" in reasons
    assert "input file m.py changed" in reasons
    assert "input file gone.py no longer used" in reasons
    assert "new input file new.py" in reasons
    assert "tool torch: 2.12.0 -> 2.13.0" in reasons
    assert "upstream output (input) changed" in reasons
    assert any("cpu.arch" in r and "x86_64" in r and "aarch64" in r for r in reasons)
