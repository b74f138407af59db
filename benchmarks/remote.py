"""Remote cache figures, against an S3-compatible server (moto) on 127.0.0.1.

    python benchmarks/remote.py [--size-mb 100] [--steps 50] [--width 1] [--runs 7] [--skip-big]

Prints:
  1. (unless --skip-big) a 100 MB artifact: restored from the loopback S3 server on a fresh host (empty local
     cache, `optbuild build`) vs rebuilt there (`optbuild build --no-remote`), and the
     upload the first build did; wall time of the whole CLI command, median of runs;
  2. a fully cached no-op `optbuild build` of an N-step project with a remote configured
     (S3 and file://) vs local-only (`--no-remote`): the overhead (goal < 10%);
  3. a fresh host restoring the N-step project from the remote (S3, and a file:// mount, which
     has no server to wait for) vs building it, with the remote counters of a restore (hits,
     requests, blobs and bytes down, from its cache/stats.jsonl) and the CPU the restore and the
     server spent (the server shares this host's cores; a real one's are elsewhere);
  4. the remote lookups of the N steps' keys: one by one, and batched (RemoteSession.prefetch,
     prefetch_listing), through the session API, and the requests each made.

Needs `moto[server]` and s3fs (installed together: see docs/remote-cache.md). The 100 MB
step is synthetic (numpy's generator writing float32 "weights"): a lower bound for a real
rebuild, which for a TensorRT engine takes minutes, not seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "tests" / "fixtures" / "kinds.py"
ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_EC2_METADATA_DISABLED": "true", "OPTBUILD_SERVER": "0"}  # builds in-process, none left behind

BIG_KIND = '''
import numpy as np
from optbuild.steps.base import Step, StepParams

class WeightsParams(StepParams):
    megabytes: int = 100
    seed: int = 0

class Weights(Step):
    """Writes `megabytes` MB of float32 weights from a fixed seed (a stand-in for an engine)."""
    Params = WeightsParams
    primary_output = "weights.bin"

    def run(self, ctx):
        rng = np.random.default_rng(self.params.seed)
        n = self.params.megabytes * 1_000_000 // 4
        rng.standard_normal(n, dtype=np.float32).tofile(ctx.out_dir / "weights.bin")
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, **ENV})
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, endpoint
        except OSError:
            time.sleep(0.1)
    server.kill()
    sys.exit("moto_server did not start")


def server_cpu(server: subprocess.Popen) -> float:
    """CPU seconds the server process has spent so far (its threads, ended ones included)."""
    fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of the commands this process ran and waited for, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_bucket(endpoint: str, name: str) -> None:
    import s3fs

    s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir(name)


def optbuild(cwd: Path, *args: str, phases: list | None = None) -> float:
    """Wall time of one CLI command; with ``phases``, also appends the seconds between the
    run's start event and its last step event (the work itself, without interpreter start)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "optbuild", *args, *(["--json"] if phases is not None else [])],
                          cwd=cwd, capture_output=True, check=False, text=True, env={**os.environ, **ENV})
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"optbuild {' '.join(args)} in {cwd} failed:\n{proc.stderr}")
    if phases is not None:
        events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        begin = next(e["time"] for e in events if e.get("event") == "start")
        end = max(e["time"] for e in events if e.get("event") == "step")
        phases.append(end - begin)
    return elapsed


def project(root: Path, remote: str, steps_toml: str, kinds: str) -> Path:
    root.mkdir(parents=True)
    shutil.copy(KINDS, root / "kinds.py")
    (root / "big.py").write_text(BIG_KIND)
    (root / "data").mkdir()
    (root / "data" / "input.txt").write_text("hello")
    (root / "recipes").mkdir()
    (root / "recipes" / "bench.toml").write_text(steps_toml)
    (root / "optbuild.toml").write_text(
        f'[project]\nrecipes = ["recipes/*.toml"]\n[kinds]\n{kinds}\n[build]\njobs = 2\n{remote}')
    return root


def chains(steps: int, width: int = 1) -> str:
    """``width`` chains of joins from one text source, ``steps`` steps in all. One chain is a
    restore's worst case: each key needs the entry before it, so no two lookups overlap."""
    text = '[steps.s0]\nkind = "text"\npath = "../data/input.txt"\n'
    for c in range(width):
        length = (steps - 1) // width + (c < (steps - 1) % width)
        name, tag = ("s", "") if width == 1 else (f"c{c}_s", f"c{c}-")
        for i in range(1, length + 1):
            before = "s0" if i == 1 else f"{name}{i - 1}"
            text += f'\n[steps.{name}{i}]\nkind = "join"\ninput = "{before}"\nsuffix = "-{tag}{i}"\n'
    return text


