"""Speed figures of optbuild's own machinery (not of the models it builds).

    python benchmarks/bench.py [--steps 1000] [--hash-gib 1] [--skip-examples]

Prints:
  1. no-op `optbuild build` on the example project (wall time, median of runs) and
     whether the CLI imported torch / onnx / onnxruntime / tensorrt on that path;
  2. no-op `optbuild plan` over a synthetic project of N steps;
  3. first hash of a large file (GB/s) and bytes read on the next build (goal: 0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "onnxsim", "onnxslim")
KINDS = REPO / "tests" / "fixtures" / "kinds.py"


# As on a user's machine: bytecode cached (some sandboxes set PYTHONDONTWRITEBYTECODE, which
# recompiles optbuild's modules on every start: about 0.09 s of a no-op build).
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
       "OPTBUILD_SERVER": "0"}  # every build in this process: no build server left in the temporary projects


def optbuild(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optbuild", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, check=False)


def wall(*args: str, cwd: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = optbuild(*args, cwd=cwd)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"optbuild {' '.join(args)} failed:\n{proc.stderr}")
    return times


def heavy_imports(cwd: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "optbuild", "build"],
                          cwd=cwd, env=ENV, capture_output=True, text=True, check=False)
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    return sorted(n for n in names if n.split(".")[0] in HEAVY)


def bench_examples(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "examples"
        root.mkdir()
        shutil.copy(REPO / "optbuild.toml", root)
        shutil.copytree(REPO / "recipes", root / "recipes")
        start = time.perf_counter()
        proc = optbuild("build", cwd=root)
        if proc.returncode != 0:
            sys.exit(f"example build failed:\n{proc.stderr}")
        first = time.perf_counter() - start
        times = wall("build", cwd=root, runs=runs)
        heavy = heavy_imports(root)
    print(f"[examples] first build:            {first:8.2f} s")
    print(f"[examples] no-op build (median/{runs}): {statistics.median(times):8.3f} s  (goal <= 0.115 s)")
    print(f"[examples] heavy modules imported on the no-op path: {heavy or 'none'}")


def synthetic_project(root: Path, steps: int, *, shared: bool = False) -> None:
    """steps/10 chains of 10 steps each: a text source and nine joins. ``shared``: kinds
    that share a worker process (``Step.shares_process``) rather than fork one a step."""
    root.mkdir()
    shutil.copy(KINDS, root / "kinds.py")
    prefix = ""
    if shared:
        prefix = "Shared"
        with open(root / "kinds.py", "a") as kinds:
            kinds.write("\n\nclass SharedText(Text):\n    shares_process = True\n\n\n"
                        "class SharedJoin(Join):\n    shares_process = True\n")
    (root / "optbuild.toml").write_text(
        f'[project]\nrecipes = ["recipes/*.toml"]\n[kinds]\ntext = "kinds.py:{prefix}Text"\n'
        f'join = "kinds.py:{prefix}Join"\n[build]\njobs = 2\n')
    (root / "recipes").mkdir()
    (root / "data").mkdir()
    for chain in range(steps // 10):
        (root / "data" / f"in{chain}.txt").write_text(f"input {chain}")
        lines = [f'[steps.s0]\nkind = "text"\npath = "../data/in{chain}.txt"\n']
        for i in range(1, 10):
            lines.append(f'[steps.s{i}]\nkind = "join"\ninput = "s{i - 1}"\nsuffix = "-{i}"\n')
        (root / "recipes" / f"chain{chain}.toml").write_text("\n".join(lines))


def bench_synthetic(steps: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "synthetic"
        synthetic_project(root, steps)
        start = time.perf_counter()
        proc = optbuild("build", "-j", str(os.cpu_count() or 2), cwd=root)
        if proc.returncode != 0:
            sys.exit(f"synthetic build failed:\n{proc.stderr[-2000:]}")
        first = time.perf_counter() - start
        plan = wall("plan", cwd=root, runs=runs)
        build = wall("build", cwd=root, runs=runs)
    print(f"[synthetic {steps} steps] first build:      {first:8.2f} s  ({first / steps * 1000:.0f} ms/step, each in a forked worker)")
    print(f"[synthetic {steps} steps] no-op plan:       {statistics.median(plan):8.3f} s  (goal < 1.5 s)")
    print(f"[synthetic {steps} steps] no-op build:      {statistics.median(build):8.3f} s")


def bench_hash(gib: float) -> None:
    from optbuild.common.digest import FileHasher

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.bin"
        size = int(gib * (1 << 30))
        with open(big, "wb") as f:
            chunk = os.urandom(1 << 24)
            f.writelines(chunk for _ in range(size // len(chunk)))
        old = time.time() - 10  # older than the racy-timestamp guard
        os.utime(big, (old, old))
        with open(big, "rb") as f:  # bring it into the page cache, as a fresh export would be
            while f.read(1 << 24):
                pass
        db = Path(tmp) / "stat.sqlite"
        hasher = FileHasher(db)
        start = time.perf_counter()
        hasher.digest(big)
        elapsed = time.perf_counter() - start
        hasher.close()
        again = FileHasher(db)
        again.digest(big)
        again.close()
    print(f"[hash] first hash of {gib:g} GiB:        {size / elapsed / 1e9:8.2f} GB/s  (BLAKE3-256; goal >= 2.5)")
    print(f"[hash] bytes read on the next build:   {again.bytes_read:8d}     (goal 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--hash-gib", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip-examples", action="store_true")
    args = parser.parse_args()
    if not args.skip_examples:
        bench_examples(args.runs)
    bench_synthetic(args.steps, max(3, args.runs // 2))
    bench_hash(args.hash_gib)


if __name__ == "__main__":
    main()
