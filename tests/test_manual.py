"""The parameter reference: docs/steps.md is current, `optbuild kinds` prints it, every
parameter is described, and reading it loads no heavy library."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from plugins.projects import CONFIG, ProjectDir

from optbuild.steps import manual, registry

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "onnxsim", "onnxslim")


def kinds(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optbuild.cli", "kinds", *args], cwd=cwd,
                          capture_output=True, text=True, check=False)


def test_docs_steps_md_is_current():
    written = (REPO / "docs" / "steps.md").read_text(encoding="utf-8")
    assert written == manual.document(), (
        f"docs/steps.md is stale: regenerate it with `{manual.GENERATE}` (in the repository root)")


@pytest.mark.parametrize("name", list(registry.BUILTIN))
def test_every_parameter_is_described_with_valid_toml_examples(name):
    params = manual.step_class(name).Params
    for field_name, field in params.model_fields.items():
        assert manual.description(params, field_name), f"{name}: parameter {field_name!r} has no description"
        assert field.examples, f"{name}: parameter {field_name!r} has no example"
        for example in field.examples:
            tomllib.loads(f"{field_name} = {manual.toml(example)}")
    assert manual.summary(manual.step_class(name)), f"{name}: its class has no docstring"


def test_a_kinds_notes_print_between_its_summary_and_its_parameters():
    """The class docstring after its summary line says what the parameters cannot: how to
    choose onnxruntime's level, how select breaks a tie (a worked example)."""
    for name, said in (("engine/onnxruntime", "- `all`, the default: also layouts"),
                       ("select", "A worked example: `candidates = ")):
        text = manual.kind_reference(name)
        summary = manual.summary(manual.step_class(name))
        assert text.index(summary) < text.index(said) < text.index("```toml")  # the parameters follow it
        assert max(len(line) for line in manual.notes(manual.step_class(name)).splitlines()) <= manual.WIDTH


def test_kinds_lists_every_kind_and_backend_with_its_summary():
    proc = kinds()
    assert proc.returncode == 0, proc.stderr
    for name in registry.BUILTIN:
        kind, _, backend = name.partition("/")
        line = next((ln for ln in proc.stdout.splitlines() if ln.split()[:1] == [kind]
                     and (not backend or ln.split()[1] == backend)), None)
        assert line is not None, f"{name} missing from:\n{proc.stdout}"
        assert manual.summary(manual.step_class(name)) in line


def test_kinds_quantize_prints_each_parameter():
    proc = kinds("quantize")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == manual.kind_reference("quantize")
    out = proc.stdout
    assert 'kind = "quantize"' in out
    assert '- `mode`: "dynamic" | "static" | "fp16"; **required**' in out
    assert '- `weight_type`: "int8" | "uint8"; default: `"int8"`' in out
    assert "- `calibration`: step; default: not set" in out
    assert "7-bit weights" in out  # reduce_range's description
    assert 'Example: `nodes_to_exclude = ["/head/Gemm"]`' in out


def test_kinds_engine_backend_spellings_agree():
    by_flag, by_name = kinds("engine", "--backend", "tensorrt-rtx"), kinds("engine/tensorrt-rtx")
    assert by_flag.returncode == by_name.returncode == 0, by_flag.stderr + by_name.stderr
    assert by_flag.stdout == by_name.stdout
    assert "## engine/tensorrt-rtx" in by_flag.stdout and "`targets`" in by_flag.stdout
    assert "profiles = [{ image = { min = [1, 3, 224, 224]" in by_flag.stdout
    every = kinds("engine").stdout
    assert all(f"## {name}" in every for name in registry.BUILTIN if name.startswith("engine/"))


@pytest.mark.parametrize(("args", "message"), [
    (("quantise",), "unknown step kind 'quantise'; did you mean 'quantize'?"),
    (("engine", "--backend", "onnxrt"), "unknown backend 'onnxrt' for kind 'engine'; did you mean 'onnxruntime'?"),
    (("verify/tensorrt",), "unknown backend 'tensorrt' for kind 'verify'"),
])
def test_unknown_kind_or_backend_is_an_error_with_a_suggestion(args, message):
    proc = kinds(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_kinds_inside_a_project_lists_its_own_kinds_and_their_parameters(tmp_path):
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("optbuild.toml", CONFIG)
    listing = kinds(cwd=proj.root)
    assert listing.returncode == 0, listing.stderr
    text = next(line for line in listing.stdout.splitlines() if line.split()[:1] == ["text"])
    assert text.endswith("[project: kinds.py]")
    assert any(line.split()[:1] == ["quantize"] for line in listing.stdout.splitlines())  # built-ins too
    one = kinds("text", cwd=proj.root)
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("## text\n") and 'kind = "text"' in one.stdout


def test_kinds_names_the_broken_kinds_entry_of_the_project(tmp_path):
    proj = ProjectDir(tmp_path / "proj")
    proj.write("optbuild.toml", '[kinds]\nmine = "missing.py:Mine"\n')
    proc = kinds(cwd=proj.root)
    assert proc.returncode == 2
    assert "kinds.mine" in proc.stderr and "missing.py" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_kinds_imports_no_heavy_library():
    code = ("import sys; from optbuild.cli import main; rc = main(['kinds', 'quantize']); rc = rc or main(['kinds']);"
            f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]"


def test_readme_links_reach_headings_of_docs_steps_md():
    headings = {manual.anchor(line[3:].strip())
                for line in (REPO / "docs" / "steps.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("## ")}
    links = re.findall(r"\(docs/steps\.md#([^)]+)\)", (REPO / "README.md").read_text(encoding="utf-8"))
    assert links, "README.md does not link to docs/steps.md"
    assert set(links) <= headings, f"README.md links to missing sections {sorted(set(links) - headings)}"
