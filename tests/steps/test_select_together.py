"""kind = "select" measuring its candidates together (issue 24 item 1): real ONNX models through
real benchmark steps, raced again in select's own process, interleaved in rounds, on the shapes
their benchmarks recorded; a lead within the noise is a tie; the step is bound to the host like
a benchmark, and a rebuilt candidate makes it measure all of them again. No timing figure is
asserted: what is recorded, and a choice between models 20 to 1 apart in work (a lead the first
rounds decide, with no more rounds and no tie)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper
from plugins.models import OPSET, save
from plugins.projects import ProjectDir

from optbuild.backends import registry
from optbuild.common.fingerprint import Fingerprint
from optbuild.project.recipe import load_project

WIDTH = 256


def make_chain(path: Path, layers: int, name: str = "chain", seed: int = 0) -> Path:
    """x: float32 [batch, 256] -> ``layers`` x (MatMul 256x256 -> Relu) -> y: the work grows
    with ``layers``; ``name`` (the graph's) changes the bytes, not the computation."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32), f"w{i}")
               for i in range(layers)]
    nodes, last = [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], ["y" if i == layers - 1 else f"r{i}"])]
        last = f"r{i}"
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])], weights)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def candidate(name: str) -> str:
    return (f'[steps.{name}]\nkind = "onnx"\npath = "../{name}.onnx"\n\n'
            f'[steps.bench_{name}]\nkind = "benchmark"\ninput = "{name}"\nruns = 5\nwarmup = 1\nthreads = 1\n\n')


def race_project(root: Path, names: list[str], select: str = "") -> ProjectDir:
    proj = ProjectDir(root)
    root.mkdir()
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n\n[build]\njobs = 1\n')
    listed = ", ".join(f'"bench_{n}"' for n in names)
    proj.write("recipes/r.toml", "".join(candidate(n) for n in names)
               + f'[steps.best]\nkind = "select"\ncandidates = [{listed}]\nruns = 40\nrounds = 8\nwarmup = 2\n{select}')
    return proj


def selection(proj: ProjectDir) -> dict:
    return json.loads(proj.read("build/r/best/selection.json"))


def test_candidates_are_measured_together_on_their_benchmarks_shapes_and_the_slower_is_not_chosen(tmp_path):
    proj = race_project(tmp_path / "p", ["deep", "shallow"])  # the slower listed first: order cannot win it
    make_chain(proj.root / "deep.onnx", layers=20)  # 20x the work: a lead the first rounds decide
    make_chain(proj.root / "shallow.onnx", layers=1)
    result = proj.build()
    assert result.ok, {sid: o.error for sid, o in result.outcomes.items() if o.error}
    report = selection(proj)
    assert report["measure"] == "together" and report["chosen"] == "r:bench_shallow" and report["tie"] is None
    race = report["race"]
    assert (race["runs"], race["rounds"], race["warmup"], race["order"]) == (40, 8, 2, "rotating")
    # more rounds only while a lead is undecided, for up to max_seconds; a 20x lead is decided
    assert race["max_seconds"] == 30 and race["undecided"] == [] and race["rounds_run"] >= 8 and race["seconds"] > 0
    assert set(race["load"]) == {"load_average", "cpu_count", "others_cpu"}  # others_cpu: while it raced
    assert 0 <= race["load"]["others_cpu"] <= 1 and set(race["load_after"]) == {"load_average", "cpu_count"}
    deep, shallow = report["candidates"]
    for row in (deep, shallow):
        bench = json.loads(proj.read(f"build/r/{row['step'].split(':')[1]}/benchmark.json"))
        assert row["shapes"] == bench["inputs"] == {"x": {"shape": [1, WIDTH], "dtype": "float32"}}
        assert row["benchmark"]["p50_ms"] == bench["p50_ms"]  # the cached figure, shown beside
        together = row["together"]
        assert together["runtime"].startswith("onnxruntime ") and together["runs"] == 40
        assert together["level"] == "all" and together["runtime"].endswith(", optimization level all")
        assert together["threads"] == row["threads"] == bench["threads"] == 1  # as its benchmark ran
        assert len(together["rounds_p50_ms"]) == race["rounds_run"]
        assert together["p10_ms"] <= together["p50_ms"] <= together["p90_ms"]
        assert row["figures"]["p50_ms"] == together["p50_ms"]  # judged by what was measured together
    assert shallow["why"] == "chosen" and shallow["winner_lead"] is None
    lead = deep["winner_lead"]
    assert lead["low"] <= lead["ratio"] <= lead["high"] and deep["why"].startswith("p50_ms ")
    assert f"the winner is {lead['ratio']:.2f}x faster (interval {lead['low']:.2f}-{lead['high']:.2f}x)" in deep["why"]
    text = [line for line in proj.read("build/r/best/selection.txt").splitlines()
            if not line.startswith("note: ")]  # a busy host's note, if this one was busy
    assert "measured together: 40 runs each in 8 rounds, order rotating" in text[0]
    assert text[1].split()[:7] == ["candidate", "p50", "ms", "p10-p90", "ms", "thr/s", "threads"] and "bench p50" in text[1]
    assert text[2].split()[4] == "1"  # the threads it ran on
    assert text[2].startswith(" r:bench_deep") and f"{lead['ratio']:.2f}x" in text[2]
    assert text[3].startswith("*r:bench_shallow")
    assert text[4] == "measured at onnxruntime graph optimization level: r:bench_deep all, r:bench_shallow all"
    assert race["notes"] == []  # nothing crashed
    from optbuild.steps.select_table import table

    busy = {**report, "race": {**race, "load": {"load_average": 0.5, "cpu_count": 2, "others_cpu": 0.4}}}
    assert "load average 0.5 on 2 CPUs, other processes 40% of them" in table(busy).splitlines()[0]
    assert "note: other processes took 40% of the 2 CPUs while measuring" in table(busy).splitlines()[1]
    # the load average lags a minute behind (the steps built before select): what raced beside it rules
    quiet = {**report, "race": {**race, "load": {"load_average": 4.15, "cpu_count": 2, "others_cpu": 0.03}}}
    assert "note: " not in table(quiet)
    unknown = {**report, "race": {**race, "load": {"load_average": 4.15, "cpu_count": 2}}}  # a report before
    assert "note: load average 4.15 on 2 CPUs as measuring began" in table(unknown).splitlines()[1]
    # the time ran out with a lead undecided: the header says how long it measured, and that it was judged a tie
    spent = {**report, "race": {**race, "rounds_run": 31, "seconds": 30.2, "undecided": ["r:bench_deep"],
                                "load": {"load_average": 0.1, "cpu_count": 2, "others_cpu": 0.0}}}
    head = table(spent).splitlines()
    assert "in 8 rounds + 23 more while a lead was undecided (30.2 s in all), order rotating" in head[0]
    assert head[1] == ("note: after 31 rounds in 30.2 s (max_seconds 30) the lead over r:bench_deep is still "
                       "undecided: judged a tie; a larger max_seconds, or a quieter host, may decide it")


