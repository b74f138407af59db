"""The same small pipeline as plain scripts and through optbuild, timed in one run (issue #14).

    python benchmarks/scripts_vs_optbuild.py [--runs 5] [--steps 1000] [--json PATH]
    python benchmarks/scripts_vs_optbuild.py --runs 1 --steps 100     # quick smoke run

The pipeline: two small PyTorch models (an MLP and a CNN), each through
init weights -> export (TorchScript) -> onnxsim -> dynamic INT8. It is generated into a
temporary folder twice over: four plain scripts run one after another with
``python script.py ARGS`` (what a user would otherwise do), and an optbuild project doing
the same steps (init weights as a project-local step kind, then the built-in export,
simplify and quantize kinds). The two arms' outputs are compared byte for byte.

Scenarios (min of --runs unless said otherwise):
  - plain scripts cold vs optbuild cold with -j 1 and with the default jobs (one per CPU);
    a fresh project copy, hence a fresh cache and build folder, each run;
  - optbuild no-op build, steady state: 2.5 s after the last write and one untimed no-op
    build (optbuild trusts stat signatures of files older than 2 s only; that first no-op's
    time is printed as a note);
  - one dynamic-quantize parameter changed (reduce_range of one model) vs the plain
    quantize script run once for that model: with the build server (off by default, turned
    on here with OPTBUILD_SERVER=1: the server was started by the build before, and has
    served one build, of the other model's parameter, as a user's earlier edit would have),
    and with it off
    (OPTBUILD_SERVER=0), for comparison. Every other scenario runs with the server off (a
    cold build runs in-process either way);
  - no-op build of the example project (optbuild.toml + recipes/ of this repository),
    median, vs a bare ``python -c pass``, median;
  - N cheap steps (bench.py's synthetic project, -j 2), cold (min of at most 2 runs, each
    stopped past --cheap-timeout) and no-op.

As on a user's machine, bytecode is compiled first (compileall over optbuild and the
generated projects) and the children run without PYTHONDONTWRITEBYTECODE.
Targets are printed with PASS/MISS; the exit status is 0 either way (1 when a build fails).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ENV, REPO, synthetic_project

PY = sys.executable
MODELS = ("mlp", "cnn")
CHANGED_MODEL = "mlp"  # the model whose quantize step gets one parameter changed

# --- the generated pipeline project ---------------------------------------------------------
MODELS_PY = '''\
"""Two small models; build_<name>() returns (module, example inputs), as optbuild's export takes."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.conv3(x))
        return self.head(x.mean(dim=(2, 3)))


def _example(*shape):
    # a generator of its own: the example never consumes the global RNG that seeds the weights
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1234))


def build_mlp():
    return MLP(), _example(1, 16, 64)  # 3-D input: the Linears export as MatMul (dynamic-quantizable)


def build_cnn():
    return CNN(), _example(1, 3, 32, 32)


BUILD = {"mlp": build_mlp, "cnn": build_cnn}
'''

INIT_PY = '''\
"""python init_weights.py MODEL OUT [--seed N]: a seeded initialization, saved as a state_dict."""

import argparse

import torch

from models import BUILD

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("out")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
torch.manual_seed(args.seed)
module, _ = BUILD[args.model]()
torch.save(module.state_dict(), args.out)
'''

EXPORT_PY = '''\
"""python export.py MODEL WEIGHTS OUT: the model, with those weights, to ONNX (TorchScript exporter)."""

import argparse
import warnings

import torch

