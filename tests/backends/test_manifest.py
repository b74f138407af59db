"""engine.json has one writer and one reader, both checked against ``EngineManifest``: what
an engine step writes reads back as written, in the bytes it always had (an engine step's
output digest enters the keys downstream); a corrupt or wrong one is refused naming the file
and the field, by every reader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optbuild.backends.manifest import MANIFEST, ManifestError, read_manifest, write_manifest
from optbuild.backends.registry import for_artifact
from optbuild.common.errors import StepError

OPTBUILD = Path(__file__).parents[2] / "optbuild"
TRT = {"backend": "tensorrt", "tensorrt_version": "10.9.0",
       "inputs": [{"name": "x", "shape": [-1, 3, 224, 224]}], "outputs": [{"name": "y", "shape": [-1, 1000]}],
       "profiles": [{"x": {"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224], "max": [32, 3, 224, 224]}}]}


def test_what_is_written_reads_back_as_written_in_sorted_key_json(tmp_path):
    write_manifest(tmp_path, TRT)
    assert (tmp_path / MANIFEST).read_text() == json.dumps(TRT, indent=2, sort_keys=True) + "\n"
    assert read_manifest(tmp_path / MANIFEST) == TRT


def test_an_onnxruntime_manifest_names_its_provider_and_level(tmp_path):
    ort = {"backend": "onnxruntime", "provider": "CPUExecutionProvider", "level": "extended", "format": "onnx"}
    write_manifest(tmp_path, ort)
    assert read_manifest(tmp_path / MANIFEST) == ort


@pytest.mark.parametrize(("content", "says"), [
    ("{not json", "is not JSON"),
    ('{"provider": "CPUExecutionProvider"}', "field backend: Field required"),
    ('{"backend": "onnxruntime", "level": "max"}', "field level: "),
    ('{"backend": "tensorrt", "inputs": [{"shape": [1]}]}', "field inputs.0.name: Field required"),
    ("[1, 2]", "field (top)"),
])
def test_a_corrupt_manifest_is_refused_naming_the_file_and_the_field(tmp_path, content, says):
    path = tmp_path / MANIFEST
    path.write_text(content)
    with pytest.raises(ManifestError) as info:
        read_manifest(path)
    assert str(path) in str(info.value) and says in str(info.value)
    (tmp_path / "model.engine").write_bytes(b"")
    with pytest.raises(StepError, match=re.escape(f"the candidate r:engine: {path}")):
        for_artifact(tmp_path / "model.engine", "the candidate r:engine")


def test_a_step_cannot_write_a_manifest_no_reader_would_take(tmp_path):
    with pytest.raises(ManifestError, match="field backend"):
        write_manifest(tmp_path, {"provider": "CPUExecutionProvider"})
    assert not (tmp_path / MANIFEST).exists()


def test_only_the_manifest_module_reads_or_writes_engine_json():
    own = OPTBUILD / "backends/manifest.py"
    others = [str(p.relative_to(OPTBUILD)) for p in OPTBUILD.rglob("*.py") if p != own
              and re.search(r"json\.(loads|dumps)\(.*(manifest|engine\.json)", p.read_text(encoding="utf-8"))]
    assert others == []
