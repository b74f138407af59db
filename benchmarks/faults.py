"""Fault figures: does the cache survive kills, races, corruption, a hostile remote, forged
build-farm tasks and the build server; does `clean` keep a user's files, and does a killed
`deploy` leave Triton serving something consistent?

    python benchmarks/faults.py [--kills 100] [--builders 4 --runs 25] [--rounds 3] [--edits 6]
                                [--forgeries 10] [--rewirings 8] [--cleans 20] [--deploys 30]
                                [--only CATEGORY...] [--quick] [--json]

Every category runs in throw-away projects (the fast test kinds of tests/fixtures/kinds.py
plus a `blob` kind writing a few MB in chunks, so that kills land mid-write) and prints:
tries, builds that failed when they should not have, invariant violations, data lost
(outputs that came out wrong after a build that said it succeeded, a user's file that
`clean` deleted, a model served with another version's config after a deploy that said ok:
must be 0), wrong outputs undetectable without signing (a column of their own, see 7) and
time.

  1. kills: `optbuild build` SIGKILLed (the CLI alone, or its whole process group) after a
     random delay within the time the same build takes (measured first: each build about to
     be killed runs whole in a twin project copied from the same state), sometimes after an
     input edit or a wiped cache / build folder; the row says how many kills landed while the
     build ran. Then the
     cache must verify, every build/ folder must be its old or its new tree (never torn),
     optbuild.lock must parse, and a follow-up build must finish within a timeout (no stale
     lock), give what a clean build in a fresh project gives and leave no scratch behind;
  2. concurrent builders: P processes x R runs on one project and cache, inputs edited
     between runs, `optbuild cache gc` with a tiny bound running beside them; afterwards
     every input variant is built once more and must come out right (no poisoned entry);
  3. corruptions: a blob flipped / truncated / deleted, an entry garbled, the sqlite stat
     cache overwritten or a page of it damaged, optbuild.lock and lock files garbled; then
     a build must succeed with right outputs and no traceback, and leave the cache intact;
  4. hostile remote (file://): entries deeply nested, huge, with over-long or '../' output
     names, bad digests, unsigned or wrongly signed, blobs whose bytes do not match; then a
     fresh host's build must succeed with right outputs, write nothing outside build/ and
     cache/, and leave its local cache intact;
  5. stale bytecode: the helper module of a torch export step's model is imported in another
     interpreter (its .pyc written to __pycache__, as a test run or a REPL leaves it), then
     edited within the same second at the same size (`SCALE = 21.25` -> `SCALE = 21.75`,
     mtime set back): CPython would take that .pyc as current. The build that follows must
     export a model computing the new value (a build that says ok with the old one lost data);
  6. dask-forged: a `dask scheduler` and two `optbuild worker` nodes on 127.0.0.1 (the signed
     file:// remote on their command line, the signing key in their own environment); after an
     honest build on them, forged tasks go straight to the scheduler: a real step's key and
     key material with other input bytes or other upstream outputs, another output of its
     upstream as the main one, other key material under the real key, another class of the
     kind's file, a built-in kind's implementation. A try loses data if the node builds it,
     or the remote changes at all, or a key holder with an empty cache then restores anything
     but the honest outputs;
  7. rewired: on a file:// remote, signed and then unsigned, one output of an entry is
     pointed at another blob of the remote (every other try with the size it records made to
     match, so that the entry names an intact blob, only not its own); `optbuild cache audit`
     must not say all intact (a violation), and a fresh host's build must give what a clean
     local build gives (else data lost). One exception, in a column of its own ("wrong,
     undetectable without signing"), not data lost: an unsigned entry rewired to an intact
     blob of the size it records is, by design, a true entry to anyone without a key
     (docs/remote-cache.md); a try counts there only when the rewired output holds exactly
     the blob it was pointed at and nothing but it and the steps built from it differs;
  8. server: the kills and stale bytecode categories again with the build server on
     (OPTBUILD_SERVER=1; ENV keeps it off elsewhere), then `optbuild server stop` in each of
     their projects. Whatever the run leaves running (a server, a fork server, a Dask node:
     each carries FAULTS_SUITE_RUN in its environment) is killed by pid at the end, and said;
  9. clean: in a project per try (a second recipe `Work`, the cache shared), foreign files
     are planted in step folders, a nested output folder, recipe folders, a folder named like
     a recipe, folders a crafted optbuild.lock names as steps (`.ssh:y`, `Documents:x`),
     under .logs, named like outputs and logs in folders optbuild did not write, beside the
     build folder, or in a build folder the user made before optbuild ran; then builds,
     cleans and cleans SIGKILLed within a clean's measured time. A foreign file deleted or
     changed is data lost; a build or clean that refuses, naming a foreign item, is meant;
     after the last clean, a file optbuild wrote left in a folder holding nothing foreign is
     a violation (beside foreign files it is counted);
 10. deploy: a Triton repository built by `optbuild deploy --to --keep 3`, each try a
     publish of a new model, a publish with nothing changed or a `--rollback`, SIGKILLed
     (process group) at a random delay within that command's measured time, or the moment a
     version folder appears or goes (the switch); then what Triton serves (the version
     config.pbtxt pins with a `specific` version_policy, else the highest numeric folder)
     must be whole, as its optbuild.json records, with the configuration it was published
     with (else a violation), and the same command run again must end consistent (said ok
     and still inconsistent: data lost), serve the model the deploy step built, and leave no
     hidden leftovers.

Exits 1 if any data was lost. Checks that fail today are reported, never a crash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

from faults_dask import FORGERIES, Farm, Forged, deps_of, honest_task, send, start_farm

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "tests" / "fixtures" / "kinds.py"
# As on a user's machine: bytecode cached (see bench.py).
ENV = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "OPTBUILD_REMOTE")},
       "OPTBUILD_SERVER": "0"}  # no build server left in the temporary projects (with_server turns it on)
RUN_MARKER = "FAULTS_SUITE_RUN"  # in ENV, with a value of this run's own: finds what it left running
SIGNING_ENV = "FAULTS_SIGNING_KEY"
SIGNING_KEY = "faults-suite-signing-key"
BUILD_TIMEOUT = 120.0  # a follow-up build slower than this is taken to wait on a stale lock
HIDDEN_SIBLING = re.compile(r"^\..+\..*@")  # materialize()'s staging / old trees
INTENDED = ("changed while",)  # failures a build is meant to report (an input edited mid-build)

BLOB_KIND = '''
"""A step writing `megabytes` MB derived from its input, in chunks (kills land mid-write)."""
import hashlib
import random
import time

from optbuild.steps.base import Step, StepContext, StepParams, StepRef


class BlobParams(StepParams):
    input: StepRef
    megabytes: float = 1.0
    sleep: float = 0.0


class Blob(Step):
    Params = BlobParams
    primary_output = "data.txt"

    def run(self, ctx: StepContext) -> None:
        text = ctx.inputs["input"].primary.read_text()
        data = random.Random(hashlib.sha256(text.encode()).digest()).randbytes(int(self.params.megabytes * 1e6))
        chunks = range(0, len(data), 1 << 18)
        with open(ctx.out_dir / "blob.bin", "wb") as f:
            for start in chunks:
                f.write(data[start:start + (1 << 18)])
                f.flush()
                time.sleep(self.params.sleep / len(chunks))
        (ctx.out_dir / "data.txt").write_text(text + "|" + hashlib.sha256(data).hexdigest()[:16])


class Shadow(Blob):
    """Blob's params, other bytes: a forged Dask task names it under a Blob step's key."""

    def run(self, ctx: StepContext) -> None:
        (ctx.out_dir / "blob.bin").write_bytes(b"shadow")
        (ctx.out_dir / "data.txt").write_text("forged by Shadow")
'''

PIPELINE = """\
[steps.src]
kind = "text"
path = "../data/input.txt"

[steps.side]
kind = "text"
path = "../data/extra.txt"

[steps.a]
kind = "join"
input = "src"
suffix = "-a"
sleep = 0.05

[steps.big1]
kind = "blob"
input = "a"
megabytes = 3
sleep = 0.1

[steps.big2]
kind = "blob"
input = "side"
megabytes = 2
sleep = 0.1

[steps.c]
kind = "join"
input = "big1"
other = "big2"
suffix = "-c"
nested = true
"""

# (data/input.txt, data/extra.txt): editing extra.txt rebuilds 3 of the 6 steps, input.txt 4
Variant = tuple[str, str]
VARIANTS: list[Variant] = [("hello", "x"), ("hello", "y"), ("fault suite " * 40, "x"), ("ünïcödé ☃", "y")]


# --- projects ------------------------------------------------------------------------------
@dataclass
class Run:
    """One CLI command's outcome; returncode None when it hit its timeout."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    def tail(self) -> str:
        """The telling line: a traceback's exception, else the first error line, else the last."""
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        if not lines:
            return f"exit {self.returncode}"
        if self.traceback:
            last = max(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
            after = [line.strip() for line in lines[last + 1:] if not line.startswith((" ", "\t"))]
            exc = next((line for line in after if re.match(r"[\w.]+(Error|Exception|Exit)\b", line)), None)
            if exc:
                return exc[:240]
        telling = [line for line in lines if re.search(r"\berror\b|failed", line, re.IGNORECASE)]
        return (telling or lines)[0 if telling else -1].strip()[:240]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def make_project(root: Path, remote: str = "", cache_dir: str = "cache") -> Path:
    """A project with the fault pipeline (6 steps, 5 MB of outputs), inputs VARIANTS[0]."""
    root.mkdir(parents=True)
    shutil.copy(KINDS, root / "kinds.py")
    (root / "blob.py").write_text(BLOB_KIND)
    (root / "recipes").mkdir()
    (root / "recipes" / "faults.toml").write_text(PIPELINE)
    (root / "optbuild.toml").write_text(
        f'[project]\nrecipes = ["recipes/*.toml"]\n[cache]\ndir = "{cache_dir}"\n'
        '[kinds]\ntext = "kinds.py:Text"\njoin = "kinds.py:Join"\nblob = "blob.py:Blob"\n'
        f'[build]\njobs = 2\n{remote}')
    set_input(root, VARIANTS[0])
    return root


def set_input(root: Path, variant: Variant) -> None:
    """Replace the input files, each whole (a rename), as an editor saving a file does."""
    data = root / "data"
    data.mkdir(exist_ok=True)
    for name, text in zip(("input.txt", "extra.txt"), variant):
        tmp = data / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, data / name)


