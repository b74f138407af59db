"""The fault suite (benchmarks/faults.py) judges what it claims to (issue 30, item 6).

* Its deploy judge says what Triton would serve: the version config.pbtxt pins, else the
  highest numeric folder, whole and with the configuration it was published with; a config of
  another version, a pin to a missing folder or a changed file is named as inconsistent.
* Its `clean` and `deploy` categories, run through the CLI on a few tries, lose nothing: no
  user's file deleted, no model served with another version's configuration.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from plugins.projects import REPO

from optbuild.common.digest import hash_file

sys.path.append(str(REPO / "benchmarks"))  # faults.py imports faults_dask from there
import faults


def version(model_dir: Path, number: int, model: bytes, config: str) -> None:
    """A published version as optbuild.json records it: its files' digests and its config."""
    folder = model_dir / str(number)
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(model)
    record = {"files": {"model.onnx": hash_file(folder / "model.onnx")[0]}, "config": config}
    (folder / "optbuild.json").write_text(json.dumps(record))


def test_the_deploy_judge_names_what_triton_would_serve_inconsistently(tmp_path):
    net = tmp_path / "net"
    version(net, 1, b"one", 'name: "net"\nmax_batch_size: 1\n')
    version(net, 2, b"two", 'name: "net"\nmax_batch_size: 2\n')
    config = net / "config.pbtxt"

    config.write_text('name: "net"\nmax_batch_size: 1\n')  # no pin: Triton serves 2, with 1's config
    folder, problems = faults.served(net)
    assert folder == net / "2" and problems == ["net: config.pbtxt is not the one version 2 was published with"]

    config.write_text('name: "net"\nmax_batch_size: 1\nversion_policy { specific { versions: 1 } }\n')
    assert faults.served(net) == (net / "1", [])

    (net / "1" / "model.onnx").write_bytes(b"eno")
    assert faults.served(net)[1] == ["net/1: its files are not those its optbuild.json records"]

    config.write_text('name: "net"\nversion_policy { specific { versions: 7 } }\n')
    assert faults.served(net) == (None, ["net: serves no version (pinned 7, folders [1, 2])"])


@pytest.mark.slow
def test_the_clean_and_deploy_categories_lose_nothing(tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "faults.py"), "--only", "clean", "deploy",
                          "--cleans", "4", "--deploys", "6", "--seed", "7", "--json"],
                         check=False, capture_output=True, text=True, timeout=300)
    figures = {c["name"]: c for c in json.loads(run.stdout)["categories"]}
    assert set(figures) == {"clean", "deploy"}, run.stderr[-2000:]
    for name, fig in figures.items():
        assert fig["tries"] > 0 and (fig["failed"], fig["violations"], fig["data_lost"]) == (0, 0, 0), (name, fig)
    assert run.returncode == 0
