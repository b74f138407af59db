"""A deploy host that builds nothing (issue 25, item 3): it records its fingerprint, a build farm
builds for that fingerprint and pushes to the remote cache, and `optbuild deploy --no-build`
on the host fetches each model's artifact for its own fingerprint, records which key it used,
where it was built and that it came from the remote, or, when the farm did not build a step
for that fingerprint, fails naming the step and its key and publishes nothing.

The deploy host is tests/fixtures/fingerprints/h100.json, a real H100 host's fingerprint: the
optimized onnxruntime model is keyed by that host's CPU and onnxruntime, not this one's."""

from __future__ import annotations

import json
from pathlib import Path

from plugins.projects import ProjectDir
from plugins.remote import Remote
from plugins.steps import tiny_onnx

from optbuild import api
from optbuild.builder.report import Reporter
from optbuild.common.fingerprint import Fingerprint
from optbuild.store.remote import key_id

H100 = Path(__file__).parents[1] / "fixtures/fingerprints/h100.json"
RECIPE = """\
[steps.src]
kind = "onnx"
path = "net.onnx"

[steps.opt]                 # keyed by the host's CPU and onnxruntime
kind = "engine"
backend = "onnxruntime"
input = "src"
level = "all"

[steps.serve]
kind = "deploy"
input = "opt"

[steps.opt_small]
kind = "engine"
backend = "onnxruntime"
input = "src"
level = "extended"

[steps.serve_small]
kind = "deploy"
input = "opt_small"
model_name = "net_small"
"""


def host(root: Path, remote: Remote, **remote_options: str) -> ProjectDir:
    """A copy of the project with its own (empty) local cache and build folder."""
    proj = ProjectDir(root)
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n[build]\njobs = 1\n\n'
               + remote.section(**remote_options))
    proj.write("recipes/net.toml", RECIPE)
    tiny_onnx(proj.root / "recipes/net.onnx", dims=["batch", 4])
    return proj


def farm_build(farm: ProjectDir, target: str) -> api.BuildResult:
    """What the build farm does for the deploy host: build for its recorded fingerprint (pushed
    to the remote as it builds)."""
    ws = api.open_workspace(farm.root)
    try:
        result = api.build(ws, [target], host=Fingerprint.load(H100), reporter=Reporter())
    finally:
        ws.close()
    assert result.ok, result.reporter.events
    return result


def listing(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in [folder, *folder.rglob("*")]}


def test_a_deploy_host_fetches_what_the_farm_built_for_its_fingerprint_and_records_it(tmp_path, s3_remote,
                                                                                      monkeypatch):
    monkeypatch.setenv("OPTBUILD_FARM_KEY", "the farm's secret")  # entries signed, and checked, with it
    farm = host(tmp_path / "farm", s3_remote, signing_key_env="OPTBUILD_FARM_KEY")
    built = farm_build(farm, "net:serve").outcomes
    deploy_host = host(tmp_path / "deploy-host", s3_remote, signing_key_env="OPTBUILD_FARM_KEY")
    repo = tmp_path / "models"

    run = deploy_host.cli("deploy", "net:serve", "--to", str(repo), "--no-build", "--fingerprint", str(H100))
    assert run.returncode == 0, run.stderr
    assert "net: published, version 1" in run.stdout
    record = json.loads((repo / "net/1/optbuild.json").read_text())
    farm_entry = built["net:serve"].entry
    assert (record["step"], record["key"], record["from"]) == ("net:serve", built["net:serve"].key, "remote cache")
    assert (record["built_on"], record["built_at"]) == (farm_entry.built_on, farm_entry.created_at)
    # who pushed it: not recorded by the remote; the key its signature was checked under is
    assert (record["remote"], record["signed_with"]) == (s3_remote.url, key_id(b"the farm's secret"))
    used = record["inputs"]["input"]
    assert (used["step"], used["key"], used["from"]) == ("net:opt", built["net:opt"].key, "remote cache")
    assert used["built_on"] == built["net:opt"].entry.built_on and used["built_at"] > 0
    assert not (deploy_host.root / "build/.logs").exists()  # nothing ran on the deploy host

    # For this host's own fingerprint the farm built nothing: its keys are others, and nothing is fetched
    own = deploy_host.cli("deploy", "net:serve", "--to", str(tmp_path / "own"), "--no-build")
    assert own.returncode == 1 and "error: net:opt is would-build, key " in own.stderr
    assert not (tmp_path / "own").exists()


def test_a_step_the_farm_did_not_build_for_the_fingerprint_fails_the_deploy_naming_it_and_its_key(
        tmp_path, s3_remote):
    farm = host(tmp_path / "farm", s3_remote)
    farm_build(farm, "net:serve")  # not net:serve_small
    deploy_host = host(tmp_path / "deploy-host", s3_remote)
    repo = tmp_path / "models"
    fetch = ("--to", str(repo), "--no-build", "--fingerprint", str(H100))
    assert deploy_host.cli("deploy", "net:serve", *fetch).returncode == 0
    before = listing(repo)

    run = deploy_host.cli("deploy", *fetch)  # both models: net_small's engine was never pushed
    assert run.returncode == 1
    missing = farm_build(farm, "net:opt_small").outcomes["net:opt_small"].key  # the key it lacked
    assert f"error: net:opt_small is would-build, key {missing}" in run.stderr
    assert "error: 1 step(s) after them wait on them, among them net:serve_small" in run.stderr
    assert "error: nothing was published" in run.stderr
    assert listing(repo) == before  # net as it was, no net_small: nothing half-published

    farm_build(farm, "net:serve_small")
    again = deploy_host.cli("deploy", *fetch)
    assert again.returncode == 0, again.stderr
    assert "net: unchanged, version 1" in again.stdout and "net_small: published, version 1" in again.stdout
    small = json.loads((repo / "net_small/1/optbuild.json").read_text())["inputs"]["input"]
    assert small["from"] == "remote cache" and small["signed_with"] is None  # unsigned: anyone could have pushed it


def test_an_unreadable_fingerprint_file_says_how_to_make_one(tmp_path, file_remote):
    deploy_host = host(tmp_path / "deploy-host", file_remote)
    run = deploy_host.cli("deploy", "--to", str(tmp_path / "models"), "--fingerprint", "nowhere.json")
    assert run.returncode == 2
    assert "--fingerprint nowhere.json: cannot read it" in run.stderr
    assert "optbuild fingerprint -o nowhere.json" in run.stderr
