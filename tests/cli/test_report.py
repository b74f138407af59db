"""optbuild report (#34 item 7): one self-contained HTML page of what a build chose.

One small real project is built once for the module: two ONNX models (the second's weights
bent by 0.1 %), a verify of the bent one against the other, a benchmark of each, a select that
races them together, and a deploy of its choice, published with `optbuild deploy`. The models'
output is named with HTML in it: that name reaches the page through verify's report.json and
must arrive escaped. A second recipe is never built: the page and the command say so.

The page is then drawn by a real headless Chromium (skipped where /usr/bin/chromium is absent,
saying why); its screenshot's path is printed: run this file with ``-s`` (or ``-rP``) to see it,
and open the PNG in any image viewer.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
import onnx
from plugins.models import make_mlp
from plugins.projects import ProjectDir

from optbuild import api
from optbuild.app.report import Artifact, Report, Selection, Variant, gather
from optbuild.app.report_html import render

CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = 'y<script>alert("x")</script>&amp;'  # a model's output name: ONNX allows any string

RECIPE = """\
[steps.fp32]
kind = "onnx"
path = "../fp32.onnx"

[steps.bent]
kind = "onnx"
path = "../bent.onnx"

[steps.verify_bent]
kind = "verify"
reference = "fp32"
candidate = "bent"
max_abs = 0.5

[steps.bench_fp32]
kind = "benchmark"
input = "fp32"
runs = 5
warmup = 1
threads = 1

[steps.bench_bent]
kind = "benchmark"
input = "bent"
check = "verify_bent"
runs = 5
warmup = 1
threads = 1

[steps.best]
kind = "select"
candidates = ["bench_bent", "bench_fp32"]
runs = 20
rounds = 4
warmup = 1
max_seconds = 1

[steps.serve]
kind = "deploy"
input = "best"
model_name = "mlp"
"""

NEVER_BUILT = """\
[steps.model]
kind = "onnx"
path = "../fp32.onnx"

[steps.bench]
kind = "benchmark"
input = "model"
runs = 5

