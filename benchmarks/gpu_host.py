"""What issue 23 asks to show from a GPU host, in one command.

    python benchmarks/gpu_host.py [--out DIR] [--batches 1,8] [--runs 30] [--skip-tests]

On an H100 host (README.md, "On a GPU host", says how to get there), it writes into DIR
(default $OUT if set, else /tmp/optbuild-gpu):

  summary.md        what is printed: the host (GPU, driver, CUDA), the `pytest -m gpu` summary,
                    the example build's summary line, and the tables below
  fingerprint.json  `optbuild fingerprint --json`
  pytest-gpu.txt    `pytest -m gpu -rs`: each test, and why each skipped
  build.txt         the build of a fresh copy of the example recipes (`optbuild build`)
  bench.json        `optbuild bench MODEL --no-build --json` per model and batch size
  recorded.json     what the build's benchmark steps measured and what each `best` chose

The latency table (p50, ms) takes PyTorch eager on CUDA and on the CPU, onnxruntime CUDA fp32
and fp16 (the examples' engine_cuda[*] models) and onnxruntime CPU (the fp32 model,
`simplify`) from `optbuild bench`, which times them in one process on the same inputs. A
second table gives what the build recorded: its benchmark steps (batch 1) and the variant
`best` chose among those that ran here. On a host without a GPU it runs all the same, and
says which cells are unavailable and why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = ("cnn", "transformer", "encoder")
# this checkout's optbuild in every command; no build server left behind
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
       "OPTBUILD_SERVER": "0", "PYTHONDONTWRITEBYTECODE": "1"}

# (column, does this `optbuild bench` row fill it for model m)
COLUMNS = [
    ("PyTorch eager CUDA", lambda row, m: row["runtime"] == "torch-cuda"),
    ("ORT CUDA fp32", lambda row, m: row["step"] == f"{m}:engine_cuda[fp32]"),
    ("ORT CUDA fp16", lambda row, m: row["step"] == f"{m}:engine_cuda[fp16]"),
    ("ORT CPU fp32", lambda row, m: row["step"] == f"{m}:simplify" and row["runtime"] == "onnxruntime"),
    ("PyTorch eager CPU", lambda row, m: row["runtime"] == "torch"),
]
RECORDED = [("bench_fp32", "ORT CPU fp32"), ("bench_cuda[fp32]", "ORT CUDA fp32"),
            ("bench_cuda[fp16]", "ORT CUDA fp16")]


class Report:
    """Lines printed as they come and kept for summary.md (rewritten after each part, so a
    run cut short still leaves what it had)."""

    def __init__(self, out: Path):
        self.out, self.lines = out, []

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)
        (self.out / "summary.md").write_text("\n".join(self.lines) + "\n")


def run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:  # what it wrote until then (bytes, whatever text= says)
        said = [part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                for part in (exc.stdout, exc.stderr)]
        return 124, said[0], said[1] + f"\n(stopped: it ran past {timeout:.0f} s)"
    return proc.returncode, proc.stdout, proc.stderr


def optbuild(*args: str, cwd: Path, timeout: float = 600) -> tuple[int, str, str]:
    return run([sys.executable, "-m", "optbuild", *args], cwd, timeout)


# --- the host ------------------------------------------------------------------------------
def torch_on_cuda() -> tuple[str, str | None]:
    """(torch's version and CUDA build, why PyTorch eager CUDA cannot run here or None)."""
    try:
        import torch  # heavy: only here
    except ImportError as exc:
        return "torch not installed", f"torch is not installed ({exc})"
    said = f"torch {torch.__version__} (CUDA build {torch.version.cuda})"
    if torch.version.cuda is None:
        return said, f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return said, "torch.cuda.is_available() is False (no GPU or driver that torch can use)"
    return said, None


def describe_host(fields: dict, torch_said: str) -> str:
    if fields.get("gpu.count"):
        gpu = (f"{fields.get('gpu.0.name')} (compute capability {fields.get('gpu.0.compute_capability')}, "
               f"{fields.get('gpu.0.memory_mib')} MiB), NVIDIA driver {fields.get('gpu.driver')}, "
               f"CUDA {fields.get('cuda.driver_version')}")
    else:
        gpu = fields.get("gpu.error") or "no NVIDIA GPU found"
    ort = f"onnxruntime {fields.get('onnxruntime.version')} ({fields.get('onnxruntime.distribution')}), " \
          f"providers {fields.get('ort_providers.available')}"
    cpu = f"{fields.get('cpu.model')}, {fields.get('cpu.count')} CPUs"
    return f"{gpu}; {ort}; {torch_said}; {cpu}"


# --- the example build --------------------------------------------------------------------
def why_not_built(log: str) -> dict[str, str]:
    """step -> why it did not build, from the plain build output: `unavailable STEP` (the
    reason on the indented lines after it), `failed STEP` likewise, `skipped STEP  (why)`."""
    why: dict[str, str] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"^  (unavailable|failed)\s+(\S+)\s*$", line):
            detail = []
            for more in lines[i + 1:]:
                if not more.startswith("      "):
                    break
                detail.append(more.strip())
            text = " ".join(detail).removeprefix(f"{m[2]} cannot run here: ")
            why[m[2]] = f"{m[1]}: {text}" if text else m[1]
        elif m := re.match(r"^  skipped\s+(\S+)\s+\((.*)\)\s*$", line):
            why[m[1]] = f"skipped: {m[2]}"
    return {step: root_cause(step, why) for step in why}