def test_select_is_bound_to_the_host_like_its_benchmarks_and_a_rebuilt_candidate_races_them_all_again(tmp_path):
    proj = race_project(tmp_path / "p", ["deep", "shallow"])
    make_chain(proj.root / "deep.onnx", layers=8)
    make_chain(proj.root / "shallow.onnx", layers=1)
    step = load_project(proj.root).steps["r:best"].step
    bench = load_project(proj.root).steps["r:bench_deep"].step
    host = Fingerprint({"cpu.arch": "x86_64", "cpu.flags": "avx2", "cpu.model": "Some CPU", "cpu.count": 8})
    assert step.exclusive and step.host_key(host) == bench.host_key(host)
    assert set(step.host_key(host)) == {"cpu.arch", "cpu.flags", "cpu.model", "cpu.count"}
    assert step.tool_names() == registry.onnx_backend().distributions()

    first = proj.build()
    assert first.ok
    again = proj.build()  # the same models on the same host: the verdict is cached
    assert "r:best" in again.steps("cached")
    before = selection(proj)["candidates"][0]["together"]
    make_chain(proj.root / "shallow.onnx", layers=1, seed=1)  # a rebuilt candidate
    rebuilt = proj.build()
    assert rebuilt.ok and "r:bench_deep" in rebuilt.steps("cached")
    assert {"r:bench_shallow", "r:best"} <= set(rebuilt.steps("built"))
    assert rebuilt.outcomes["r:best"].key != first.outcomes["r:best"].key
    after = selection(proj)["candidates"][0]["together"]  # the unchanged one, measured again
    assert after["rounds_p50_ms"] != before["rounds_p50_ms"]


@pytest.mark.parametrize(("names", "chosen", "rule"), [
    (["twin_a", "twin_b"], "r:bench_twin_a", "the one listed first"),  # the same size
    (["twin_long", "twin"], "r:bench_twin_long", "the one listed first"),  # a few bytes more: as small
])
def test_identical_models_tie_and_the_tie_is_broken_by_the_rule(tmp_path, names, chosen, rule):
    # identical models measure within a few % of each other, more on a loaded host: a margin of
    # 50 % makes them as fast as measured whatever the host does, so the rule decides, not the timer
    proj = race_project(tmp_path / "p", names, select="min_lead = 0.5\n")
    for name in names:
        make_chain(proj.root / f"{name}.onnx", layers=4, name=name)  # the same graph under another name
    result = proj.build()
    assert result.ok, {sid: o.error for sid, o in result.outcomes.items() if o.error}
    report = selection(proj)
    loser = next(n for n in names if f"r:bench_{n}" != chosen)
    assert report["chosen"] == chosen and report["tie"] == {"with": [f"r:bench_{loser}"], "broken_by": rule}
    rows = {r["step"]: r for r in report["candidates"]}
    assert rows[chosen]["why"] == f"chosen: tied within the noise with r:bench_{loser}, broken by {rule}"
    assert rows[f"r:bench_{loser}"]["why"].startswith(("tied with the fastest, ", "the fastest, tied with the winner"))
    assert "within the noise (" in rows[f"r:bench_{loser}"]["why"]
    assert f"tie within the noise, broken by {rule}" in proj.read("build/r/best/selection.txt")