def remote_counts(proj: Path) -> str:
    """The remote counters of the last run ``proj`` recorded (its cache/stats.jsonl)."""
    remote = json.loads((proj / "cache" / "stats.jsonl").read_text().splitlines()[-1]).get("remote") or {}
    return (f"hits {remote.get('hits', 0)}, requests {remote.get('requests', 0)}, "
            f"blobs down {remote.get('blobs_down', 0)}, bytes down {remote.get('bytes_down', 0)}")


def _remove(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(root)


def fmt(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.3f} s (median of {len(seconds)}, min {min(seconds):.3f})"


def lookups(proj: Path, endpoint: str, runs: int) -> None:
    """4. the remote lookups of every step of ``proj`` (pushed to s3://noop/cache), by the
    session API: one by one as today's scheduler asks, and batched (``prefetch``)."""
    from optbuild.store.remote import RemoteSession, RemoteStore

    keys = [step["key"] for step in json.loads((proj / "optbuild.lock").read_text())["steps"].values()]
    absent = [f"{i:064x}" for i in range(len(keys))]

    def timed(batch: str, wanted: list[str]) -> tuple[float, int]:
        """Seconds, and requests made, for one round."""
        session = RemoteSession(RemoteStore("s3://noop/cache", endpoint_url=endpoint))
        session.store.filesystem()  # connected (s3fs imported) before the clock starts
        start = time.perf_counter()
        if batch == "listing":
            session.prefetch_listing()
        elif batch == "prefetch":
            session.prefetch(wanted)
        found = [session.lookup(key) for key in wanted]
        elapsed = time.perf_counter() - start
        assert sum(entry is not None for entry in found) == (len(wanted) if wanted is keys else 0)
        return elapsed, session.stats.requests

    print(f"\n4. remote lookups of {len(keys)} steps (RemoteSession, after connecting):")
    for label, batch, wanted in (("present, one by one", "", keys), ("present, prefetch(keys)", "prefetch", keys),
                                 ("absent, one by one", "", absent), ("absent, prefetch_listing()", "listing", absent)):
        rounds = [timed(batch, wanted) for _ in range(runs)]
        print(f"   {label:<27}: {fmt([seconds for seconds, _ in rounds])}, requests {rounds[-1][1]}")


def big(tmp: Path, endpoint: str, size_mb: int, runs: int) -> None:
    """1. a large artifact: pulled vs rebuilt."""
    make_bucket(endpoint, "big")
    remote = f'[remote]\nurl = "s3://big/cache"\nendpoint_url = "{endpoint}"\ntimeout_s = 30\n'
    steps = f'[steps.weights]\nkind = "weights"\nmegabytes = {size_mb}\n'
    kinds = 'weights = "big.py:Weights"'
    first = project(tmp / "big-a", remote, steps, kinds)
    upload = optbuild(first, "build")  # builds and writes through
    local = project(tmp / "big-local", remote, steps, kinds)
    build_only = optbuild(local, "build", "--no-remote")
    _remove(local)
    pulls, rebuilds, cached, pull_work, rebuild_work = [], [], [], [], []
    counts = ""
    for i in range(max(3, runs // 2)):
        host = project(tmp / f"big-pull-{i}", remote, steps, kinds)
        pulls.append(optbuild(host, "build", phases=pull_work))
        counts = remote_counts(host)
        cached.append(optbuild(host, "build"))
        _remove(host)
        host = project(tmp / f"big-rebuild-{i}", remote, steps, kinds)
        rebuilds.append(optbuild(host, "build", "--no-remote", phases=rebuild_work))
        _remove(host)
    print(f"1. {size_mb} MB artifact over loopback S3 (moto_server), whole `optbuild build` command:")
    print(f"   restore from the remote on a fresh host : {fmt(pulls)}")
    print(f"     its remote counters (the last restore) : {counts}")
    print(f"   rebuild it there (--no-remote)          : {fmt(rebuilds)}")
    print("   the same, from the start event to the step's end (no interpreter start-up):")
    print(f"     restore (s3fs client, entry, {size_mb} MB GET, verify, fsync, link): {fmt(pull_work)}")
    print(f"     rebuild (worker process, numpy, write, hash, fsync, link)    : {fmt(rebuild_work)}")
    print(f"   first build + upload (write-through)    : {upload:.3f} s (build alone: {build_only:.3f} s)")
    print(f"   no-op afterwards (local hit)            : {fmt(cached)}")
    rate = size_mb / max(statistics.median(pulls), 1e-9)
    print(f"   -> pull is {statistics.median(rebuilds) / statistics.median(pulls):.1f}x faster than this "
          f"(synthetic, cheap) rebuild; effective {rate:.0f} MB/s end to end")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=1, help="the steps as this many chains side by side (1: one chain)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip-big", action="store_true", help="leave out 1. (the large artifact)")
    args = parser.parse_args()
    os.environ.update(ENV)
    server, endpoint = start_moto()
    tmp = Path(tempfile.mkdtemp(prefix="optbuild-remote-bench-"))
    try:
        if not args.skip_big:
            big(tmp, endpoint, args.size_mb, args.runs)

        # --- 2. no-op overhead -------------------------------------------------------------
        make_bucket(endpoint, "noop")
        s3 = f'[remote]\nurl = "s3://noop/cache"\nendpoint_url = "{endpoint}"\n'
        shared = tmp / "shared-mount"
        shared.mkdir()  # a file:// remote must exist: optbuild does not create it
        text = chains(args.steps, args.width)
        kinds = 'text = "kinds.py:Text"\njoin = "kinds.py:Join"'
        proj_s3 = project(tmp / "noop-s3", s3, text, kinds)
        optbuild(proj_s3, "build")
        proj_file = project(tmp / "noop-file", f'[remote]\nurl = "file://{shared}"\n', text, kinds)
        optbuild(proj_file, "build")
        proj_local = project(tmp / "noop-local", "", text, kinds)  # its own stamp: `build` alone
        optbuild(proj_local, "build")
        time.sleep(2.1)  # the inputs just written are older than the racy margin: the stamps vouch for them
        first = [optbuild(proj, "build") for proj in (proj_local, proj_s3, proj_file)]  # they record
        local_t, s3_t, file_t = [], [], []
        for _ in range(args.runs):  # interleaved, so drift on a shared machine hits all alike
            local_t.append(optbuild(proj_local, "build"))
            s3_t.append(optbuild(proj_s3, "build"))
            file_t.append(optbuild(proj_file, "build"))
        base = statistics.median(local_t)
        print(f"\n2. fully cached no-op `optbuild build`, {args.steps} steps (the first no-op after the "
              f"build: local {first[0]:.3f} s, s3 {first[1]:.3f} s, file {first[2]:.3f} s; then):")
        print(f"   local only (no remote)   : {fmt(local_t)}")
        print(f"   remote s3:// configured  : {fmt(s3_t)}  overhead {100 * (statistics.median(s3_t) / base - 1):+.1f}%")
        print(f"   remote file:// configured: {fmt(file_t)}  overhead {100 * (statistics.median(file_t) / base - 1):+.1f}%")

        # --- 3. a fresh host: restore the project vs build it -----------------------------
        restore, restore_file, rebuild = [], [], []
        client_cpu = moto_cpu = 0.0
        for i in range(min(args.runs, 3)):
            fresh = project(tmp / f"fresh-s3-{i}", s3, text, kinds)
            client, moto = children_cpu(), server_cpu(server)
            restore.append(optbuild(fresh, "build"))
            client_cpu, moto_cpu = children_cpu() - client, server_cpu(server) - moto
            mounted = project(tmp / f"fresh-file-{i}", f'[remote]\nurl = "file://{shared}"\n', text, kinds)
            restore_file.append(optbuild(mounted, "build"))
            rebuild.append(optbuild(project(tmp / f"fresh-local-{i}", s3, text, kinds), "build", "--no-remote"))
        print(f"\n3. fresh host, {args.steps} small steps:")
        print(f"   restore from s3 remote    : {fmt(restore)}")
        print(f"     its remote counters (the last restore): {remote_counts(fresh)}")
        print(f"     CPU of the last restore: optbuild {client_cpu:.1f} s, the S3 server {moto_cpu:.1f} s "
              f"(on this host's cores too)")
        print(f"   restore from file:// mount: {fmt(restore_file)}  (no server: optbuild's own cost)")
        print(f"     its remote counters (the last restore): {remote_counts(mounted)}")
        print(f"   build locally             : {fmt(rebuild)}")
        lookups(proj_s3, endpoint, args.runs)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