def optbuild(root: Path, *args: str, timeout: float = BUILD_TIMEOUT, env: dict | None = None) -> Run:
    """Run the CLI to completion (its process group killed on timeout)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "optbuild", *args], cwd=root, env={**ENV, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        code = None
    return Run(code, out, err, time.perf_counter() - start)


def kill_group(pgid: int, wait: float = 10.0) -> None:
    """SIGKILL a process group and wait until it is gone (orphaned workers included)."""
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group, reap it (a zombie still counts as in its group), and
    wait until the rest of the group is gone."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_group(proc.pid)


def _gone(pgid: int, wait: float) -> bool:
    """Whether the process group ends within ``wait`` seconds by itself."""
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        time.sleep(0.02)
    return False


def build_digests(root: Path) -> dict[str, str]:
    """relpath -> sha256 of every file under build/ (hidden items are checked apart)."""
    build = root / "build"
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(build):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            path = Path(dirpath, name)
            found[path.relative_to(build).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def by_step(digests: dict[str, str]) -> dict[str, dict[str, str]]:
    """Group build/ digests per step folder (recipe/step)."""
    grouped: dict[str, dict[str, str]] = {}
    for rel, digest in digests.items():
        recipe, step, rest = rel.split("/", 2)
        grouped.setdefault(f"{recipe}/{step}", {})[rest] = digest
    return grouped


class References:
    """What a clean build of each input variant gives: built once, without faults, in a
    fresh project of its own (its cache shared by the variants, to save time)."""

    def __init__(self, tmp: Path):
        self.root = make_project(tmp / "reference")
        self.done: dict[Variant, dict[str, str]] = {}

    def __call__(self, variant: Variant) -> dict[str, str]:
        if variant not in self.done:
            root = self.root
            set_input(root, variant)
            run = optbuild(root, "build", "--no-remote", env={"OPTBUILD_SERVER": "0"})  # the server's judge
            if run.returncode != 0:
                sys.exit(f"reference build failed (the suite cannot judge anything):\n{run.stderr[-3000:]}")
            self.done[variant] = build_digests(root)
        return self.done[variant]


# --- figures -------------------------------------------------------------------------------
@dataclass
class Figures:
    """One category's counts; `notes` keeps the first problems found, to say what failed."""

    name: str
    tries: int = 0
    failed: int = 0  # builds that failed when they should not have
    violations: int = 0  # invariants broken (corrupt cache, torn folder, scratch left, traceback...)
    data_lost: int = 0  # wrong outputs after a build that said it succeeded
    undetectable: int = 0  # wrong outputs no host without the signing key can tell (rewired unsigned)
    seconds: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # full stderr of the first few bad runs

    def keep(self, label: str, run: Run) -> None:
        if len(self.details) < 3:
            self.details.append(f"--- {label}: exit {run.returncode}\n{run.stderr[-2500:].rstrip()}")

    def note(self, what: str) -> None:
        if len(self.notes) < 12:
            self.notes.append(what)
        log(f"    ! {self.name}: {what}")

    def count(self, name: str, n: int = 1) -> None:
        self.extra[name] = self.extra.get(name, 0) + n


QUIET = False
VERBOSE = False  # --verbose: the stderr of the first bad runs of each category


def log(line: str) -> None:
    print(line, file=sys.stderr if QUIET else sys.stdout, flush=True)


def scratch_left(root: Path) -> list[str]:
    """Items in cache/tmp and hidden staging siblings in build/ (none may outlive a build)."""
    left = [f"cache/tmp/{p.name}" for p in (root / "cache" / "tmp").glob("*")] if (root / "cache" / "tmp").is_dir() else []
    for dirpath, dirnames, filenames in os.walk(root / "build"):
        for name in dirnames + filenames:
            if HIDDEN_SIBLING.match(name):
                left.append(str(Path(dirpath, name).relative_to(root)))
    return left


def lock_file_problem(root: Path) -> str | None:
    path = root / "optbuild.lock"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"optbuild.lock does not parse: {exc}"
    return None if isinstance(data, dict) and isinstance(data.get("steps"), dict) else "optbuild.lock has no steps"


def verify_problem(root: Path, env: dict | None = None) -> str | None:
    run = optbuild(root, "cache", "verify", env=env)
    if run.returncode == 0 and "all intact" in run.stdout:
        return None
    text = (run.stdout + run.stderr).strip().splitlines()
    return "cache verify: " + " | ".join(text[:3])[:300]


def failed_run(fig: Figures, label: str, run: Run) -> bool:
    """Whether the build ``run`` failed or printed a traceback (a violation), each counted and
    its output kept."""
    if run.traceback:
        fig.violations += 1
        fig.note(f"{label}: traceback in stderr: {run.tail()}")
    if run.returncode != 0:
        fig.failed += 1
        fig.note(f"{label}: build failed: {run.tail()}")
    if run.traceback or run.returncode != 0:
        fig.keep(label, run)
        return True
    return False


def check_build(fig: Figures, root: Path, expected: dict[str, str], label: str, *,
                env: dict | None = None, args: tuple[str, ...] = (), verify: bool = True) -> Run:
    """A build that must succeed, then every invariant: outputs as the reference, cache
    intact (``verify``: skipped where the next check verifies the same cache anyway, as a
    CLI start costs 0.5 s here), no scratch left, lock file sound, no traceback."""
    run = optbuild(root, "build", *args, env=env)
    if run.returncode is None:
        fig.violations += 1
        fig.note(f"{label}: build still running after {BUILD_TIMEOUT:.0f}s (stale lock?)")
        return run
    if not failed_run(fig, label, run):
        got = build_digests(root)
        if got != expected:
            fig.data_lost += 1
            wrong = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
            fig.note(f"{label}: build said ok but outputs differ from a clean build: {wrong[:4]}")
    if verify and (problem := verify_problem(root, env)):
        fig.violations += 1
        fig.note(f"{label}: {problem}")
    if left := scratch_left(root):
        fig.violations += 1
        fig.note(f"{label}: scratch left after a build: {left[:3]}")
    if problem := lock_file_problem(root):
        fig.violations += 1
        fig.note(f"{label}: {problem}")
    return run