def test_a_lead_is_left_undecided_only_once_max_seconds_is_spent(tmp_path):
    """Identical models with no margin: their lead, about 1.00x, is a tie only when the rounds
    rule out any lead, which on a shared host they rarely do, so select measures more rounds;
    whichever way the rounds go, it stops with a lead undecided only after max_seconds."""
    proj = race_project(tmp_path / "p", ["twin_a", "twin_b"], select="min_lead = 0.0\nmax_seconds = 1.0\n")
    for name in ("twin_a", "twin_b"):
        make_chain(proj.root / f"{name}.onnx", layers=4, name=name)
    result = proj.build()
    assert result.ok, {sid: o.error for sid, o in result.outcomes.items() if o.error}
    race = selection(proj)["race"]
    assert race["max_seconds"] == 1.0 and race["rounds_run"] >= race["rounds"] == 8
    if race["undecided"]:
        assert race["seconds"] >= 1.0 and race["rounds_run"] > 8
        assert "is still undecided: judged a tie" in proj.read("build/r/best/selection.txt")


def test_cached_compares_the_benchmarks_figures_without_measuring(tmp_path):
    proj = race_project(tmp_path / "p", ["deep", "shallow"], 'measure = "cached"\n')
    make_chain(proj.root / "deep.onnx", layers=8)
    make_chain(proj.root / "shallow.onnx", layers=1)
    step = load_project(proj.root).steps["r:best"].step
    assert not step.exclusive and step.host_key(Fingerprint({"cpu.model": "Some CPU"})) == {}
    assert proj.build().ok
    report = selection(proj)
    assert report["measure"] == "cached" and report["race"] is None
    assert all(r["together"] is None and r["figures"] == r["benchmark"] for r in report["candidates"])


# --- how a tie is broken, on times of a noisy host ----------------------------------------------
def decide(per_round_ms: dict[str, list[float]], sizes: dict[str, int]) -> tuple[dict, dict]:
    """select's verdict over candidates with these per-round latencies (4 runs a round) and sizes."""
    from optbuild.steps.select import SelectParams
    from optbuild.steps.select_rule import decide as select_decides

    params = SelectParams(candidates=list(per_round_ms))
    rows = [{"index": i, "step": f"r:{name}", "batch": 1, "figures": {"size_bytes": sizes[name]}}
            for i, name in enumerate(per_round_ms)]
    times = {i: [[int(ms * 1e6)] * 4 for ms in rounds] for i, rounds in enumerate(per_round_ms.values())}
    for row in rows:
        row["figures"]["p50_ms"] = float(np.median(np.concatenate(times[row["index"]]))) / 1e6
    report: dict = {"tie": None}
    select_decides(params, rows, times, report)
    return report, {row["step"]: row for row in rows}


def test_a_tie_within_the_noise_goes_to_the_faster_as_measured_unless_the_others_are_as_fast():
    """fp32 measured 1.5x faster than the half-size fp16, but one busy round says otherwise: the
    lead could be noise, so it is a tie; the faster is still the better guess, and size decides
    only among candidates measured as fast (effnet on a loaded host chose the 1.5x slower fp16)."""
    noisy = {"fp32": [10, 10, 10, 10, 16], "fp16": [15, 15, 15, 15, 10]}
    report, rows = decide(noisy, {"fp32": 20_000_000, "fp16": 10_000_000})
    assert rows["r:fp32"]["figures"]["p50_ms"] == 10 and rows["r:fp16"]["figures"]["p50_ms"] == 15
    assert report["chosen"] == "r:fp32"
    assert report["tie"] == {"with": ["r:fp16"], "broken_by": "the faster as measured"}
    assert rows["r:fp16"]["why"].startswith("tied with the fastest, r:fp32, within the noise (1.50x, interval 0.")
    level = {"fp32": [10, 10, 10, 10, 16], "fp16": [10.1, 10.2, 10.1, 10.1, 10]}
    report, rows = decide(level, {"fp32": 20_000_000, "fp16": 10_000_000})
    assert report["chosen"] == "r:fp16" and report["tie"]["broken_by"] == "the smaller model"
