"""The third-party model corpus (issue #9) fetches, verifies and caches real ONNX models."""

from __future__ import annotations

import os

import onnx
import pytest
from plugins.thirdparty_models import CORPUS, FetchError, cache_dir, corpus_model


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_model_is_a_valid_onnx_file(name: str) -> None:
    path = corpus_model(name)
    assert path.is_relative_to(cache_dir())
    onnx.checker.check_model(str(path))  # by path: the whole file, as the onnx step reads it
    assert corpus_model(name) == path  # the second call reuses the cached, re-verified copy


def test_a_tampered_cache_entry_is_replaced(tmp_path, monkeypatch) -> None:
    """A cached model whose bytes no longer match the pin is fetched again, not trusted."""
    monkeypatch.setenv("OPTBUILD_TEST_MODELS", str(tmp_path))
    good = corpus_model("ppocr_cls")
    good.write_bytes(good.read_bytes()[:-1] + b"\0")
    assert corpus_model("ppocr_cls") == good
    onnx.checker.check_model(str(good))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temp files left


def test_a_failed_download_raises_instead_of_skipping(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OPTBUILD_TEST_MODELS", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(FetchError, match="pip download silero-vad==6.2.3 failed"):
        corpus_model("silero_vad")