# --- 1. kills ------------------------------------------------------------------------------
class Twin:
    """A second project with the same pipeline, where each build about to be killed first runs
    whole from the same state (inputs, cache, build folder and lock file copied by `cp -a`,
    hard links kept): the reference build whose duration the kill's delay is drawn within, so
    that kills land while the build runs (a guessed duration let 3 of 10 come after it)."""

    STATE = ("data", "cache", "optbuild.lock")  # and build/, emptied and refilled

    def __init__(self, root: Path):
        self.root = root
        self.twin = make_project(root.with_name(root.name + "-twin"))
        self.measure()  # warmed up as ``root`` is (its build server started, where one is on)

    def measure(self) -> float | None:
        """Seconds the build about to run in ``root`` takes, or None when it failed here."""
        for name in self.STATE:
            _remove(self.twin / name)
        present = [str(self.root / name) for name in self.STATE if (self.root / name).exists()]
        subprocess.run(["cp", "-a", "--", *present, str(self.twin)], check=True)
        build, mine = self.twin / "build", self.twin / "build" / ".optbuild" / "server"
        if not (self.root / "build").exists():  # wiped: so is the twin's (its build server stops, as root's)
            _remove(build)
        elif build.is_dir():  # emptied, not removed: a build server stops when its build folder goes
            for item in [*build.glob("*"), *build.glob(".*"), *build.glob(".optbuild/*")]:
                if item not in (build / ".optbuild", mine):
                    _remove(item)
        if (self.root / "build").exists():
            subprocess.run(["cp", "-a", "--", f"{self.root / 'build'}/.", str(build)], check=True)
        # timed as a kill's delay is: from when Popen returns (the process started) to its exit
        proc = subprocess.Popen([sys.executable, "-m", "optbuild", "build", "--no-remote"], cwd=self.twin, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        started = time.perf_counter()
        try:
            code = proc.wait(timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            sigkill(proc)
            return None
        return time.perf_counter() - started if code == 0 else None


def suite_kills(tmp: Path, refs: References, kills: int, rng: random.Random, name: str = "kills") -> Figures:
    fig = Figures(name)
    started = time.perf_counter()
    root = make_project(tmp / "kills")
    first = optbuild(root, "build", "--no-remote")
    if first.returncode != 0:
        fig.failed += 1
        fig.note(f"first build failed: {first.tail()}")
        return fig
    twin = Twin(root)  # where each build about to be killed first runs whole, timed
    current = VARIANTS[0]
    for i in range(kills):
        before = by_step(build_digests(root))
        action = rng.choices(["edit", "drop-entries", "wipe-cache", "wipe-build", "none"], [45, 20, 10, 10, 15])[0]
        if action == "edit":
            current = rng.choice([v for v in VARIANTS if v != current])
            set_input(root, current)
        elif action == "drop-entries":  # as gc would: some steps must build again
            entries = _entries(root)
            for entry in rng.sample(entries, min(len(entries), rng.randint(1, 3))):
                entry.unlink()
        elif action == "wipe-cache":
            shutil.rmtree(root / "cache", ignore_errors=True)
        elif action == "wipe-build":
            shutil.rmtree(root / "build", ignore_errors=True)
        fig.count(f"before kill: {action}")
        whole_group = rng.random() < 0.3
        measured = twin.measure()
        if measured is None:
            fig.count("reference builds that failed (the first build's time used)")
        delay = rng.uniform(0, measured or first.seconds)
        proc = subprocess.Popen([sys.executable, "-m", "optbuild", "build", "--no-remote"], cwd=root, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(delay)
        if proc.poll() is not None:
            fig.count("kill came after the build ended")
        elif whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not whole_group and not _gone(proc.pid, 3.0):
            fig.count("workers alive 3 s after their CLI was killed")
        kill_group(proc.pid)  # then no straggler can write after the checks below
        fig.tries += 1
        label = f"kill {i + 1} ({action}, {'group' if whole_group else 'cli'}, {delay:.2f}s)"
        # straight after the kill: nothing torn may be visible
        after = by_step(build_digests(root))
        new = by_step(refs(current))
        for step, files in after.items():
            if files != before.get(step) and files != new.get(step):
                fig.violations += 1
                fig.note(f"{label}: build/{step} is neither its old nor its new tree (torn)")
        if problem := verify_problem(root):
            fig.violations += 1
            fig.note(f"{label}: after the kill, {problem}")
            optbuild(root, "cache", "verify", "--repair")  # so later kills are judged on their own
        if problem := lock_file_problem(root):
            fig.violations += 1
            fig.note(f"{label}: after the kill, {problem}")
        # the next kill's first check verifies this build's cache; the last one verifies here
        check_build(fig, root, refs(current), label, args=("--no-remote",), verify=i == kills - 1)
        if i % 10 == 9:
            log(f"  kills: {i + 1}/{kills}")
    fig.count("kills that landed mid-build", fig.tries - fig.extra.get("kill came after the build ended", 0))
    fig.seconds = time.perf_counter() - started
    return fig


# --- 2. concurrent builders ----------------------------------------------------------------
def suite_concurrent(tmp: Path, refs: References, builders: int, runs: int, rng: random.Random) -> Figures:
    fig = Figures("concurrent")
    started = time.perf_counter()
    root = make_project(tmp / "concurrent")
    first = optbuild(root, "build", "--no-remote")
    if first.returncode != 0:
        fig.failed += 1
        fig.note(f"first build failed: {first.tail()}")
        return fig
    lock = threading.Lock()
    done = threading.Event()
    seeds = [rng.randrange(1 << 30) for _ in range(builders + 1)]

    def record(run: Run, label: str, intended: tuple[str, ...] = INTENDED) -> None:
        with lock:
            fig.tries += 1
            if run.returncode is None:
                fig.violations += 1
                fig.note(f"{label}: still running after {BUILD_TIMEOUT:.0f}s (deadlock or stale lock?)")
            elif run.returncode != 0:
                if any(text in run.stderr for text in intended):
                    fig.count("intended failures (input edited mid-build)")
                else:
                    fig.failed += 1
                    fig.note(f"{label}: exit {run.returncode}: {run.tail()}")
                    fig.keep(label, run)
            if run.traceback:
                fig.violations += 1
                fig.note(f"{label}: traceback in stderr: {run.tail()}")
                fig.keep(label, run)

    def builder(index: int) -> None:
        mine = random.Random(seeds[index])
        for r in range(runs):
            if mine.random() < 0.4:
                set_input(root, mine.choice(VARIANTS))
                with lock:
                    fig.count("input edits")
            record(optbuild(root, "build", "--no-remote"), f"builder {index} run {r + 1}")

    def collector() -> None:
        mine = random.Random(seeds[-1])
        while not done.wait(mine.uniform(0.3, 1.5)):
            extra = ("--include-locked",) if mine.random() < 0.3 else ()
            run = optbuild(root, "cache", "gc", "--max-size", "4MB", *extra)
            with lock:
                fig.count("gc runs beside the builders")
                if run.returncode != 0 or run.traceback:
                    fig.failed += 1
                    fig.note(f"gc {' '.join(extra)}: exit {run.returncode}: {run.tail()}")

    threads = [threading.Thread(target=builder, args=(i,)) for i in range(builders)]
    gc_thread = threading.Thread(target=collector)
    for thread in [*threads, gc_thread]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    gc_thread.join()
    # every variant once more, alone: an entry poisoned by a race would be served now
    for n, variant in enumerate(VARIANTS):
        set_input(root, variant)
        check_build(fig, root, refs(variant), f"after the race, variant {n}", args=("--no-remote",),
                    verify=n in (0, len(VARIANTS) - 1))
    fig.seconds = time.perf_counter() - started
    return fig


# --- 3. corruptions ------------------------------------------------------------------------
def _writable(path: Path) -> None:
    os.chmod(path, 0o644)


def _entries(root: Path) -> list[Path]:
    return sorted((root / "cache" / "ac").glob("*/*.json"))


def _needed(root: Path) -> tuple[list[Path], list[Path]]:
    """Entries and blobs the next build of an unchanged project reads (from optbuild.lock)."""
    entries, blobs = [], set()
    for record in json.loads((root / "optbuild.lock").read_text())["steps"].values():
        key = record["key"]
        path = root / "cache" / "ac" / key[:2] / f"{key[2:]}.json"
        entries.append(path)
        data = json.loads(path.read_text())
        digests = {o["digest"] for o in data["outputs"].values()} | ({data["log"]} if data.get("log") else set())
        blobs |= {root / "cache" / "cas" / d[:2] / d[2:] for d in digests}
    return sorted(entries), sorted(b for b in blobs if b.exists())


def corrupt_blob_flip(root: Path, rng: random.Random) -> str:
    blob = rng.choice([b for b in _needed(root)[1] if b.stat().st_size > 0])
    _writable(blob)
    size = blob.stat().st_size
    with open(blob, "r+b") as f:
        for _ in range(3):
            pos = rng.randrange(size)
            f.seek(pos)
            byte = f.read(1)
            f.seek(pos)
            f.write(bytes([byte[0] ^ 0xFF]))
    return f"flipped 3 bytes of a {size}-byte blob"


def corrupt_blob_truncate(root: Path, rng: random.Random) -> str:
    blob = rng.choice([b for b in _needed(root)[1] if b.stat().st_size > 1])
    _writable(blob)
    size = blob.stat().st_size
    os.truncate(blob, size // 2)
    return f"truncated a {size}-byte blob to {size // 2}"


def corrupt_blob_delete(root: Path, rng: random.Random) -> str:
    blob = rng.choice(_needed(root)[1])
    blob.unlink()
    return "deleted a blob"


def corrupt_entry(root: Path, rng: random.Random) -> str:
    entry = rng.choice(_needed(root)[0])
    _writable(entry)
    how = rng.choice(["garbage", "half", "empty", "wrong-shape", "wrong-digest"])
    text = entry.read_bytes()
    if how == "garbage":
        entry.write_bytes(os.urandom(200))
    elif how == "half":
        entry.write_bytes(text[: len(text) // 2])
    elif how == "empty":
        entry.write_bytes(b"")
    elif how == "wrong-shape":
        entry.write_text(json.dumps({"outputs": [1, 2, 3], "key": 7}))
    else:
        data = json.loads(text)
        for out in data.get("outputs", {}).values():
            out["digest"] = "0" * 64
        entry.write_text(json.dumps(data))
    return f"entry: {how}"


def corrupt_statcache_garbage(root: Path, rng: random.Random) -> str:
    db = root / "cache" / "statcache.sqlite"
    db.write_bytes(os.urandom(8192))
    for side in ("-wal", "-shm"):
        db.with_name(db.name + side).unlink(missing_ok=True)
    return "statcache.sqlite overwritten with garbage"


def corrupt_statcache_page(root: Path, rng: random.Random) -> str:
    db = root / "cache" / "statcache.sqlite"
    size = db.stat().st_size
    pages = max(size // 4096, 1)
    page = rng.randrange(1, pages) if pages > 1 else 0
    with open(db, "r+b") as f:
        f.seek(page * 4096 + (100 if page == 0 else 0))
        f.write(os.urandom(512))
    return f"statcache.sqlite: page {page} of {pages} damaged"


def corrupt_statcache_wal(root: Path, rng: random.Random) -> str:
    db = root / "cache" / "statcache.sqlite"
    db.with_name(db.name + "-wal").write_bytes(os.urandom(4096))
    return "statcache.sqlite-wal garbage"


def corrupt_lock_file(root: Path, rng: random.Random) -> str:
    path = root / "optbuild.lock"
    how = rng.choice(["garbage", "half", "wrong-types"])
    text = path.read_bytes() if path.exists() else b"{}"
    if how == "garbage":
        path.write_bytes(os.urandom(300))
    elif how == "half":
        path.write_bytes(text[: len(text) // 2])
    else:
        path.write_text(json.dumps({"format": 1, "steps": {"faults:a": 5, "faults:b": {"key": ["x"],
                                                            "ingredients": "y"}}}))
    return f"optbuild.lock: {how}"


def corrupt_lock_dir(root: Path, rng: random.Random) -> str:
    locks = sorted((root / "cache" / "locks").glob("*")) if (root / "cache" / "locks").is_dir() else []
    for path in locks:
        if path.is_file():
            path.write_bytes(os.urandom(64))
    return f"{len(locks)} files in cache/locks garbled"


CORRUPTIONS: dict[str, Callable[[Path, random.Random], str]] = {
    "blob-flip": corrupt_blob_flip,
    "blob-truncate": corrupt_blob_truncate,
    "blob-delete": corrupt_blob_delete,
    "entry": corrupt_entry,
    "statcache-garbage": corrupt_statcache_garbage,
    "statcache-page": corrupt_statcache_page,
    "statcache-wal": corrupt_statcache_wal,
    "lock-file": corrupt_lock_file,
    "cache-locks": corrupt_lock_dir,
}


def suite_corruptions(tmp: Path, refs: References, rounds: int, rng: random.Random,
                      kinds: list[str]) -> Figures:
    fig = Figures("corruptions")
    started = time.perf_counter()
    root = make_project(tmp / "corruptions")
    first = optbuild(root, "build", "--no-remote")
    if first.returncode != 0:
        fig.failed += 1
        fig.note(f"first build failed: {first.tail()}")
        return fig
    for r in range(rounds):
        current = VARIANTS[r % len(VARIANTS)]
        set_input(root, current)
        optbuild(root, "build", "--no-remote")
        for name in kinds:
            # the item damaged is one the next build reads: it must notice, not serve it
            try:
                what = CORRUPTIONS[name](root, rng)
            except (OSError, ValueError, IndexError, KeyError) as exc:
                fig.note(f"{name}: could not corrupt ({exc!r}); skipped")
                continue
            fig.tries += 1
            run = check_build(fig, root, refs(current), f"{name} ({what})", args=("--no-remote",))
            if run.returncode != 0:
                optbuild(root, "cache", "verify", "--repair")  # each case on a sound cache
                optbuild(root, "build", "--no-remote")
    fig.seconds = time.perf_counter() - started
    return fig


# --- 4. hostile remote ---------------------------------------------------------------------
def _remote_toml(url: str, signed: bool) -> str:
    text = f'[remote]\nurl = "{url}"\ntimeout_s = 10\nmax_errors = 1000\n'
    return text + (f'signing_key_env = "{SIGNING_ENV}"\n' if signed else "")


def entry_path(remote: Path, key: str) -> Path:
    return remote / "ac" / key[:2] / f"{key[2:]}.json"


def blob_path(remote: Path, digest: str) -> Path:
    return remote / "cas" / digest[:2] / digest[2:]


def put(path: Path, data: bytes) -> None:
    """Overwrite a remote file, read-only or not (as a hostile writer with access would)."""
    with suppress(OSError):
        os.chmod(path, 0o644)
    path.write_bytes(data)


def _split(data: bytes) -> tuple[bytes, bytes]:
    """(signature line with its newline, or b"", JSON body) of a remote entry."""
    if data.startswith(b"optbuild-hmac-sha256 "):
        line, _, body = data.partition(b"\n")
        return line + b"\n", body
    return b"", data


def _sign(body: bytes, key: str) -> bytes:
    import hmac

    return b"optbuild-hmac-sha256 " + hmac.new(key.encode(), body, hashlib.sha256).hexdigest().encode() + b"\n" + body


def _replant(original: bytes, data: dict, signed: bool) -> bytes:
    """An entry's JSON rewritten and, on a signed remote, signed with the right key: only
    the content rules can reject it, not the signature."""
    body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return _sign(body, SIGNING_KEY) if signed else body


Hostile = Callable[[Path, str, bytes, dict, bool], str]


def h_deep(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    deep = b"[" * 200_000 + b"]" * 200_000
    put(entry_path(remote, key), _sign(deep, SIGNING_KEY) if signed else deep)
    return "200,000-deep JSON"


def h_deep_inside(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    body = json.dumps({**data, "metrics": {}}, separators=(",", ":")).encode()
    body = body.replace(b'"metrics":{}', b'"metrics":' + b'{"x":' * 50_000 + b"1" + b"}" * 50_000)
    put(entry_path(remote, key), _sign(body, SIGNING_KEY) if signed else body)
    return "entry with 50,000-deep metrics"


def h_huge(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    big = {**data, "metrics": {"pad": "x" * (40 << 20)}}
    put(entry_path(remote, key), _replant(original, big, signed))
    return "40 MB entry"


def h_long_name(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    out = next(iter(data["outputs"].values()))
    planted = {**data, "outputs": {**data["outputs"], "n" * 300: out}}
    put(entry_path(remote, key), _replant(original, planted, signed))
    return "output name of 300 bytes"


def h_dotdot(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    out = next(iter(data["outputs"].values()))
    planted = {**data, "outputs": {**data["outputs"], "../../../../ESCAPED-dotdot.txt": out,
                                   "sub/../../../../../ESCAPED-mid.txt": out}}
    put(entry_path(remote, key), _replant(original, planted, signed))
    return "'../' output names (4 and 5 levels up)"


def h_absolute(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    out = next(iter(data["outputs"].values()))
    target = remote.parent / "ESCAPED-absolute.txt"
    planted = {**data, "outputs": {**data["outputs"], str(target): out}}
    put(entry_path(remote, key), _replant(original, planted, signed))
    return "absolute output name"


def h_clash(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    name, out = next(iter(data["outputs"].items()))
    planted = {**data, "outputs": {**data["outputs"], f"{name}/inside": out}}
    put(entry_path(remote, key), _replant(original, planted, signed))
    return "an output both a file and a folder"


def h_bad_digest(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    outputs = {n: {**o, "digest": "Z" * 64} for n, o in data["outputs"].items()}
    put(entry_path(remote, key), _replant(original, {**data, "outputs": outputs}, signed))
    return "digests that are not hex"


def h_absent_digest(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    outputs = {n: {**o, "digest": hashlib.sha256(n.encode()).hexdigest()} for n, o in data["outputs"].items()}
    put(entry_path(remote, key), _replant(original, {**data, "outputs": outputs}, signed))
    return "digests of blobs the remote lacks"


def h_wrong_key(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    put(entry_path(remote, key), _replant(original, {**data, "key": "f" * 64}, signed))
    return "entry filed under another key"


def h_wrong_size(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    outputs = {n: {**o, "size": o["size"] + 7} for n, o in data["outputs"].items()}
    put(entry_path(remote, key), _replant(original, {**data, "outputs": outputs}, signed))
    return "sizes that do not match the blobs"


def h_blob_bytes(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    out = max(data["outputs"].values(), key=lambda o: o["size"])
    path = blob_path(remote, out["digest"])
    payload = bytearray(path.read_bytes())
    for i in range(0, len(payload), max(len(payload) // 5, 1)):
        payload[i] ^= 0x55
    put(path, bytes(payload))
    return f"blob of {out['size']} bytes with flipped bytes, size kept"


def h_blob_other(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    out = max(data["outputs"].values(), key=lambda o: o["size"])
    path = blob_path(remote, out["digest"])
    put(path, b"not the blob" * 10)
    return "blob replaced by other bytes of another size"


def h_unsigned(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    put(entry_path(remote, key), _split(original)[1])
    return "signature line removed"


def h_other_key(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    put(entry_path(remote, key), _sign(_split(original)[1], "not-the-key"))
    return "signed with another key"


def h_tampered(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    line, _body = _split(original)
    outputs = {n: {**o, "size": o["size"] + 1} for n, o in data["outputs"].items()}
    put(entry_path(remote, key), line + json.dumps({**data, "outputs": outputs}).encode())
    return "body altered under a valid signature line"


def h_bad_line(remote: Path, key: str, original: bytes, data: dict, signed: bool) -> str:
    put(entry_path(remote, key), b"optbuild-hmac-sha256 " + b"\xff" * 70 + b"\n" + _split(original)[1])
    return "signature line of garbage bytes"


HOSTILE_PLAIN: dict[str, Hostile] = {
    "deep-json": h_deep, "deep-metrics": h_deep_inside, "huge": h_huge, "name>255": h_long_name,
    "dotdot": h_dotdot, "absolute": h_absolute, "file/folder clash": h_clash,
    "bad digest": h_bad_digest, "absent blob": h_absent_digest, "wrong key": h_wrong_key,
    "wrong size": h_wrong_size, "blob bytes": h_blob_bytes, "blob replaced": h_blob_other,
}
HOSTILE_SIGNED: dict[str, Hostile] = {
    "unsigned": h_unsigned, "wrong signing key": h_other_key, "tampered body": h_tampered,
    "garbage signature": h_bad_line, "signed dotdot": h_dotdot, "signed deep-json": h_deep,
}


def snapshot(top: Path, skip: list[Path]) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under ``top`` outside ``skip``; folders by existence
    (their mtimes move when build/ and cache/ appear) and __pycache__ (Python's) left out."""
    found: dict[str, tuple[int, int]] = {}
    skipped = {p.resolve() for p in skip}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and (here / d).resolve() not in skipped]
        for name in dirnames:
            found[str((here / name).relative_to(top)) + "/"] = (0, 0)
        for name in filenames:
            path = here / name
            if path.resolve() in skipped:
                continue
            with suppress(OSError):
                st = path.lstat()
                found[str(path.relative_to(top))] = (st.st_size, st.st_mtime_ns)
    return found


def suite_hostile(tmp: Path, refs: References, rounds: int, rng: random.Random, kinds: list[str]) -> Figures:
    fig = Figures("hostile remote")
    started = time.perf_counter()
    top = tmp / "hostile"
    top.mkdir()
    expected = refs(VARIANTS[0])
    env = {SIGNING_ENV: SIGNING_KEY}
    victims = 0
    for signed, cases in ((False, HOSTILE_PLAIN), (True, HOSTILE_SIGNED)):
        remote = top / ("remote-signed" if signed else "remote-plain")
        remote.mkdir()
        toml = _remote_toml(remote.as_uri(), signed)
        origin = make_project(top / f"origin-{'signed' if signed else 'plain'}", remote=toml)
        run = optbuild(origin, "build", env=env)
        keys = {sid: rec["key"] for sid, rec in json.loads((origin / "optbuild.lock").read_text())["steps"].items()}
        if run.returncode != 0 or not entry_path(remote, keys.get("faults:big1", "00")).exists():
            fig.failed += 1
            fig.note(f"origin build {'signed' if signed else 'plain'} did not push: {run.tail()}")
            continue
        for _ in range(rounds):
            for name, plant in cases.items():
                if name not in kinds:
                    continue
                sid = rng.choice(sorted(keys))
                key = keys[sid]
                path = entry_path(remote, key)
                original = path.read_bytes()
                data = json.loads(_split(original)[1])
                blobs = {d: blob_path(remote, d).read_bytes() for d in
                         {o["digest"] for o in data["outputs"].values()} if blob_path(remote, d).exists()}
                victims += 1
                victim = make_project(top / f"victim-{victims}", remote=toml)
                skip = [victim / "build", victim / "cache", victim / "optbuild.lock",
                        top / "remote-signed", top / "remote-plain"]
                what = plant(remote, key, original, data, signed)
                fig.tries += 1
                before = snapshot(tmp, skip)
                run = check_build(fig, victim, expected, f"{name} on {sid} ({what})", env=env)
                if "warning" in run.stderr.lower():
                    fig.count("hostile item noticed (a warning)")
                else:  # served as if sound, or never looked at: the case proved nothing
                    fig.count("hostile item passed without a warning")
                    fig.note(f"{name} on {sid}: no warning; stderr: {run.stderr.strip()[-300:]!r}")
                after = snapshot(tmp, skip)
                if changed := sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)):
                    fig.violations += 1
                    fig.data_lost += any("ESCAPED" in c for c in changed)
                    fig.note(f"{name}: written outside build/ and cache/: {changed[:4]}")
                for digest, content in blobs.items():  # put the remote back for the next case
                    put(blob_path(remote, digest), content)
                put(path, original)
                shutil.rmtree(victim, ignore_errors=True)
    fig.seconds = time.perf_counter() - started
    return fig


# --- 5. stale bytecode ----------------------------------------------------------------------
BYTECODE_RECIPE = """\
[steps.export]
kind = "export"
model = "m/model.py:build"
"""
BYTECODE_MODEL = """\
import torch
from helper import SCALE


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * SCALE


def build():
    return Scale(), (torch.ones(1, 2),)
"""


def compile_to_pycache(folder: Path, module: str) -> None:
    """Import ``module`` in another interpreter that writes bytecode, as a test run or a
    REPL in the project would: its .pyc records the source's whole-second mtime and size."""
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=folder, env=ENV, check=True,
                   capture_output=True, timeout=60)


def saved_in_a_new_second(path: Path) -> None:
    """Move the file's mtime one whole second on, as a save after its last import would: the
    next import compiles it again (without this, the .pyc of an earlier try stays current)."""
    st = path.stat()
    later = (st.st_mtime_ns // 10**9 + 1) * 10**9 + st.st_mtime_ns % 10**9
    os.utime(path, ns=(st.st_atime_ns, later))


def edit_within_the_same_second(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (same length), the mtime set back: to CPython's .pyc check
    the file did not change (only its ctime tells)."""
    assert len(old) == len(new)
    st = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def exported_scale(model: Path) -> float:
    """What the exported model multiplies by: its output for an input of ones."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: np.ones((1, 2), np.float32)})
    return float(out.ravel()[0])


def suite_bytecode(tmp: Path, edits: int, rng: random.Random, name: str = "stale bytecode") -> Figures:
    fig = Figures(name)
    started = time.perf_counter()
    root = tmp / "bytecode"
    helper = root / "recipes" / "m" / "helper.py"
    helper.parent.mkdir(parents=True)
    (root / "optbuild.toml").write_text('[project]\nrecipes = ["recipes/*.toml"]\n')
    (root / "recipes" / "m.toml").write_text(BYTECODE_RECIPE)
    (helper.parent / "model.py").write_text(BYTECODE_MODEL)
    # every edit a value never built before (so the step must run), exact in float32
    values = rng.sample([f"{whole}.{part}" for whole in range(10, 100) for part in ("25", "75")], edits + 1)
    helper.write_text(f"SCALE = {values[0]}\n")
    first = optbuild(root, "build")
    if first.returncode != 0:
        fig.failed += 1
        fig.note(f"first build failed: {first.tail()}")
        fig.keep("first build", first)
        return fig
    for old, new in pairwise(values):
        saved_in_a_new_second(helper)
        compile_to_pycache(helper.parent, "helper")
        edit_within_the_same_second(helper, old, new)
        fig.tries += 1
        label = f"SCALE {old} -> {new}"
        run = optbuild(root, "build")
        if failed_run(fig, label, run):
            continue
        got = exported_scale(root / "build" / "m" / "export" / "model.onnx")
        if got != float(new):
            fig.data_lost += 1
            stale = " (the value before the edit: the stale .pyc ran)" if got == float(old) else ""
            fig.note(f"{label}: build said ok, the model computes x * {got:g}{stale}")
    fig.seconds = time.perf_counter() - started
    return fig


# --- 6. forged Dask tasks -------------------------------------------------------------------
FORGED_BYTES = b"forged by the fault suite"


def _lock_keys(root: Path) -> dict[str, str]:
    return {sid: rec["key"] for sid, rec in json.loads((root / "optbuild.lock").read_text())["steps"].items()}


def _forged_tasks(root: Path, remote: Path, keys: dict[str, str], rng: random.Random, count: int) -> list[Forged]:
    """``count`` forged tasks, every forgery in turn, each on a step it applies to, made from
    the honest build's remote entries. The attacker's bytes are put in the remote first, so
    that only the node's own checks stand between them and a signed entry."""
    from optbuild.common.digest import digest_bytes

    digest = digest_bytes(FORGED_BYTES)
    blob_path(remote, digest).parent.mkdir(parents=True, exist_ok=True)
    put(blob_path(remote, digest), FORGED_BYTES)
    entries = {sid: json.loads(_split(entry_path(remote, key).read_bytes())[1]) for sid, key in keys.items()}
    deps = deps_of(PIPELINE, "faults")
    forgeries = list(FORGERIES.items())
    tasks: list[Forged] = []
    while len(tasks) < count:
        name, forge = forgeries[len(tasks) % len(forgeries)]
        for sid in rng.sample(sorted(keys), len(keys)):
            entry = entries[sid]
            honest = honest_task(entry, entries, deps[sid], root, remote.as_uri())
            if forged := forge(honest, digest, len(FORGED_BYTES)):
                tasks.append(Forged(forged.task, f"{name} on {sid}: {forged.what}", forged.because))
                break
        else:
            raise RuntimeError(f"the forgery {name!r} applies to no step of the pipeline")
    return tasks


def _judge_answer(fig: Figures, forged: Forged, answer: dict) -> bool:
    """Whether the node built and stored the forged task (data lost). A task that failed
    unrefused (the node ran it, or failed to fetch) is a violation, and a refusal for another
    reason than the forgery is noted: those tries proved less than they meant to."""
    error = str(answer.get("error", ""))
    if answer.get("ok"):
        fig.note(f"{forged.what}: the node built it and stored a signed entry")
        return True
    if not error.startswith("refused:"):
        fig.violations += 1
        fig.note(f"{forged.what}: not refused, it failed: {error[:200]}")
        return False
    if forged.because in error:
        fig.count("refused, naming the forgery")
    else:
        fig.count("refused for another reason")
        fig.note(f"{forged.what}: refused, but not for the forgery: {error[:200]}")
    return False


def suite_dask_forged(tmp: Path, refs: References, tries: int, rng: random.Random) -> Figures:
    fig = Figures("dask-forged")
    started = time.perf_counter()
    top = tmp / "dask"
    remote = top / "remote"
    remote.mkdir(parents=True)
    farm = start_farm(top / "farm", remote.as_uri(), 2, ENV, {"OPTBUILD_SIGNING_KEY": SIGNING_KEY})
    try:
        _forge(fig, top, remote, farm, refs, tries, rng)
    finally:
        farm.stop()
    fig.seconds = time.perf_counter() - started
    return fig


def _forge(fig: Figures, top: Path, remote: Path, farm: Farm, refs: References, tries: int,
           rng: random.Random) -> None:
    """An honest signed build on the farm, then each forged task straight to the scheduler,
    judged by the node's answer, the remote (byte for byte as the honest build left it) and
    what a key holder with an empty cache restores from it."""
    env = {SIGNING_ENV: SIGNING_KEY}
    expected = refs(VARIANTS[0])
    origin = make_project(top / "origin", remote=f'executor = "dask"\nscheduler = "{farm.address}"\n'
                          + _remote_toml(remote.as_uri(), True))
    run = optbuild(origin, "build", "--download", "all", env=env)  # every output here, to compare
    if run.returncode != 0 or build_digests(origin) != expected:
        fig.failed += 1
        fig.note(f"the honest build on the farm failed or differs from a local one: {run.tail()}")
        fig.keep("honest build", run)
        return
    keys = _lock_keys(origin)
    tasks = _forged_tasks(origin, remote, keys, rng, tries)
    honest = top / "remote-honest"
    shutil.copytree(remote, honest)
    for n, forged in enumerate(tasks):
        fig.tries += 1
        before = snapshot(remote, [])
        lost = _judge_answer(fig, forged, send(farm, forged.task))
        after = snapshot(remote, [])
        if changed := sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)):
            lost = True
            fig.note(f"{forged.what}: the remote changed: {changed[:4]}")
        holder = make_project(top / f"holder-{n}", remote=_remote_toml(remote.as_uri(), True))
        lost_before = fig.data_lost
        check_build(fig, holder, expected, f"key holder after {forged.what}", env=env, verify=False)
        fig.data_lost = lost_before + (lost or fig.data_lost > lost_before)
        shutil.rmtree(holder, ignore_errors=True)
        if changed:  # the next try starts from the honest remote
            shutil.rmtree(remote)
            shutil.copytree(honest, remote)


# --- 7. rewired unsigned entries ------------------------------------------------------------
def _rewire(remote: Path, key: str, rng: random.Random, resize: bool) -> tuple[str, str, Path]:
    """Point one output of the entry ``key`` at another blob of the remote; ``resize``: its
    size made to match, so that the entry names an intact blob, only not its own (on an
    unsigned remote nothing says so), else the size it recorded kept (a blob of another size).
    Returns what was done, the output's name and the blob it now names."""
    path = entry_path(remote, key)
    raw = path.read_bytes()
    signature, body = raw.split(b"\n", 1) if raw.startswith(b"optbuild-hmac-sha256 ") else (None, raw)
    data = json.loads(body)
    name = rng.choice(sorted(data["outputs"]))
    own = data["outputs"][name]
    blob = rng.choice(sorted(p for p in (remote / "cas").glob("*/*") if p.parent.name + p.name != own["digest"]))
    size = blob.stat().st_size
    data["outputs"][name] = {**own, "digest": blob.parent.name + blob.name, "size": size if resize else own["size"]}
    put(path, (signature + b"\n" if signature else b"") + json.dumps(data).encode())  # its signature kept
    what = f"{name} rewired to a blob of {size} bytes, " + ("its size too" if resize else f"size {own['size']} kept")
    return what, name, blob


def _audit_said_intact(fig: Figures, root: Path, label: str, env: dict | None) -> None:
    """`cache audit` against the remote must not call a rewired remote intact."""
    audit = optbuild(root, "cache", "audit", env=env)
    if audit.returncode == 0 and "all intact" in audit.stdout:
        fig.violations += 1
        fig.note(f"{label}: cache audit says all intact")
    if "(identical outputs, or a rewired entry)" in audit.stdout:
        fig.count("audit noted a blob several steps name")


def _downstream(step: str) -> set[str]:
    """``step`` and every step of PIPELINE built from it, directly or not."""
    deps = deps_of(PIPELINE, "faults")
    found = {step}
    while more := {sid for sid, ups in deps.items() if sid not in found and found & set(ups.values())}:
        found |= more
    return found


def _served_the_rewired_blob(root: Path, step: str, output: str, blob: Path, expected: dict[str, str]) -> bool:
    """Whether the build's only departures from a clean build are the rewired output, holding
    exactly the blob its entry was pointed at, and what steps downstream built from it: the
    wrong output an unsigned entry cannot be caught serving. Anything else stays data lost."""
    got = build_digests(root)
    wrong = {k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k)}
    rewired = f"{step.replace(':', '/')}/{output}"
    later = {s.replace(":", "/") + "/" for s in _downstream(step) - {step}}
    return (rewired in wrong and (root / "build" / rewired).read_bytes() == blob.read_bytes()
            and all(k == rewired or k.startswith(tuple(later)) for k in wrong))


def suite_rewired(tmp: Path, refs: References, tries: int, rng: random.Random, signed: bool) -> Figures:
    fig = Figures(f"rewired {'signed' if signed else 'unsigned'}")
    started = time.perf_counter()
    top = tmp / f"rewired-{'signed' if signed else 'unsigned'}"
    remote = top / "remote"
    remote.mkdir(parents=True)
    toml, env = _remote_toml(remote.as_uri(), signed), {SIGNING_ENV: SIGNING_KEY} if signed else None
    origin = make_project(top / "origin", remote=toml)
    first = optbuild(origin, "build", env=env)
    keys = _lock_keys(origin) if first.returncode == 0 else {}
    set_input(origin, VARIANTS[2])  # another build's blobs, to rewire entries to
    if first.returncode != 0 or optbuild(origin, "build", env=env).returncode != 0:
        fig.failed += 1
        fig.note(f"the builds that fill the remote failed: {first.tail()}")
        return fig
    expected = refs(VARIANTS[0])
    order = rng.sample(sorted(keys), len(keys))
    for n in range(tries):
        sid = order[n % len(order)]
        original = entry_path(remote, keys[sid]).read_bytes()
        resize = n % 2 == 0
        what, output, blob = _rewire(remote, keys[sid], rng, resize=resize)
        label = f"{sid}: {what}"
        fig.tries += 1
        fresh = make_project(top / f"fresh-{n}", remote=toml)
        lost_before = fig.data_lost
        _audit_said_intact(fig, fresh, label, env)
        check_build(fig, fresh, expected, label, env=env, verify=False)
        if (resize and not signed and fig.data_lost > lost_before
                and _served_the_rewired_blob(fresh, sid, output, blob, expected)):
            fig.data_lost = lost_before  # counted in a column of its own: no host without a key can tell
            fig.undetectable += 1
            fig.note(f"{label}: restored as the blob it names (wrong, undetectable without signing)")
        put(entry_path(remote, keys[sid]), original)
        shutil.rmtree(fresh, ignore_errors=True)
    fig.seconds = time.perf_counter() - started
    return fig


# --- 8. the build server on -----------------------------------------------------------------
def with_server(tmp: Path, body: Callable[[Path], Figures]) -> Figures:
    """``body`` run in a folder of its own with the build server on (OPTBUILD_SERVER=1), then
    `optbuild server stop` in each of its projects (a server idles 15 minutes otherwise). The
    builds the servers ran are counted (those of the last server of each project: wiping
    build/ starts another): none would mean the category never used one."""
    folder = Path(tempfile.mkdtemp(dir=tmp, prefix="server-"))
    ENV["OPTBUILD_SERVER"] = "1"
    try:
        fig = body(folder)
    finally:
        ENV["OPTBUILD_SERVER"] = "0"
        served = sum(_stop_server(config.parent) for config in sorted(folder.glob("*/optbuild.toml")))
    fig.count("builds the last build servers ran", served)
    return fig


def _stop_server(root: Path) -> int:
    """Stop the project's build server (if one runs); how many builds it ran."""
    status = optbuild(root, "server", "status", "--json", timeout=60)
    try:
        builds = int(json.loads(status.stdout).get("builds") or 0)
    except (ValueError, AttributeError, TypeError):
        builds = 0
    optbuild(root, "server", "stop", timeout=60)
    return builds


def leftovers() -> list[int]:
    """Processes this run started that still live (build servers, fork servers, Dask nodes):
    every one inherits RUN_MARKER in its environment."""
    mine = f"{RUN_MARKER}={ENV[RUN_MARKER]}".encode() + b"\0"
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with suppress(OSError):
            if int(proc.name) != os.getpid() and mine in (proc / "environ").read_bytes():
                found.append(int(proc.name))
    return found


def reap() -> None:
    """SIGKILL, by pid, what this run left running (nothing, when all went well)."""
    if pids := leftovers():
        log(f"killing {len(pids)} processes this run left running: {pids}")
        for pid in pids:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# --- 9. clean -------------------------------------------------------------------------------
WORK_RECIPE = '[steps.note]\nkind = "text"\npath = "../data/extra.txt"\n'
STEPS = ("src", "side", "a", "big1", "big2", "c")
Planted = dict[str, str]  # path under the project -> sha256 of the user's bytes there


def clean_project(root: Path) -> Path:
    """The fault pipeline plus a recipe `Work` (the name of a user's folder in issue 30), its
    cache shared by every try's project beside it (so that builds restore, in a second)."""
    make_project(root, cache_dir="../cache")
    toml = root / "optbuild.toml"
    toml.write_text(toml.read_text().replace("[project]\n", "[project]\nallow_outside = true\n", 1))
    (root / "recipes" / "Work.toml").write_text(WORK_RECIPE)
    return root


def _put_foreign(root: Path, planted: Planted, rel: str, rng: random.Random) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"{rel}: a user's own words, {rng.randrange(1 << 30)}\n"
    path.write_text(text)
    planted[rel] = hashlib.sha256(text.encode()).hexdigest()


def _craft_lock(root: Path) -> None:
    """optbuild.lock names steps whose folders are a user's (issue 30: `Documents:x`, `.ssh:y`)."""
    path = root / "optbuild.lock"
    data = json.loads(path.read_text())
    record = next(iter(data["steps"].values()))
    data["steps"].update({"Documents:x": record, ".ssh:y": record})
    path.write_text(json.dumps(data))


USER_NAMES = ("notes.txt", "results.csv", ".draft.swp", ".optbuild-folder")  # the last: optbuild's marker's name
FOREIGN: dict[str, Callable[[random.Random], list[str]]] = {
    "in a step folder": lambda rng: [f"build/faults/{rng.choice(STEPS)}/{rng.choice(USER_NAMES)}"],
    "in a nested output folder": lambda rng: ["build/faults/c/sub/mine.txt"],
    "in a recipe folder": lambda rng: [f"build/{rng.choice(['faults', 'Work'])}/README.md"],
    "named like an output": lambda rng: ["build/faults/retired/data.txt", "build/faults/retired/blob.bin",
                                         "build/.logs/faults/big1.log"],
    "in a folder named like a recipe": lambda rng: ["build/Work/thesis.txt", "build/Work/Drafts/ch1.txt"],
    "in folders the lock names": lambda rng: ["build/.ssh/id_rsa", "build/Documents/x/letter.txt"],
    "under .logs": lambda rng: ["build/.logs/mine.txt"],
    "around the build folder": lambda rng: ["notes.txt", "faults/a/data.txt", ".optbuild/keep.txt",
                                            "build.bak/data.txt"],
}
SEQUENCES = [("clean",), ("build", "clean"), ("kill-clean", "clean"), ("build", "kill-clean", "clean"),
             ("clean", "build", "clean")]


def foreign_changed(root: Path, planted: Planted) -> list[str]:
    """The planted files that are gone or no longer hold the user's bytes."""
    def sha(path: Path) -> str | None:
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None
    return sorted(rel for rel, digest in planted.items() if sha(root / rel) != digest)


def left_after_clean(root: Path, planted: Planted) -> tuple[list[str], int]:
    """What optbuild wrote that a finished clean left under build/: (items whose folder holds
    no foreign file, which clean should have removed; files kept in folders that do)."""
    build = root / "build"
    foreign = {root / rel for rel in planted}
    holders = {parent for path in foreign for parent in path.parents}
    left, beside = [], 0
    for dirpath, dirnames, filenames in os.walk(build):
        here = Path(dirpath)
        for name in filenames:
            if here / name in foreign:
                continue
            if here in holders:
                beside += 1
            else:
                left.append((here / name).relative_to(root).as_posix())
        if not dirnames and not filenames and here not in holders:
            left.append(here.relative_to(root).as_posix() + "/")
    return left, beside


def _clean_step(fig: Figures, root: Path, planted: Planted, step: str, label: str, clean_s: float,
                rng: random.Random, adopted: bool) -> Run | None:
    """One command of a try (a build, a clean, or a clean SIGKILLed within its measured
    time); its failures judged: a refusal that names a foreign item is what is meant."""
    if step == "kill-clean":
        proc = subprocess.Popen([sys.executable, "-m", "optbuild", "clean"], cwd=root, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0, clean_s))
        fig.count("kills that landed mid-clean" if proc.poll() is None else "kills that came after the clean ended")
        sigkill(proc)
        return None
    if step == "build":
        set_input(root, rng.choice(VARIANTS))
    run = optbuild(root, step, *(("--no-remote",) if step == "build" else ()))
    said = run.stdout + run.stderr
    named = any(rel in said for rel in planted) or (adopted and str(root / "build") in said)
    if run.returncode not in (0, None) and not run.traceback and named and (step == "build" or adopted):
        fig.count(f"{step}s refused, naming a foreign item")
    elif step == "build" and adopted and run.returncode == 0:
        fig.violations += 1
        fig.note(f"{label}: the build adopted a non-empty build folder it did not make")
    else:
        failed_run(fig, f"{label}: {step}", run)
    return run


def _clean_try(fig: Figures, root: Path, rng: random.Random, clean_s: float, n: int) -> None:
    """Plant foreign files, run a sequence of builds and cleans, and check after each command
    that none was deleted or changed, and after the last clean that nothing optbuild wrote
    is left but beside them."""
    planted: Planted = {}
    adopted = rng.random() < 0.2  # a build folder the user made, before optbuild ever ran
    if adopted:
        kinds = ["a build folder optbuild did not make"]
        for rel in ("build/Work/thesis.txt", "build/faults/notes.txt"):
            _put_foreign(root, planted, rel, rng)
    else:
        first = optbuild(root, "build", "--no-remote")
        if failed_run(fig, f"try {n}: first build", first):
            return
        kinds = rng.sample(sorted(FOREIGN), rng.randint(1, 4))
        for kind in kinds:
            for rel in FOREIGN[kind](rng):
                _put_foreign(root, planted, rel, rng)
        if "in folders the lock names" in kinds:
            _craft_lock(root)
    sequence = rng.choice(SEQUENCES)
    label = f"try {n} ({', '.join(kinds)}; {' -> '.join(sequence)})"
    fig.tries += 1
    for kind in kinds:
        fig.count(f"foreign: {kind}")
    last = None
    for step in sequence:
        run = _clean_step(fig, root, planted, step, label, clean_s, rng, adopted)
        last = run if step == "clean" else last
        if changed := foreign_changed(root, planted):
            fig.data_lost += 1
            fig.note(f"{label}: after {step}, foreign files deleted or changed: {changed[:4]}")
            return
    if last is None or last.returncode != 0:
        return
    left, beside = left_after_clean(root, planted)
    fig.count("optbuild files left beside foreign files", beside)
    if left:
        fig.violations += 1
        fig.note(f"{label}: clean left what optbuild wrote, in folders holding nothing foreign: {left[:4]}")


def suite_clean(tmp: Path, tries: int, rng: random.Random) -> Figures:
    fig = Figures("clean")
    started = time.perf_counter()
    top = tmp / "clean"
    top.mkdir()
    probe = clean_project(top / "probe")  # fills the shared cache, and times a clean
    if failed_run(fig, "first build", optbuild(probe, "build", "--no-remote")):
        return fig
    clean_s = optbuild(probe, "clean").seconds
    for n in range(1, tries + 1):
        _clean_try(fig, clean_project(top / f"p{n}"), rng, clean_s, n)
    fig.seconds = time.perf_counter() - started
    return fig


# --- 10. deploy -----------------------------------------------------------------------------
DEPLOY_RECIPE = '[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n[steps.serve]\nkind = "deploy"\ninput = "src"\n'
PINNED = re.compile(r"version_policy\s*\{\s*specific\s*\{\s*versions:\s*(\d+)\s*\}\s*\}\s*")
DEPLOY_LEFTOVERS = (".optbuild-tmp-", ".optbuild-old-")  # what a killed publish leaves, the next one sweeps


def tiny_onnx(path: Path, width: int) -> None:
    """y = Relu(x), x of shape [batch, width]: each width a model (and a config.pbtxt) of its own."""
    from onnx import TensorProto, helper, save

    dims: list[str | int] = ["batch", width]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _files(folder: Path) -> dict[str, str]:
    """relpath -> optbuild's digest of every file under ``folder`` (optbuild.json aside)."""
    from optbuild.common.digest import hash_file

    return {p.relative_to(folder).as_posix(): hash_file(p)[0] for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "optbuild.json"}


def served(model_dir: Path) -> tuple[Path | None, list[str]]:
    """The version folder Triton serves from ``model_dir`` (the one config.pbtxt pins with a
    `specific` version_policy, else the highest numeric folder: Triton's default, latest 1) and
    why what it serves is inconsistent: that folder incomplete (its files not those its
    optbuild.json records) or config.pbtxt, its version_policy aside, not the configuration
    that version was published with."""
    config = model_dir / "config.pbtxt"
    live = config.read_text() if config.is_file() else None
    numbers = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isascii() and p.name.isdigit() and p.is_dir())
    pin = PINNED.search(live or "")
    number = int(pin.group(1)) if pin else (numbers[-1] if numbers else None)
    if number is None or number not in numbers:
        return None, [f"{model_dir.name}: serves no version (pinned {number}, folders {numbers})"]
    folder = model_dir / str(number)
    try:
        record = json.loads((folder / "optbuild.json").read_text())
    except (OSError, ValueError) as exc:
        return folder, [f"{model_dir.name}/{number}: its optbuild.json cannot be read ({exc})"]
    found = []
    if _files(folder) != record.get("files"):
        found.append(f"{model_dir.name}/{number}: its files are not those its optbuild.json records")
    if live is None or PINNED.sub("", live).strip() != str(record.get("config")).strip():
        found.append(f"{model_dir.name}: config.pbtxt is not the one version {number} was published with")
    return folder, found


def _wait_for_switch(proc: subprocess.Popen, model_dir: Path, deadline: float) -> None:
    """Return the moment the model's version folders change (one appeared, or went): just
    after that rename, before whatever was to follow it (config.pbtxt's); or when the command
    ended first."""
    def numbered() -> set[str]:
        with suppress(OSError):
            return {n for n in os.listdir(model_dir) if n.isdigit()}
        return set()
    before = numbered()
    while proc.poll() is None and time.perf_counter() < deadline and numbered() == before:
        pass


def _deploy_killed(fig: Figures, root: Path, args: tuple[str, ...], model_dir: Path, at_switch: bool,
                   measured: float, rng: random.Random) -> str:
    """Run ``optbuild deploy args``, SIGKILLed (its process group) at the switch or at a random
    delay within the command's measured duration; what the served state was after the kill."""
    proc = subprocess.Popen([sys.executable, "-m", "optbuild", "deploy", *args], cwd=root, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if at_switch:
        _wait_for_switch(proc, model_dir, time.perf_counter() + 3 * measured + 10)
    else:
        time.sleep(rng.uniform(0, measured))
    ended = proc.poll() is not None
    sigkill(proc)
    fig.count(f"kills {'at the switch' if at_switch else 'at a random delay'}"
              + (" that came after the command ended" if ended else ", mid-command"))
    return "ended" if ended else "killed"


def _judge_rerun(fig: Figures, root: Path, label: str, action: str, run: Run, model_dir: Path,
                 inconsistent_before: bool) -> None:
    """The same command again: it must end with a consistent served state (repairing one a
    kill left), serve the deploy step's model after a publish, and leave nothing behind."""
    folder, problems = served(model_dir)
    if run.traceback:
        fig.violations += 1
        fig.note(f"{label}: rerun: traceback: {run.tail()}")
    nothing_left = action == "rollback" and run.returncode == 2 and "nothing to roll back to" in run.stderr
    if run.returncode != 0 and not (nothing_left and not inconsistent_before):
        fig.failed += 1
        fig.note(f"{label}: rerun: exit {run.returncode}: {run.tail()}")
        fig.keep(label, run)
    if problems and run.returncode == 0:
        fig.data_lost += 1  # the command said ok, and Triton serves a mix
        fig.note(f"{label}: rerun said ok ({run.stdout.strip()[:120]!r}), still inconsistent: {problems}")
    elif problems:
        fig.violations += 1
        fig.note(f"{label}: rerun did not repair it: {problems}")
    elif inconsistent_before:
        fig.count("inconsistencies a rerun repaired")
    if action == "publish" and run.returncode == 0 and folder is not None:
        built = next((root / "build" / "net" / "serve" / "net").glob("[0-9]*"), None)
        if built is None or _files(folder) != _files(built):
            fig.data_lost += 1
            fig.note(f"{label}: rerun said ok, but {folder.name} is not the model the deploy step built")
    if left := [p.name for p in model_dir.iterdir() if p.name.startswith(DEPLOY_LEFTOVERS)]:
        fig.violations += 1
        fig.note(f"{label}: rerun left {left[:3]}")


def suite_deploy(tmp: Path, tries: int, rng: random.Random) -> Figures:
    fig = Figures("deploy")
    started = time.perf_counter()
    root = tmp / "deploy" / "p"
    (root / "recipes").mkdir(parents=True)
    (root / "optbuild.toml").write_text('[project]\nrecipes = ["recipes/*.toml"]\n[build]\njobs = 1\n')
    (root / "recipes" / "net.toml").write_text(DEPLOY_RECIPE)
    repo = tmp / "deploy" / "models"
    model_dir = repo / "net"
    publish = ("--to", str(repo), "--keep", "3")
    rollback = (*publish, "--rollback", "net")
    widths = iter(rng.sample(range(2, 4000), tries + 3))
    measured: dict[str, float] = {}
    for action, args in (("first", publish), ("publish", publish), ("unchanged", publish), ("rollback", rollback)):
        if action != "unchanged":
            tiny_onnx(root / "recipes" / "net.onnx", next(widths))
        run = optbuild(root, "deploy", *args)  # timed: each kill lands within its command's time
        if failed_run(fig, f"measuring {action}", run):
            return fig
        measured[action] = run.seconds
    for n in range(1, tries + 1):
        numbers = [p.name for p in model_dir.iterdir() if p.name.isdigit()]
        action = rng.choices(["publish", "rollback", "unchanged"], [50, 35, 15])[0]
        action = "publish" if action == "rollback" and len(numbers) < 2 else action
        if action == "publish":
            tiny_onnx(root / "recipes" / "net.onnx", next(widths))
        args = rollback if action == "rollback" else publish
        at_switch = action != "unchanged" and rng.random() < 0.5
        label = f"try {n}: {action} killed {'at the switch' if at_switch else 'at a random delay'}"
        fig.tries += 1
        _deploy_killed(fig, root, args, model_dir, at_switch, measured[action], rng)
        _folder, problems = served(model_dir)
        if problems:  # what Triton would load now, until someone reruns the command
            fig.violations += 1
            fig.note(f"{label}: inconsistent after the kill: {problems}")
        _judge_rerun(fig, root, label, action, optbuild(root, "deploy", *args), model_dir, bool(problems))
    fig.seconds = time.perf_counter() - started
    return fig


# --- report --------------------------------------------------------------------------------
UNDETECTABLE = ("* wrong, undetectable without signing: outputs restored from unsigned remote entries that\n"
                "  were pointed at another intact blob of the size they record. No host without the\n"
                "  signing key can tell them from true entries (docs/remote-cache.md), so they are not\n"
                "  counted as data lost, but they are wrong: sign the remote to catch them (rewired signed).")


def _row(f: Figures) -> str:
    return (f"{f.name:<18} {f.tries:>6} {f.failed:>7} {f.violations:>11} {f.data_lost:>10} "
            f"{f.undetectable:>14} {f.seconds:>8.1f}")


def table(figures: list[Figures]) -> str:
    head = (f"{'category':<18} {'tries':>6} {'failed':>7} {'violations':>11} {'data lost':>10} "
            f"{'undetectable*':>14} {'time s':>8}")
    total = Figures("total", sum(f.tries for f in figures), sum(f.failed for f in figures),
                    sum(f.violations for f in figures), sum(f.data_lost for f in figures),
                    sum(f.undetectable for f in figures), sum(f.seconds for f in figures))
    rule = "-" * len(head)
    return "\n".join([head, rule, *map(_row, figures), rule, _row(total), UNDETECTABLE])


def describe(fig: Figures) -> str:
    lines = [(f"[{fig.name}] tries {fig.tries}, failed {fig.failed}, violations {fig.violations}, "
              f"data lost {fig.data_lost} (must be 0), wrong, undetectable without signing "
              f"{fig.undetectable}, {fig.seconds:.1f} s")]
    lines += [f"    {name}: {n}" for name, n in sorted(fig.extra.items())]
    lines += [f"    - {note}" for note in fig.notes]
    if VERBOSE:
        lines += [textwrap.indent(detail, "      ") for detail in fig.details]
    return "\n".join(lines)


def guarded(fig_name: str, body: Callable[[], Figures]) -> Figures:
    """A category whose harness itself broke is reported as such, and the others still run."""
    started = time.perf_counter()
    try:
        return body()
    except Exception as exc:  # the suite reports, it does not crash
        fig = Figures(fig_name, seconds=time.perf_counter() - started)
        fig.violations += 1
        fig.note(f"the suite itself failed here: {type(exc).__name__}: {exc}")
        return fig


CATEGORIES = ["kills", "concurrent", "corruptions", "hostile", "bytecode", "dask-forged", "rewired", "server",
              "clean", "deploy"]


def main() -> int:
    global QUIET, VERBOSE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--builders", type=int, default=4)
    parser.add_argument("--runs", type=int, default=25, help="builds per concurrent builder")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the corruption / hostile cases")
    parser.add_argument("--edits", type=int, default=6, help="same-second helper edits (stale bytecode)")
    parser.add_argument("--forgeries", type=int, default=10, help="forged tasks sent to the Dask scheduler")
    parser.add_argument("--rewirings", type=int, default=8, help="unsigned remote entries rewired")
    parser.add_argument("--cleans", type=int, default=20, help="projects with foreign files built and cleaned")
    parser.add_argument("--deploys", type=int, default=30, help="publishes and rollbacks killed")
    parser.add_argument("--only", nargs="*", choices=CATEGORIES)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="10 kills, 2 x 5 builders, one round, 3 edits, 5 forgeries, 3 rewirings, "
                             "8 cleans, 8 deploys")
    parser.add_argument("--json", action="store_true", help="figures as JSON on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (to look at failures)")
    parser.add_argument("--verbose", action="store_true", help="show the stderr of the first bad runs")
    args = parser.parse_args()
    corruptions, hostile = list(CORRUPTIONS), [*HOSTILE_PLAIN, *HOSTILE_SIGNED]
    if args.quick:  # every kind of corruption and forgery, a sample of the hostile entries (0.5 s per CLI start)
        args.kills, args.builders, args.runs, args.rounds, args.edits = 10, 2, 5, 1, 3
        args.forgeries, args.rewirings, args.cleans, args.deploys = len(FORGERIES), 3, 8, 8
    QUIET, VERBOSE = args.json, args.verbose
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    if args.quick:
        hostile = rng.sample(list(HOSTILE_PLAIN), 4) + rng.sample(list(HOSTILE_SIGNED), 2)
    only = set(args.only or CATEGORIES)
    tmp = Path(tempfile.mkdtemp(prefix="optbuild-faults-"))
    ENV[RUN_MARKER] = tmp.name
    log(f"fault suite, seed {seed}, in {tmp}")
    figures: list[Figures] = []

    def category(selected: str, heading: str, body: Callable[[], Figures], name: str = "") -> None:
        if selected in only:
            log(heading)
            figures.append(guarded(name or selected, body))
            log(describe(figures[-1]))

    try:
        refs = References(tmp)
        refs(VARIANTS[0])
        category("kills", f"1. kills: {args.kills}", lambda: suite_kills(tmp, refs, args.kills, rng))
        category("concurrent", f"2. concurrent builders: {args.builders} x {args.runs}, gc beside them",
                 lambda: suite_concurrent(tmp, refs, args.builders, args.runs, rng))
        category("corruptions", f"3. corruptions: {len(corruptions)} kinds x {args.rounds}",
                 lambda: suite_corruptions(tmp, refs, args.rounds, rng, corruptions))
        category("hostile", f"4. hostile remote entries: {len(hostile)} kinds x {args.rounds}: {', '.join(hostile)}",
                 lambda: suite_hostile(tmp, refs, args.rounds, rng, hostile), "hostile remote")
        category("bytecode", f"5. stale bytecode: {args.edits} same-second helper edits after an import",
                 lambda: suite_bytecode(tmp, args.edits, rng), "stale bytecode")
        category("dask-forged", f"6. forged Dask tasks: {args.forgeries} ({', '.join(FORGERIES)})",
                 lambda: suite_dask_forged(tmp, refs, args.forgeries, rng))
        for signed in (True, False):
            how = "signed" if signed else "unsigned"
            category("rewired", f"7. {how} remote entries rewired to other blobs: {args.rewirings}",
                     lambda signed=signed: suite_rewired(tmp, refs, args.rewirings, rng, signed), f"rewired {how}")
        category("server", f"8. the build server on: {args.kills} kills",
                 lambda: with_server(tmp, lambda at: suite_kills(at, refs, args.kills, rng, "kills +server")),
                 "kills +server")
        category("server", f"8. the build server on: {args.edits} same-second edits",
                 lambda: with_server(tmp, lambda at: suite_bytecode(at, args.edits, rng, "bytecode +server")),
                 "bytecode +server")
        category("clean", f"9. clean: {args.cleans} projects with foreign files planted, built, cleaned, killed",
                 lambda: suite_clean(tmp, args.cleans, rng))
        category("deploy", f"10. deploy: {args.deploys} publishes and rollbacks killed, then rerun",
                 lambda: suite_deploy(tmp, args.deploys, rng))
    finally:
        reap()
        if args.keep:
            log(f"kept {tmp}")
        else:
            for path in tmp.rglob("*"):
                if path.is_dir() and not path.is_symlink():
                    with suppress(OSError):
                        path.chmod(0o755)
            shutil.rmtree(tmp, ignore_errors=True)
    lost = sum(f.data_lost for f in figures)
    if args.json:
        print(json.dumps({"seed": seed, "categories": [asdict(f) for f in figures], "data_lost": lost}, indent=1))
    else:
        print()
        print(table(figures))
        print("data lost: " + ("0" if lost == 0 else f"{lost}  <-- see the categories above"))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