from models import BUILD

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("weights")
parser.add_argument("out")
parser.add_argument("--opset", type=int, default=17)
args = parser.parse_args()
module, example = BUILD[args.model]()
module.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True))
module.eval()
with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(module, (example,), args.out, dynamo=False, do_constant_folding=True,
                      input_names=["x"], output_names=["y"], opset_version=args.opset,
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
'''

SIMPLIFY_PY = '''\
"""python simplify.py IN OUT: onnxsim."""

import argparse
import inspect

import onnx
import onnxsim

parser = argparse.ArgumentParser()
parser.add_argument("input")
parser.add_argument("out")
args = parser.parse_args()
options = {"check_n": 0}
if "certify" in inspect.signature(onnxsim.simplify).parameters:
    options["certify"] = False
model, ok = onnxsim.simplify(onnx.load(args.input), **options)
assert ok, "onnxsim could not validate its result"
onnx.save(model, args.out)
'''

QUANTIZE_PY = '''\
"""python quantize.py IN OUT [--reduce-range] [--per-channel]: onnxruntime's dynamic INT8."""

import argparse

from onnxruntime.quantization import QuantType, quantize_dynamic

parser = argparse.ArgumentParser()
parser.add_argument("input")
parser.add_argument("out")
parser.add_argument("--reduce-range", action="store_true")
parser.add_argument("--per-channel", action="store_true")
args = parser.parse_args()
quantize_dynamic(args.input, args.out, per_channel=args.per_channel, reduce_range=args.reduce_range,
                 weight_type=QuantType.QUInt8)  # uint8: onnxruntime's CPU ConvInteger wants u8 x u8
'''

KINDS_PY = '''\
"""The project's own step kind: init_weights, what init_weights.py does."""

import importlib.util

from optbuild.steps.base import CallableRef, Step, StepContext, StepParams


class InitWeightsParams(StepParams):
    model: CallableRef  # "models.py:build_mlp"; the file enters the key
    seed: int = 0


class InitWeights(Step):
    """A seeded initialization of a model, saved as a state_dict."""

    Params = InitWeightsParams
    tools = ("torch",)
    primary_output = "weights.pt"

    def run(self, ctx: StepContext) -> None:
        import torch

        file, _, attr = self.params.model.rpartition(":")
        spec = importlib.util.spec_from_file_location("init_weights_models", ctx.path(file))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch.manual_seed(self.params.seed)
        net, _ = getattr(module, attr)()
        torch.save(net.state_dict(), ctx.out_dir / "weights.pt")
'''

OPTBUILD_TOML = '''\
[project]
recipes = ["recipes/*.toml"]

[kinds]
init_weights = "kinds.py:InitWeights"
'''


def recipe(model: str, reduce_range: bool = False) -> str:
    return textwrap.dedent(f'''\
        [steps.init_weights]
        kind = "init_weights"
        model = "../models.py:build_{model}"
        seed = 0

        [steps.export]
        kind = "export"
        model = "../models.py:build_{model}"
        weights_from = "init_weights"
        opset = 17
        input_names = ["x"]
        output_names = ["y"]
        dynamic_axes = {{ x = {{ 0 = "batch" }}, y = {{ 0 = "batch" }} }}

        [steps.simplify]
        kind = "simplify"
        input = "export"
        backend = "onnxsim"

        [steps.quantize]
        kind = "quantize"
        input = "simplify"
        mode = "dynamic"
        weight_type = "uint8"
        reduce_range = {str(reduce_range).lower()}
        ''')


def generate(root: Path) -> None:
    """The pipeline project: models, the plain scripts, and the optbuild project beside them."""
    root.mkdir(parents=True)
    files = {"models.py": MODELS_PY, "init_weights.py": INIT_PY, "export.py": EXPORT_PY,
             "simplify.py": SIMPLIFY_PY, "quantize.py": QUANTIZE_PY, "kinds.py": KINDS_PY,
             "optbuild.toml": OPTBUILD_TOML}
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "recipes").mkdir()
    for model in MODELS:
        (root / "recipes" / f"{model}.toml").write_text(recipe(model))
    compile_bytecode(root)


def compile_bytecode(*roots: Path) -> None:
    subprocess.run([PY, "-m", "compileall", "-q", *map(str, roots)], env=ENV, check=True,
                   stdout=subprocess.DEVNULL)


# --- running and timing ------------------------------------------------------------------------
class Failed(Exception):
    pass


class TimedOut(Exception):
    pass


SERVER_OFF = {"OPTBUILD_SERVER": "0"}
SERVER_ON = {"OPTBUILD_SERVER": "1"}


def run(cmd: list[str], cwd: Path, timeout: float | None = None, env: dict[str, str] | None = None) -> float:
    """Wall time of ``cmd``; Failed with its output's tail when it fails, TimedOut (its
    process group stopped) when it runs past ``timeout`` seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env={**ENV, **(env or SERVER_OFF)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the build's own group: it and its workers
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
                break
        raise TimedOut(f"{' '.join(cmd)} ran past {timeout:g} s") from None
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise Failed(f"{' '.join(cmd)} (in {cwd}) failed with status {proc.returncode}:\n{output[-3000:]}")
    return elapsed


def optbuild(cwd: Path, *args: str, timeout: float | None = None, env: dict[str, str] | None = None) -> float:
    return run([PY, "-m", "optbuild", "build", *args], cwd, timeout, env)


def server(cwd: Path, action: str) -> bool:
    """``optbuild server ACTION`` in ``cwd``: whether it succeeded (status: one runs)."""
    return subprocess.run([PY, "-m", "optbuild", "server", action], cwd=cwd, env={**ENV, **SERVER_ON},
                          capture_output=True, timeout=120, check=False).returncode == 0


def wait_for_server(cwd: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not server(cwd, "status"):
        if time.monotonic() > deadline:
            raise Failed(f"no build server came up for {cwd} in {timeout:g} s")
        time.sleep(0.2)


# optbuild trusts a file's stat signature only once the file is older than 2 s (racy
# timestamps, as git and ninja): a no-op build within 2 s of the last write, or the first one
# after a build that recorded files younger than that, takes the slow path. A user's next
# build rarely comes that soon; the no-op scenarios measure the steady state: wait this long,
# build once untimed (its time is kept as "first no-op"), then time.
SETTLE_S = 2.5


def settle(results: Results, name: str, root: Path) -> None:
    time.sleep(SETTLE_S)
    results.notes[f"{name}: first no-op after the build, untimed"] = round(optbuild(root), 3)


def fresh_copy(source: Path, dest: Path) -> Path:
    """A copy of ``source`` at ``dest`` (replacing it): mtimes kept, so bytecode stays valid."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True)
    return dest


def plain_pipeline(root: Path) -> float:
    """Every script, one after another, as a user would run them; the total wall time."""
    start = time.perf_counter()
    for model in MODELS:
        out = root / "out" / model
        out.mkdir(parents=True, exist_ok=True)
        run([PY, "init_weights.py", model, str(out / "weights.pt"), "--seed", "0"], root)
        run([PY, "export.py", model, str(out / "weights.pt"), str(out / "export.onnx")], root)
        run([PY, "simplify.py", str(out / "export.onnx"), str(out / "simplified.onnx")], root)
        run([PY, "quantize.py", str(out / "simplified.onnx"), str(out / "quantized.onnx")], root)
    return time.perf_counter() - start


PAIRS = (("init_weights", "weights.pt", "weights.pt"), ("export", "model.onnx", "export.onnx"),
         ("simplify", "model.onnx", "simplified.onnx"), ("quantize", "model.onnx", "quantized.onnx"))


def compare_outputs(plain: Path, built: Path) -> dict[str, str]:
    """model:step -> 'identical', or how the two arms' outputs differ."""
    result = {}
    for model in MODELS:
        for step, ours, theirs in PAIRS:
            a, b = plain / "out" / model / theirs, built / "build" / model / step / ours
            if not a.is_file() or not b.is_file():
                result[f"{model}:{step}"] = f"missing: {a if not a.is_file() else b}"
            elif a.read_bytes() == b.read_bytes():
                result[f"{model}:{step}"] = "identical"
            else:
                result[f"{model}:{step}"] = "differs: " + (describe_onnx_diff(a, b) if a.suffix == ".onnx"
                                                           else f"{a.stat().st_size} vs {b.stat().st_size} bytes")
    return result


def describe_onnx_diff(a: Path, b: Path) -> str:
    import onnx

    ma, mb = onnx.load(str(a)), onnx.load(str(b))
    fields = [name for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version",
                                "doc_string", "metadata_props", "opset_import", "functions")
              if getattr(ma, name) != getattr(mb, name)]
    if ma.graph != mb.graph:
        same_nodes = [n.op_type for n in ma.graph.node] == [n.op_type for n in mb.graph.node]
        fields.append("graph" + ("" if not same_nodes else " (same node ops; names, attributes or weights differ)"))
    return ", ".join(fields) or "serialization only (the models compare equal)"


# --- scenarios -----------------------------------------------------------------------------------
@dataclass
class Results:
    runs: int
    steps: int
    times: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    stopped: dict[str, float] = field(default_factory=dict)  # scenario -> the timeout it ran past

    def add(self, name: str, seconds: float) -> None:
        self.times.setdefault(name, []).append(seconds)
        print(f"  {name:<28} {seconds:8.3f} s", flush=True)

    def best(self, name: str) -> float | None:
        return min(self.times[name]) if self.times.get(name) else None

    def median(self, name: str) -> float | None:
        return statistics.median(self.times[name]) if self.times.get(name) else None


def scenario(results: Results, name: str, fn, *args) -> None:
    """Run one scenario; a failure is recorded (and printed) and the others still run."""
    print(f"[{name}]", flush=True)
    try:
        fn(results, *args)
    except Failed as exc:
        results.errors[name] = str(exc)
        print(f"  FAILED: {exc}", flush=True)


def pipeline_scenarios(results: Results, work: Path) -> None:
    src = work / "src"
    generate(src)
    last_plain = last_built = None
    for i in range(results.runs):
        last_plain = fresh_copy(src, work / "plain")
        results.add("plain cold", plain_pipeline(last_plain))
        last_built = fresh_copy(src, work / "optbuild-j1")
        results.add("optbuild cold -j 1", optbuild(last_built, "-j", "1"))
        last_built = fresh_copy(src, work / "optbuild-default-jobs")  # [build] jobs = 0: one per CPU
        results.add("optbuild cold default jobs", optbuild(last_built))
    results.notes["outputs"] = outputs = compare_outputs(last_plain, last_built)
    for key, verdict in outputs.items():
        print(f"  output {key:<22} {verdict}")

    built = last_built  # a fully built project, as a user has it after a build
    settle(results, "pipeline", built)
    for _ in range(results.runs):
        results.add("optbuild no-op", optbuild(built))

    # One parameter changed: from a copy of the built project, so that every run rebuilds.
    snapshot = work / "built-snapshot"
    fresh_copy(built, snapshot)
    simplified = last_plain / "out" / CHANGED_MODEL / "simplified.onnx"
    other = next(m for m in MODELS if m != CHANGED_MODEL)
    for _ in range(results.runs):
        results.add("plain quantize once", run([PY, "quantize.py", str(simplified),
                                                str(last_plain / "changed.onnx"), "--reduce-range"], last_plain))
        project = fresh_copy(snapshot, work / "changed")
        time.sleep(SETTLE_S)  # then an untimed no-op: the state of a machine after its last build
        optbuild(project)
        (project / "recipes" / f"{CHANGED_MODEL}.toml").write_text(recipe(CHANGED_MODEL, reduce_range=True))
        results.add("optbuild one param changed, no server", optbuild(project))
        check_changed_output(results, project, last_plain, "no server")

        served = fresh_copy(snapshot, work / "changed-served")
        try:
            time.sleep(SETTLE_S)
            optbuild(served, env=SERVER_ON)  # untimed: no server runs; it builds, then starts one
            wait_for_server(served)
            (served / "recipes" / f"{other}.toml").write_text(recipe(other, reduce_range=True))
            results.add("first build through a new server", optbuild(served, env=SERVER_ON))
            (served / "recipes" / f"{CHANGED_MODEL}.toml").write_text(recipe(CHANGED_MODEL, reduce_range=True))
            results.add("optbuild one param changed", optbuild(served, env=SERVER_ON))
        finally:
            server(served, "stop")
        check_changed_output(results, served, last_plain, "server")


def check_changed_output(results: Results, project: Path, plain: Path, arm: str) -> None:
    after = project / "build" / CHANGED_MODEL / "quantize" / "model.onnx"
    same = after.read_bytes() == (plain / "changed.onnx").read_bytes()
    results.notes[f"changed quantize output ({arm})"] = "identical" if same else "differs: " + describe_onnx_diff(
        plain / "changed.onnx", after)
    print(f"  output {CHANGED_MODEL}:quantize (changed, {arm}) {results.notes[f'changed quantize output ({arm})']}")


def example_scenarios(results: Results, work: Path) -> None:
    root = work / "examples"
    root.mkdir()
    shutil.copy(REPO / "optbuild.toml", root)
    shutil.copytree(REPO / "recipes", root / "recipes")
    compile_bytecode(root)
    # The repository's own cache, where there is one, saves rebuilding every example model:
    # what it lacks (another optbuild version's keys) is built.
    for part in ("ac", "cas"):
        if (REPO / "cache" / part).is_dir():
            try:
                shutil.copytree(REPO / "cache" / part, root / "cache" / part, symlinks=True)
            except (OSError, shutil.Error) as exc:  # written to meanwhile: build what is missing
                results.notes["examples cache copy"] = f"incomplete: {str(exc)[:200]}"
    results.notes["examples first build s"] = round(optbuild(root), 3)
    print(f"  examples first build           {results.notes['examples first build s']:8.3f} s (untimed)")
    settle(results, "examples", root)
    count = max(5, results.runs)
    for _ in range(count):
        results.add("python -c pass", run([PY, "-c", "pass"], root))
        results.add("examples no-op", optbuild(root))


def cheap_scenarios(results: Results, work: Path, cold_runs: int, timeout: float | None) -> None:
    """Cold builds of the synthetic project, each in a fresh folder; then no-op builds of the
    last one. A cold build past ``timeout`` is stopped (its figure: how far it got), and the
    no-op is not measured then: there is no fully built project to measure it on."""
    name = f"{results.steps} cheap steps"
    noop_root = None
    for i in range(cold_runs):
        root = work / f"cheap{i}"
        synthetic_project(root, results.steps)
        compile_bytecode(root)
        try:
            results.add(f"{name} cold", optbuild(root, timeout=timeout))
        except TimedOut:
            done = sum(1 for d in (root / "build").glob("*/*") if d.is_dir())
            results.notes[f"{name} cold"] = note = (
                f"stopped after {timeout:g} s with {done} of {results.steps} steps built"
                + (f" (about {timeout * results.steps / done:.0f} s for all at that pace)" if done else ""))
            print(f"  {name} cold: {note}", flush=True)
            results.stopped[f"{name} cold"] = timeout
            shutil.rmtree(root)
            break
        if noop_root is not None:
            shutil.rmtree(noop_root)
        noop_root = root
    if noop_root is None:
        results.notes[f"{name} no-op"] = "not measured: no cold build finished"
        return
    settle(results, name, noop_root)
    for _ in range(results.runs):
        results.add(f"{name} no-op", optbuild(noop_root))


# --- report ---------------------------------------------------------------------------------------
def table(results: Results) -> list[tuple[str, float | None, float | None]]:
    """(scenario, plain scripts s, optbuild s); min of runs except the examples' medians."""
    b, n = results.best, results.steps
    return [
        ("cold, -j 1", b("plain cold"), b("optbuild cold -j 1")),
        (f"cold, default jobs (-j {os.cpu_count()})", b("plain cold"), b("optbuild cold default jobs")),
        ("no-op (plain: all scripts again)", b("plain cold"), b("optbuild no-op")),
        ("one quantize parameter changed (build server)", b("plain quantize once"), b("optbuild one param changed")),
        ("one quantize parameter changed, no build server", b("plain quantize once"),
         b("optbuild one param changed, no server")),
        ("first build through a just-started server", None, b("first build through a new server")),
        ("examples no-op, median (plain: python -c pass)", results.median("python -c pass"),
         results.median("examples no-op")),
        (f"{n} cheap steps cold", None, b(f"{n} cheap steps cold")),
        (f"{n} cheap steps no-op", None, b(f"{n} cheap steps no-op")),
    ]


def targets(results: Results) -> list[dict]:
    b, n = results.best, results.steps
    plain, j1, j2 = b("plain cold"), b("optbuild cold -j 1"), b("optbuild cold default jobs")
    quant, changed = b("plain quantize once"), b("optbuild one param changed")
    bare, examples = results.median("python -c pass"), results.median("examples no-op")
    scale = "" if n == 1000 else f" (measured at {n} steps; the target is for 1,000)"
    rows = [
        ("cold -j 1 faster than the plain scripts", j1, plain, lambda: j1 < plain, "s vs s"),
        (f"cold with default jobs (-j {os.cpu_count()}) at least 2x faster than the plain scripts", j2, plain and plain / 2,
         lambda: j2 <= plain / 2, "s vs s"),
        (f"{n} cheap steps cold under 15 s{scale}", b(f"{n} cheap steps cold"), 15.0,
         lambda: b(f"{n} cheap steps cold") < 15.0, "s"),
        (f"{n} cheap steps no-op under 0.5 s{scale}", b(f"{n} cheap steps no-op"), 0.5,
         lambda: b(f"{n} cheap steps no-op") < 0.5, "s"),
        ("examples no-op median at most 0.115 s", examples, 0.115, lambda: examples <= 0.115, "s"),
        ("examples no-op median at most 4x python -c pass", examples, bare and 4 * bare,
         lambda: examples <= 4 * bare, "s"),
        ("one parameter changed (build server, the default): quantize script + at most 0.1 s", changed,
         quant and quant + 0.1, lambda: changed <= quant + 0.1, "s"),
    ]
    out = []
    for name, value, limit, check, _ in rows:
        ok = None if value is None or limit is None else bool(check())
        if value is None and name.startswith(f"{n} cheap steps cold") and results.stopped:
            ok = False  # stopped past its timeout, itself past the limit
        out.append({"target": name, "value_s": value, "limit_s": limit, "pass": ok})
    return out


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def report(results: Results) -> list[dict]:
    rows = table(results)
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'scenario':<{width}} | {'plain scripts':>13} | {'optbuild':>10} | optbuild/plain")
    print(f"{'-' * width}-|-{'-' * 13}-|-{'-' * 10}-|---------------")
    for name, plain, ours in rows:
        ratio = f"{ours / plain:.3f}" if plain and ours is not None else "-"
        shown = fmt(ours)
        if ours is None and name.endswith("cheap steps cold") and results.stopped:
            shown = f"> {min(results.stopped.values()):g} s"
        print(f"{name:<{width}} | {fmt(plain):>13} | {shown:>10} | {ratio}")
    print(f"\n(min of {results.runs} runs unless said; {os.cpu_count()} CPUs)")
    checks = targets(results)
    print()
    for t in checks:
        verdict = {True: "PASS", False: "MISS", None: "n/a "}[t["pass"]]
        value = fmt(t["value_s"])
        if t["value_s"] is None and t["pass"] is False:
            value = f"> {min(results.stopped.values()):g} s (stopped)"
        print(f"{verdict}  {t['target']}: {value} (limit {fmt(t['limit_s'])})")
    for name, note in results.notes.items():
        if name != "outputs":
            print(f"note  {name}: {note}")
    for name, error in results.errors.items():
        print(f"ERROR {name}: {error.splitlines()[0]}")
    return checks


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for dist in ("optbuild", "torch", "onnx", "onnxruntime", "onnxsim"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per scenario (the minimum is reported)")
    parser.add_argument("--steps", type=int, default=1000, help="cheap steps (a multiple of 10)")
    parser.add_argument("--cold-cheap-runs", type=int, default=None,
                        help="cold builds of the cheap steps (default: --runs, at most 2)")
    parser.add_argument("--cheap-timeout", type=float, default=60.0,
                        help="stop a cold build of the cheap steps after this many seconds (0: never); "
                             "it then counts as a MISS and the no-op is not measured")
    parser.add_argument("--skip", action="append", default=[], choices=["pipeline", "examples", "cheap"],
                        help="leave out a group of scenarios (repeatable)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder, and say where")
    args = parser.parse_args()
    if args.runs < 1 or args.steps < 10:
        parser.error("--runs must be >= 1 and --steps >= 10")

    compile_bytecode(REPO / "optbuild")
    results = Results(runs=args.runs, steps=args.steps)
    work = Path(tempfile.mkdtemp(prefix="optbuild-scripts-vs-"))
    started = time.perf_counter()
    try:
        if "pipeline" not in args.skip:
            scenario(results, "pipeline", pipeline_scenarios, work)
        if "examples" not in args.skip:
            scenario(results, "examples", example_scenarios, work)
        if "cheap" not in args.skip:
            cold_runs = args.cold_cheap_runs or min(args.runs, 2)
            scenario(results, "cheap steps", cheap_scenarios, work, cold_runs, args.cheap_timeout or None)
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    checks = report(results)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            "runs": args.runs, "steps": args.steps, "cpus": os.cpu_count(), "versions": versions(),
            "times_s": results.times,
            "table": [{"scenario": s, "plain_s": p, "optbuild_s": o} for s, p, o in table(results)],
            "targets": checks, "notes": results.notes, "errors": results.errors,
            "stopped_after_s": results.stopped,
        }, indent=2) + "\n")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
