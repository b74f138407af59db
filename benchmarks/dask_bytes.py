"""What crosses the network when the example `cnn` recipe builds on Dask (issue #31, "build
without the bytes"): a Dask scheduler and two `optbuild worker` nodes on 127.0.0.1, a file://
remote cache (each transfer to or from it is what a network would carry).

    python benchmarks/dask_bytes.py [--target cnn] [--nodes 2]

Builds the target cold twice, each with fresh caches and remote: with `--download all` (every
output comes to the coordinator: what every dask build did before "build without the bytes")
and with `--download targets` (the default: only the last steps' outputs come). Prints, per
artifact (a step's output, by optbuild.lock), its size and how many times it went up to the
remote, came down to the coordinator, and came down to the nodes (the most one host fetched
it in brackets), from the build's own counts (`api.BuildResult.transfers`), then the totals.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dask_vs_local import start_nodes

REPO = Path(__file__).resolve().parent.parent


def example(root: Path, address: str, remote: Path) -> Path:
    """The example project, building on the Dask scheduler at ``address``."""
    root.mkdir()
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    config = (REPO / "optbuild.toml").read_text()
    (root / "optbuild.toml").write_text(
        config.replace("[build]\n", f'[build]\nexecutor = "dask"\nscheduler = "{address}"\n', 1)
        + f'\n[remote]\nurl = "file://{remote}"\n')
    return root


def build(root: Path, target: str, download: str) -> tuple[Any, dict[str, tuple[str, int]]]:
    """The build's result and, per output blob, (step/output, size)."""
    from optbuild import api

    ws = api.open_workspace(root)
    try:
        result = api.build(ws, [target], download=download, skip_unavailable=True)
    finally:
        ws.close()
    if not result.ok:
        sys.exit(f"the build in {root} failed: {result.done}")
    names = {}
    for sid, outcome in result.outcomes.items():
        if outcome.entry is not None:
            names.update({o.digest: (f"{sid}/{name}", o.size) for name, o in outcome.entry.outputs.items()})
    return result, names


def table(title: str, result: Any, names: dict[str, tuple[str, int]]) -> None:
    print(f"\n{title}")
    print(f"{'artifact':<44} {'bytes':>10} {'up':>3} {'down here':>9} {'down nodes':>11}")
    totals = {"up": 0, "here": 0, "nodes": 0}
    for digest, moved in sorted(result.transfers.items(), key=lambda item: names.get(item[0], ("~", 0))):
        name, size = names.get(digest, (f"(an input file or a log, {digest[:8]})", 0))
        print(f"{name:<44} {size:>10} {moved['up']:>3} {moved['down_here']:>9} "
              f"{moved['down_nodes']:>6} [{moved['down_max']}]")
        totals["up"] += moved["up"] * size
        totals["here"] += moved["down_here"] * size
        totals["nodes"] += moved["down_nodes"] * size
    most = max((m["up"] for m in result.transfers.values()), default=0)
    print(f"bytes of outputs up {totals['up']:,}, down to the coordinator {totals['here']:,}, "
          f"down to nodes {totals['nodes']:,}; most uploads of one blob: {most}, most downloads "
          f"of one blob by one host: {max((m['down_max'] for m in result.transfers.values()), default=0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="cnn", help="what to build (default: the cnn recipe)")
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    from distributed import LocalCluster

    with tempfile.TemporaryDirectory() as tmp_name, \
            LocalCluster(n_workers=0, processes=False, host="127.0.0.1", scheduler_port=0,
                         dashboard_address="127.0.0.1:0", protocol="tcp://") as scheduler:
        tmp = Path(tmp_name)
        address = scheduler.scheduler_address
        for download in ("all", "targets"):
            remote = tmp / f"remote-{download}"
            remote.mkdir()
            folder = tmp / f"nodes-{download}"
            folder.mkdir()
            nodes = start_nodes(address, folder, remote, args.nodes, threads=1)
            try:
                result, names = build(example(tmp / f"project-{download}", address, remote), args.target, download)
            finally:
                for node in nodes:
                    node.terminate()
                for node in nodes:
                    node.wait(10)
            table(f"--download {download}: {args.target} on {args.nodes} nodes, cold "
                  f"({result.done['duration_s']:.1f} s)", result, names)


if __name__ == "__main__":
    main()