def root_cause(step: str, why: dict[str, str]) -> str:
    """A step skipped because an upstream step was unavailable or failed: that step's reason."""
    seen = {step}
    while (m := re.match(r"^skipped: upstream (\S+) (unavailable|failed)", why[step])) and m[1] in why \
            and m[1] not in seen:
        step = m[1]
        seen.add(step)
    return why[step]


def summary_line(log: str) -> str:
    done = [line for line in log.splitlines() if re.match(r"^(ok|FAILED): ", line)]
    return done[-1] if done else "(no summary line: the build did not finish; see build.txt)"


def recorded(project: Path, why: dict[str, str]) -> dict:
    """What the build's benchmark steps measured, and what each best chose among what."""
    found: dict = {}
    for model in MODELS:
        steps = {}
        for step, _ in RECORDED:
            path = project / "build" / model / step / "benchmark.json"
            if path.is_file():
                bench = json.loads(path.read_text())
                steps[step] = {"p50_ms": bench["p50_ms"], "runtime": bench["runtime"], "inputs": bench["inputs"]}
            else:
                steps[step] = {"unavailable": why.get(f"{model}:{step}", "not built (see build.txt)")}
        selection = project / "build" / model / "best" / "selection.json"
        best: dict = {"unavailable": why.get(f"{model}:best", "not built (see build.txt)")}
        if selection.is_file():
            doc = json.loads(selection.read_text())
            best = {"chosen": doc.get("chosen"), "candidates": [
                {"step": c["step"], "runtime": c.get("runtime"),
                 "p50_ms": (c.get("together") or {}).get("p50_ms"), "why": c.get("why") or "; ".join(c["rejected"])}
                for c in doc["candidates"]]}
        found[model] = {"benchmarks": steps, "best": best}
    return found


# --- optbuild bench ---------------------------------------------------------------------------
def bench(project: Path, model: str, batch: int, runs: int, warmup: int) -> dict:
    code, out, err = optbuild("bench", model, "--no-build", "--json", "--batch", str(batch), "--runs", str(runs),
                              "--warmup", str(warmup), cwd=project, timeout=180)
    if code != 0:
        return {"error": (err.strip().splitlines() or [f"exit status {code}"])[-1]}
    (doc,) = json.loads(out)["recipes"]
    return doc


def cells(doc: dict, model: str, torch_why: str | None) -> list[tuple[str, str | None]]:
    """Per column: (the p50 in ms, or None, and why not)."""
    if "error" in doc:
        return [(None, f"optbuild bench failed: {doc['error']}")] * len(COLUMNS)
    found = []
    for title, fills in COLUMNS:
        row = next((r for r in doc["rows"] if fills(r, model)), None)
        if row is not None and "CUDA" in title and "CUDA" not in row["runner"]:
            found.append((None, f"{row['step']} ran on {row['runner']}, not on CUDA"))
            continue
        if row is not None:
            found.append((f"{row['latency_ms']['p50']:.3f}", None))
            continue
        why = torch_why if title == "PyTorch eager CUDA" else None
        if why is None:
            step = f"engine_cuda[{title[-4:]}]" if "CUDA" in title else ""
            note = next((n for n in doc["notes"] if step and step in n), None)
            why = re.sub(r"^not benched \((.*)\): .*$", r"\1", note) if note else f"no {title} row in the bench"
        found.append((None, why))
    return found


def latency_table(docs: dict, batches: list[int], torch_why: str | None, say) -> None:
    reasons: list[str] = []
    say("| model | batch | inputs | " + " | ".join(title for title, _ in COLUMNS) + " |")
    say("|---|---|---|" + "---|" * len(COLUMNS))
    for model in MODELS:
        for batch in batches:
            doc = docs[f"{model}@{batch}"]
            shapes = ", ".join(f"{name} {'x'.join(map(str, spec['shape']))}"
                               for name, spec in (doc.get("rows") or [{}])[0].get("inputs", {}).items())
            row = []
            for p50, why in cells(doc, model, torch_why):
                if why is not None and why not in reasons:
                    reasons.append(why)
                row.append(p50 if p50 is not None else f"n/a [{reasons.index(why) + 1}]")
            say(f"| {model} | {batch} | {shapes} | " + " | ".join(row) + " |")
    for number, why in enumerate(reasons, 1):
        say(f"\n[{number}] {why}")
    notes = {note: None for doc in docs.values() for note in doc.get("notes", []) if not note.startswith("not benched")}
    for note in notes:
        say(f"\nnote: {note}")