[steps.best]
kind = "select"
candidates = ["bench"]
"""


def model(path: Path, scale: float) -> None:
    """The test MLP, its output renamed to HOSTILE."""
    make_mlp(path, scale=scale)
    graph = onnx.load(str(path))
    graph.graph.output[0].name = graph.graph.node[-1].output[0] = HOSTILE
    onnx.save(graph, str(path))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProjectDir, Path]:
    """The project, its recipe mlp built and deployed (recipe later never built), and the repository."""
    root = tmp_path_factory.mktemp("report")
    proj = ProjectDir(root / "proj")
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[build]\njobs = 1\n')
    proj.write("recipes/mlp.toml", RECIPE)
    proj.write("recipes/later.toml", NEVER_BUILT)
    model(proj.root / "fp32.onnx", 1.0)
    model(proj.root / "bent.onnx", 1.001)
    repository = root / "models"
    deployed = proj.cli("deploy", "mlp", "--to", str(repository))
    assert deployed.returncode == 0, deployed.stderr
    return proj, repository


def page(proj: ProjectDir, path: Path, *args: str) -> str:
    run = proj.cli("report", *args, "-o", str(path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"wrote {path}: ")
    return path.read_text()


def lock_keys(proj: ProjectDir) -> dict[str, str]:
    return {sid: record["key"] for sid, record in json.loads(proj.read("optbuild.lock"))["steps"].items()}


def test_the_page_shows_each_variant_its_verify_figures_keys_the_choice_and_what_is_served(built, tmp_path):
    proj, repository = built
    html = page(proj, tmp_path / "report.html", "mlp", "--deployed", str(repository))
    selection = json.loads(proj.read("build/mlp/best/selection.json"))
    chosen = selection["chosen"]
    assert chosen in ("mlp:bench_bent", "mlp:bench_fp32")  # a tie on this host or not: the page says which
    rows = re.findall(r'<tr class="(\w+)"><td>(.*?)</td>', html)
    assert [(kind, re.search(r"<code>(.*?)</code>", cell)[1]) for kind, cell in rows if "bench_" in cell] == [
        ("chosen" if row["step"] == chosen else "tied" if row["step"] in (selection["tie"] or {}).get("with", [])
         else "other", row["step"]) for row in selection["candidates"]]
    assert f"Chosen: <b>{chosen}</b>" in html
    # every artifact's key, as optbuild.lock records it (its first 16 hex digits, the whole in the tooltip)
    for sid, key in lock_keys(proj).items():
        assert f'<code title="{key}">{key[:16]}</code>' in html, sid
    # verify's worst figures, max_rel included (which the benchmark's summary leaves out)
    figures = json.loads(proj.read("build/mlp/verify_bent/report.json"))["outputs"][HOSTILE]
    assert f"{figures['max_rel']:.3g}" in html and f"{figures['cosine']:.9f}" in html
    # the latency chart: a bar and a p10-p90 whisker per variant, measured together
    together = {row["step"]: row["together"] for row in selection["candidates"]}
    assert html.count("<svg") == 1 and html.count("<rect") == 2
    for figures in together.values():
        p10, p90 = (f"{figures[p]:.3g}" for p in ("p10_ms", "p90_ms"))
        assert f"({p10}-{p90})" in html
    # what deploy published, and that it is this build's
    assert "/models/mlp</code>" in html and "<td>served</td>" in html and "(this build&#x27;s)" in html


def test_python_users_get_the_page_s_content_as_dataclasses(built):
    proj, repository = built
    ws = api.open_workspace(proj.root)
    try:
        report = gather(ws, ["mlp:serve"], deployed=repository)  # a deploy step: its select step is an ancestor
    finally:
        ws.close()
    [selection] = report.selections
    chosen = json.loads(proj.read("build/mlp/best/selection.json"))["chosen"]
    assert selection.built and selection.chosen == chosen and selection.measure == "together"
    assert [(v.benchmark.step, v.model.step if v.model else None, v.chosen) for v in selection.variants] == [
        ("mlp:bench_bent", "mlp:bent", chosen == "mlp:bench_bent"), ("mlp:bench_fp32", "mlp:fp32",
                                                                     chosen == "mlp:bench_fp32")]
    verify = selection.variants[0].verify
    figures = json.loads(proj.read("build/mlp/verify_bent/report.json"))["outputs"][HOSTILE]
    assert verify is not None and verify.passed and verify.cosine_at == HOSTILE
    assert (verify.max_abs, verify.max_rel) == (figures["max_abs"], figures["max_rel"])
    [deployment] = selection.deployments
    assert deployment.model == "mlp" and deployment.built == ["1"]
    assert deployment.served is not None and deployment.served.record["key"] == lock_keys(proj)["mlp:serve"]


def test_the_page_is_self_contained_and_escapes_what_the_build_wrote(built, tmp_path):
    proj, _ = built
    html = page(proj, tmp_path / "report.html")
    assert not re.search(r"<script|<link|<img|\bsrc=|https?://(?!www\.w3\.org/2000/svg)", html)
    assert "y&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;amp;" in html  # verify's worst output


def test_a_hostile_step_name_is_escaped_everywhere_it_is_shown():
    name = '<img src=x onerror="alert(1)">&'
    hostile = Variant(Artifact(f"m:{name}", "ab" * 32), Artifact(f"m:{name}-model", None), None,
                      runtime=name, figures={"p50_ms": 1.0}, together={"p10_ms": 0.5, "p50_ms": 1.0, "p90_ms": 2.0},
                      chosen=True, why=name)
    html = render(Report(Path("/p") / name, 0.0, [Selection(Artifact(name, None), [hostile], [], objective=name,
                                                            measure="together", chosen=f"m:{name}")]))
    assert "<img" not in html and "onerror=\"" not in html
    assert html.count("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;") >= 6


def test_a_select_step_not_built_is_said_so_on_the_page_and_by_the_command_which_builds_nothing(built, tmp_path):
    proj, _ = built
    run = proj.cli("report", "later", "-o", str(tmp_path / "later.html"))
    assert run.returncode == 0, run.stderr
    missing = proj.root / "build/later/best/selection.json"
    assert f"note: later:best: not built: {missing} is missing" in run.stderr
    assert run.stdout == f"wrote {tmp_path / 'later.html'}: 1 select step(s), 1 not built\n"
    html = (tmp_path / "later.html").read_text()
    assert f"not built: {missing} is missing" in html and "<code>later:bench</code>" in html
    assert not (proj.root / "build/later").exists()


def test_a_target_without_a_select_step_is_refused_naming_it(built, tmp_path):
    proj, _ = built
    run = proj.cli("report", "mlp:fp32", "-o", str(tmp_path / "none.html"))
    assert run.returncode == 2
    assert "error: no select step in mlp:fp32" in run.stderr and not (tmp_path / "none.html").exists()


def test_an_output_it_cannot_write_or_a_missing_repository_is_an_error_naming_it(built, tmp_path):
    proj, _ = built
    run = proj.cli("report", "mlp", "-o", str(tmp_path))
    assert run.returncode == 2
    assert f"error: -o {tmp_path}: cannot write the page (Is a directory)" in run.stderr
    run = proj.cli("report", "mlp", "-o", str(tmp_path / "r.html"), "--deployed", str(tmp_path / "nowhere"))
    assert run.returncode == 2 and f"error: --deployed {tmp_path / 'nowhere'}: no such folder" in run.stderr


def test_the_report_imports_no_heavy_library(built, tmp_path):
    proj, _ = built
    code = (f"import sys; from optbuild.cli import main; rc = main(['report', '-o', {str(tmp_path / 'r.html')!r}]); "
            "print([m for m in ('torch', 'onnx', 'onnxruntime', 'tensorrt', 'openvino', 'numpy') if m in sys.modules]); "
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], cwd=proj.root, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def png_colours(path: Path) -> int:
    """How many distinct byte values the PNG's pixel rows hold (stdlib only): a page drawn
    with text, bars and badges holds many; a blank or single-coloured screenshot a handful."""
    data, pos, idat = path.read_bytes(), 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


def test_the_page_renders_in_a_real_headless_chromium(built, tmp_path):
    """The screenshot's path is printed (pytest -s or -rP shows it); open it in an image viewer."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium): the page is not drawn here")
    proj, repository = built
    report = tmp_path / "report.html"
    page(proj, report, "--deployed", str(repository))
    shot = tmp_path / "report.png"
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'chromium'}", f"--screenshot={shot}", "--window-size=1200,1600",
               report.as_uri()]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("chromium did not draw the page within 120 s")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert shot.stat().st_size > 30_000 and png_colours(shot) > 64
    print(f"\nscreenshot of the report page: {shot}")
