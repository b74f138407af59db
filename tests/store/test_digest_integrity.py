"""Digests that a forger cannot match, and a stat cache that a damaged disk cannot break.

xxh3-128 (optbuild's digest before) is not collision-resistant: the first test builds two
valid ONNX models with the same xxh3-128 digest, one with sane weights and one with a
weight near 4e9, and shows that swapping one for the other is now seen as a change.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from plugins.projects import ProjectDir

from optbuild.common.digest import ALGORITHM, FileHasher, digest_bytes, hash_file
from optbuild.store.entry import EntryError, parse_entry

xxhash = pytest.importorskip("xxhash")

# The first 16 bytes of XXH3's default secret (xxhash.h, XXH3_kSecret).
_SECRET = bytes.fromhex("b8fe6c3923a44bbe7c01812cf721ad1c")
_BLOCK = 1024  # bytes per XXH3 block with the default secret (16 stripes of 64 bytes)


def xxh3_twins(data: bytes, start: int) -> tuple[bytes, bytes]:
    """Two variants of ``data`` with equal xxh3-128, differing in 8 bytes at ``start`` (a
    multiple of 1024) and ``start + 64``.

    In lane 0 of a stripe XXH3 adds lo32(d ^ k) * hi32(d ^ k) to one accumulator and d to
    its neighbour. With lo32(d) = lo32(k) the product is 0 whatever hi32(d) is, so moving
    an amount from the high half of one stripe's lane to the next stripe's leaves every
    accumulator, and so the digest, unchanged. As float32 pairs the words read
    (2.3e-4, 0.5) / (3.7e-12, 0.25) in one model and (2.3e-4, 4.0e9) / (3.7e-12, 3.3e-11)
    in its twin.
    """
    assert start % _BLOCK == 0 and start + 72 <= len(data) - 256
    k0, k1 = (int.from_bytes(_SECRET[i:i + 8], "little") for i in (0, 8))
    lo0, lo1 = k0 & 0xFFFFFFFF, k1 & 0xFFFFFFFF
    sane_hi = (0x3F000000, 0x3E800000)  # 0.5, 0.25
    shift = 0x4F6E6B28 - sane_hi[0]  # the first becomes 4.0e9

    def variant(hi0: int, hi1: int) -> bytes:
        out = bytearray(data)
        out[start:start + 8] = (lo0 | hi0 << 32).to_bytes(8, "little")
        out[start + 64:start + 72] = (lo1 | hi1 << 32).to_bytes(8, "little")
        return bytes(out)

    return variant(*sane_hi), variant(sane_hi[0] + shift, (sane_hi[1] - shift) & 0xFFFFFFFF)


def colliding_onnx_models() -> tuple[bytes, bytes]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(weights, "w")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    raw = data.find(weights.tobytes())
    start = -(-(raw + 1) // _BLOCK) * _BLOCK  # the first block boundary inside the weights
    sane, evil = xxh3_twins(data, start)
    for model in (sane, evil):
        onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    return sane, evil


def test_the_twins_really_collide_under_xxh3_and_not_under_optbuilds_digest():
    sane, evil = colliding_onnx_models()
    assert sane != evil
    assert xxhash.xxh3_128_hexdigest(sane) == xxhash.xxh3_128_hexdigest(evil)
    assert digest_bytes(sane) != digest_bytes(evil)
    assert ALGORITHM == "blake3-256"
    assert digest_bytes(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"  # BLAKE3 spec


def test_swapping_an_input_model_for_its_xxh3_twin_rebuilds_and_serves_the_new_bytes(tmp_path):
    sane, evil = colliding_onnx_models()
    project = ProjectDir.with_test_kinds(tmp_path / "proj")
    project.write("optbuild.toml", "[build]\njobs = 1\n")
    project.write("recipes/m.toml", '[steps.model]\nkind = "onnx"\npath = "../model.onnx"\n')
    model = project.root / "model.onnx"
    model.write_bytes(sane)
    assert project.build().steps("built") == ["m:model"]
    model.write_bytes(evil)
    result = project.build()
    assert result.steps("built") == ["m:model"]
    assert "input file model.onnx changed" in result.outcomes["m:model"].reasons
    assert (project.root / "build/m/model/model.onnx").read_bytes() == evil


def test_an_entry_made_with_another_digest_function_is_refused_not_misread():
    key = digest_bytes(b"key")
    doc = {"format": 2, "digest_function": "xxh3_128", "key": key, "step": "r:s", "kind": "text",
           "outputs": {"a": {"digest": digest_bytes(b"a"), "size": 1}}, "ingredients": {}}
    with pytest.raises(EntryError, match="digest function 'xxh3_128'"):
        parse_entry(json.dumps(doc).encode(), key)
    older = {**doc, "format": 1, "key": "0" * 32, "outputs": {"a": {"digest": "1" * 32, "size": 1}}}
    del older["digest_function"]
    with pytest.raises(EntryError, match="format 1"):
        parse_entry(json.dumps(older).encode(), "0" * 32)


def _aged_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    then = time.time() - 10
    os.utime(path, (then, then))
    return path


def test_a_stat_cache_with_a_bad_page_is_rebuilt_with_one_warning(tmp_path, capfd):
    db = tmp_path / "statcache.sqlite"
    files = [_aged_file(tmp_path / f"f{i}", os.urandom(64)) for i in range(300)]
    hasher = FileHasher(db)
    digests = [hasher.digest(f) for f in files]
    hasher.close()
    with sqlite3.connect(db) as conn:  # fold the WAL in, so the damage below hits the table
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 3 * page
    data[2 * page:3 * page] = b"\xff" * page  # one bad page in the middle of the table
    db.write_bytes(bytes(data))

    again = FileHasher(db)
    assert [again.digest(f) for f in files] == digests  # right answers, whatever the database
    again.close()
    err = capfd.readouterr().err
    assert err.count("is damaged") == 1 and str(db) in err
    assert (tmp_path / "statcache.sqlite.damaged").exists()

    third = FileHasher(db)  # the rebuilt database serves again: nothing is read
    assert [third.digest(f) for f in files] == digests
    assert third.bytes_read == 0
    third.close()


def test_a_stat_cache_that_is_garbage_is_set_aside_and_replaced(tmp_path, capfd):
    db = tmp_path / "statcache.sqlite"
    db.write_bytes(os.urandom(10_000))
    path = _aged_file(tmp_path / "model.bin", b"weights")
    hasher = FileHasher(db)
    assert hasher.digest(path) == hash_file(path)[0]
    hasher.close()
    assert "is damaged" in capfd.readouterr().err
    again = FileHasher(db)
    again.digest(path)
    assert again.bytes_read == 0
    again.close()


def test_a_run_records_small_files_in_one_batch_at_its_end_and_large_ones_at_once(tmp_path):
    """A restore records a few blobs a step: one transaction a file cost more than the
    restore. Small ones reach the database with the batch (at the end of the run, or every
    256): another process meanwhile reads them once more, a cost, never a wrong answer; this
    run checks them by a stat. A large one is written at once: re-reading it costs more."""
    db = tmp_path / "statcache.sqlite"
    small = [tmp_path / f"blob{i}" for i in range(3)]
    for i, path in enumerate(small):
        path.write_bytes(b"small %d" % i)
    large = tmp_path / "engine"
    large.write_bytes(os.urandom(2 << 20))
    run = FileHasher(db)
    for path in [large, *small]:  # the large one's write takes what is pending with it
        run.record(path, hash_file(path)[0])
    assert [run.digest(p) for p in small] == [hash_file(p)[0] for p in small] and run.bytes_read == 0

    meanwhile = FileHasher(db)  # another process, during the run
    meanwhile.digest(large)
    assert meanwhile.bytes_read == 0  # written at once
    assert [meanwhile.digest(p) for p in small] == [hash_file(p)[0] for p in small]
    assert meanwhile.bytes_read == sum(p.stat().st_size for p in small)  # not yet written: read
    meanwhile.close()

    run.close()
    after = FileHasher(db)
    assert [after.digest(p) for p in [*small, large]] == [hash_file(p)[0] for p in [*small, large]]
    assert after.bytes_read == 0
    after.close()