def recorded_table(found: dict, say) -> None:
    say("| model | " + " | ".join(f"{title} (`{step}`)" for step, title in RECORDED) + " | best chose |")
    say("|---|" + "---|" * (len(RECORDED) + 1))
    reasons: list[str] = []

    def cell(entry: dict) -> str:
        if "p50_ms" in entry:
            return f"{entry['p50_ms']:.3f}"
        if entry["unavailable"] not in reasons:
            reasons.append(entry["unavailable"])
        return f"n/a [{reasons.index(entry['unavailable']) + 1}]"

    for model, entry in found.items():
        best = entry["best"]
        if "chosen" in best:
            ran = [c for c in best["candidates"] if c["p50_ms"] is not None]
            chosen = next((c for c in best["candidates"] if c["step"] == best["chosen"]), None)
            chose = (f"{best['chosen']} ({chosen['runtime']}, {chosen['p50_ms']:.3f} ms) among {len(ran)} that ran "
                     f"of {len(best['candidates'])}" if chosen else "nothing")
        else:
            chose = cell(best)
        say(f"| {model} | " + " | ".join(cell(entry["benchmarks"][step]) for step, _ in RECORDED) + f" | {chose} |")
    for number, why in enumerate(reasons, 1):
        say(f"\n[{number}] {why}")
    left = [f"- {c['step']}: {c['why']}" for entry in found.values() for c in entry["best"].get("candidates", [])
            if c["p50_ms"] is None]
    if left:
        say("\nCandidates best did not run (selection.txt says the same):\n" + "\n".join(left))


# --- the whole -----------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/optbuild-gpu"))
    parser.add_argument("--batches", default="1,8", help="batch sizes for optbuild bench (default 1,8)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--skip-tests", action="store_true", help="leave out `pytest -m gpu`")
    parser.add_argument("--budget", type=float, default=540,
                        help="seconds for the whole run (default 540: a device command may take 600); "
                             "pytest, last, gets what is left, and what it printed is kept")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (the built examples)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="optbuild-gpu-"))
    report = Report(args.out)
    say = report.say
    started = time.monotonic()

    code, out, err = optbuild("fingerprint", "--json", cwd=REPO)
    (args.out / "fingerprint.json").write_text(out if code == 0 else err)
    fields = json.loads(out) if code == 0 else {}
    torch_said, torch_why = torch_on_cuda()
    say(f"# optbuild on a GPU host ({time.strftime('%Y-%m-%d %H:%M %Z')})\n")
    say(f"host: {describe_host(fields, torch_said)}")
    if err.strip():
        say("fingerprint warnings: " + " ".join(err.split()))

    project = work / "examples"
    project.mkdir()
    shutil.copy(REPO / "optbuild.toml", project)
    shutil.copytree(REPO / "recipes", project / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    code, out, err = optbuild("build", cwd=project, timeout=args.budget / 2)
    log = out + err
    (args.out / "build.txt").write_text(log)
    gpu = (f"{fields.get('gpu.0.name')}, driver {fields.get('gpu.driver')}, CUDA {fields.get('cuda.driver_version')}"
           if fields.get("gpu.count") else "no NVIDIA GPU")
    say(f"\n## The example build (a fresh copy of recipes/)\n\n    {summary_line(log)}    [{gpu}]")
    why = why_not_built(log)
    cuda_missing = [step for step in why if "cuda" in step]
    if cuda_missing:
        say(f"\nCUDA steps not built: {len(cuda_missing)}: " + "; ".join(sorted({why[s] for s in cuda_missing})))

    docs = {f"{model}@{batch}": bench(project, model, batch, args.runs, args.warmup)
            for model in MODELS for batch in batches}
    (args.out / "bench.json").write_text(json.dumps(docs, indent=1))
    say(f"\n## p50 latency, ms (`optbuild bench --no-build`, {args.runs} runs after {args.warmup} warm-up, "
        "one process, the same inputs)\n")
    latency_table(docs, batches, torch_why, say)

    found = recorded(project, why)
    (args.out / "recorded.json").write_text(json.dumps(found, indent=1))
    say("\n## What the build recorded: its benchmark steps (p50 ms, batch 1) and best\n")
    recorded_table(found, say)

    if not args.skip_tests:
        code, out, err = run([sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-q", "-p", "no:cacheprovider",
                              f"--basetemp={work / 'pytest'}"], REPO,
                              timeout=max(60.0, args.budget - (time.monotonic() - started)))
        (args.out / "pytest-gpu.txt").write_text(out + err)
        text = out + err
        tail = text.split("short test summary info", 1)[1].splitlines()[1:] if "short test summary info" in text \
            else text.strip().splitlines()[-5:]
        say(f"\n## `pytest -m gpu -rs` (exit status {code})\n\n"
            + "\n".join(f"    {line}" for line in tail if line.strip()))
    say(f"\n(written to {args.out} in {time.monotonic() - started:.0f} s)")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"(working folder kept: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
