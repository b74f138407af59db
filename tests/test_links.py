"""optbuild.common.links: a second name for a file's bytes, linked where the file system allows."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from optbuild.common.links import link_or_copy


def test_a_file_on_the_same_file_system_is_hard_linked(tmp_path):
    source = tmp_path / "blob"
    source.write_bytes(b"weights")
    link_or_copy(source, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").stat().st_ino == source.stat().st_ino


def test_a_file_on_another_file_system_is_copied(tmp_path):
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system (/dev/shm) here")
    source = tmp_path / "blob"
    source.write_bytes(b"weights")
    with tempfile.TemporaryDirectory(dir=other) as folder:
        dest = Path(folder) / "model.onnx"
        link_or_copy(source, dest)  # a link across file systems fails (EXDEV)
        assert dest.read_bytes() == b"weights" and dest.stat().st_ino != source.stat().st_ino
        assert os.stat(dest).st_nlink == 1
