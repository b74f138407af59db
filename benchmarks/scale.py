"""What deciding costs as a project grows: the fleet-scale table of issue 31.

    python benchmarks/scale.py [--steps 1000 10000] [--plan-only 100000] [--profile DIR]

For each size, a synthetic project (bench.py's chains of a text source and nine joins) is
made, left older than the no-op stamp's racy-timestamp window (as a user's recipes are when
they build), built cold, then timed: `plan` with everything built, the first no-op build
after it, the no-op builds until one takes the fast path (a step whose files are younger
than that window is decided again, with the recipes it reaches), `plan` again, one input
file edited (`plan`, then `build`, then the no-op after it), and one parameter of a recipe
edited (`plan`, then `build`); last, a copy whose kinds share a worker process
(`Step.shares_process`) is built cold right after it is written, and the no-op after that. For the --plan-only sizes, only
`plan` of the never-built project. Each command runs in its own process, as a user's
does; its peak resident memory is reported beside its time. With --profile, each command
also writes a cProfile file (DIR/<steps>-<what>.prof) to read with `python -m pstats`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ENV, synthetic_project

RACY_S = 2.1  # optbuild.common.signatures.RACY_NS, and a margin
FAST_RUNS = 5  # the fast path's row is the median of this many (a tenth of a second: noise shows)

# Runs optbuild's CLI in this process and writes its peak RSS (KiB) where OPTBUILD_BENCH_RSS says.
_RUNNER = """
import atexit, os, resource, sys
atexit.register(lambda: open(os.environ["OPTBUILD_BENCH_RSS"], "w").write(
    str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))
from optbuild.cli import main
profile = os.environ.get("OPTBUILD_BENCH_PROFILE")
if profile:
    import cProfile
    cProfile.run("rc = main(sys.argv[1:])", profile)
else:
    rc = main(sys.argv[1:])
sys.exit(rc)
"""


@dataclass
class Timed:
    seconds: float
    peak_mib: float
    output: str = ""


def run(root: Path, *args: str, profile: Path | None = None) -> Timed:
    """One optbuild command in a fresh process: its wall time and peak memory."""
    rss = root.parent / "rss.txt"
    env = {**ENV, "OPTBUILD_BENCH_RSS": str(rss)}
    if profile is not None:
        env["OPTBUILD_BENCH_PROFILE"] = str(profile)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _RUNNER, *args], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"optbuild {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return Timed(elapsed, int(rss.read_text()) / 1024, proc.stdout + proc.stderr)


def until_fast_path(root: Path, rows: dict[str, Timed], tries: int = 6) -> None:
    """No-op builds until one takes the fast path: the first is a row, and so is the fast one,
    named with how many normal no-ops it took to get there (a stamp is unusable while the
    project's files are younger than its racy-timestamp window)."""
    for attempt in range(1, tries + 1):
        timed = run(root, "build")
        if "fast path" in timed.output:
            runs = sorted([timed, *(run(root, "build") for _ in range(FAST_RUNS - 1))], key=lambda t: t.seconds)
            rows[f"no-op build, fast path (after {attempt - 1} normal no-ops; median of {FAST_RUNS})"] = \
                runs[FAST_RUNS // 2]
            return
        if attempt == 1:
            rows["first no-op after the build"] = timed
    rows[f"no-op build, fast path (none in {tries} no-ops)"] = timed


def measure(steps: int, profiles: Path | None) -> dict[str, Timed]:
    """The table's rows for a project of ``steps`` steps."""
    def prof(what: str) -> Path | None:
        return profiles / f"{steps}-{what}.prof" if profiles else None

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "synthetic"
        synthetic_project(root, steps)
        time.sleep(RACY_S)  # a user's recipes are older than the stamp's racy window when they build
        rows = {"plan, never built": run(root, "plan", profile=prof("plan-cold"))}
        rows["cold build"] = run(root, "build", profile=prof("build-cold"))  # [build] jobs = 2
        rows["plan, everything built"] = run(root, "plan", profile=prof("plan-built"))
        until_fast_path(root, rows)
        # the decision memo (builder/memo.py) vouches only for files older than the racy window
        rows["plan, everything built, memo kept"] = run(root, "plan", profile=prof("plan-memo"))
        (root / "data" / "in0.txt").write_text("input 0, edited")  # 10 steps downstream
        rows["one input edited: plan"] = run(root, "plan", profile=prof("plan-edited"))
        rows["one input edited: build"] = run(root, "build", profile=prof("build-edited"))
        rows["one input edited: first no-op after its build"] = run(root, "build", profile=prof("noop-edited"))
        recipe = root / "recipes" / "chain1.toml"
        recipe.write_text(recipe.read_text().replace('suffix = "-5"', 'suffix = "-five"'))  # 5 steps downstream
        rows["one parameter edited: plan"] = run(root, "plan", profile=prof("plan-param"))
        rows["one parameter edited: build"] = run(root, "build", profile=prof("build-param"))
        # last: built between the rows above, it would age their project's files
        rows.update(cold_shared(steps, Path(tmp)))
    return rows


def cold_shared(steps: int, tmp: Path) -> dict[str, Timed]:
    """The cold build of the same project whose kinds share a worker process per build
    (``Step.shares_process``): what a fork a step costs. Built right after it is written,
    as a generated project or a script's is: the no-op after it shows whether files younger
    than the racy window vouch for themselves (by what the build read of them)."""
    root = tmp / "shared"
    synthetic_project(root, steps, shared=True)
    rows = {"cold build, kinds sharing a process": run(root, "build")}
    noop = run(root, "build")
    rows["first no-op after it (project written just before)" + ("" if "fast path" in noop.output else
                                                                   ", fast path declined")] = noop
    return rows


def plan_only(steps: int, profiles: Path | None) -> dict[str, Timed]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "synthetic"
        synthetic_project(root, steps)
        profile = profiles / f"{steps}-plan-cold.prof" if profiles else None
        return {"plan, never built": run(root, "plan", profile=profile)}


def print_table(results: dict[int, dict[str, Timed]]) -> None:
    sizes = sorted(results)
    rows = list(dict.fromkeys(row for size in sizes for row in results[size]))
    width = max(len(r) for r in rows)
    print(f"{'':{width}} " + " ".join(f"{f'{n:,} steps':>22}" for n in sizes))
    for row in rows:
        cells = []
        for size in sizes:
            t = results[size].get(row)
            cells.append(f"{t.seconds:8.2f} s {t.peak_mib:6.0f} MiB" if t else f"{'':22}")
        print(f"{row:{width}} " + " ".join(f"{c:>22}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--plan-only", type=int, nargs="*", default=[], metavar="STEPS",
                        help="sizes measured for `plan` of a never-built project only (e.g. 100000)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict[str, Timed]] = {}
    for steps in args.steps:
        results[steps] = measure(steps, args.profile)
        print(f"measured {steps} steps", file=sys.stderr)
    for steps in args.plan_only:
        results.setdefault(steps, {}).update(plan_only(steps, args.profile))
    print(f"{os.cpu_count()} CPUs; time and peak memory of each command, in its own process")
    print_table(results)


if __name__ == "__main__":
    main()
