"""The real Triton server reads what `optbuild deploy` writes (issue 34, item 6).

The `tritonserver` binary that the nvidia-pytriton wheel ships (Triton 2.51) carries the
python backend only. These tests start it on 127.0.0.1 over a repository that `optbuild deploy
--to` published, and check that:

* it parses every config.pbtxt there and checks what it checks before it looks for the
  backend (the batch sizes, the version policy): each model then fails to load for want of its
  backend (onnxruntime, openvino) and for nothing else;
* each config with `backend: "python"` in place of its own loads: Triton checks the inputs and
  outputs only once it has the backend, so this twin is what checks them; its model.py runs
  the deployed file (model.onnx with onnxruntime, an IR with OpenVINO, imported from this
  venv), and answers an inference over HTTP with the numbers the runtime gives in-process;
* in poll mode it loads the version the deployed config.pbtxt pins, through a publish and a
  rollback.

Install the binary with `pip install --no-deps nvidia-pytriton==0.7.0` (a manylinux_2_35
x86-64 wheel of 55 MB, 145 MB installed; --no-deps because its own dependencies pin numpy<2,
and the binary needs none of them); where it is not installed, these tests skip saying so."""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from plugins.models import make_mlp
from plugins.projects import ProjectDir
from plugins.steps import tiny_onnx

from optbuild.steps.triton_schema import model_config_class

INSTALL = "pip install --no-deps nvidia-pytriton==0.7.0"
# Triton's load error for a model whose backend it does not have.
NO_BACKEND = ("unable to find backend library for backend '{backend}', try specifying runtime on the model "
              "configuration.")
PROJECT = '[project]\nrecipes = ["recipes/*.toml"]\n[build]\njobs = 1\n'
# Four deploy steps, one per kind of config.pbtxt deploy writes on a CPU host.
RECIPE = """
[steps.src]
kind = "onnx"
path = "net.onnx"

[steps.fixed_src]
kind = "onnx"
path = "fixed.onnx"

[steps.ov]
kind = "engine"
backend = "openvino"
input = "src"

[steps.serve]
kind = "deploy"
input = "src"

[steps.serve_fixed]
kind = "deploy"
input = "fixed_src"
model_name = "fixed"

[steps.serve_accelerated]
kind = "deploy"
input = "src"
model_name = "accelerated"
accelerator = "openvino"
max_batch_size = 16
instances = 2
config = "dynamic_batching { max_queue_delay_microseconds: 100 } optimization { graph { level: 1 } }"

[steps.serve_ir]
kind = "deploy"
input = "ov"
model_name = "ir"
"""
# A python-backend model that runs the deployed file its config's parameter "model" names:
# model.onnx with onnxruntime, an OpenVINO IR with OpenVINO (its telemetry kept off, as
# optbuild.backends.openvino.loader does). Tensors cross by DLPack: the stub's numpy bridge
# (as_numpy, Tensor(name, array)) reads numpy 1's array layout, and under numpy 2 it garbles
# inputs and sizes outputs wrong.
MODEL_PY = '''
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = json.loads(args["model_config"])["parameters"]["model"]["string_value"]
        if path.endswith(".onnx"):
            import onnxruntime as ort

            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            self.inputs = [i.name for i in session.get_inputs()]
            self.outputs = [o.name for o in session.get_outputs()]
            self.run = lambda feed: session.run(self.outputs, feed)
        else:
            sys.modules.setdefault("openvino_telemetry", None)
            import openvino as ov

            compiled = ov.Core().compile_model(path, "CPU")
            self.inputs = [p.get_any_name() for p in compiled.inputs]
            self.outputs = [p.get_any_name() for p in compiled.outputs]
            self.run = lambda feed: list(compiled(feed).values())

    def execute(self, requests):
        responses = []
        for request in requests:
            feed = {name: np.from_dlpack(pb_utils.get_input_tensor_by_name(request, name))
                    for name in self.inputs}
            results = self.run(feed)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(value))
                 for name, value in zip(self.outputs, results)]))
        return responses
'''


def tritonserver_dist() -> Path:
    """The wheel's tritonserver folder (bin/, backends/, python_backend_stubs/), found without
    importing pytriton (whose own dependencies are not installed); skips saying how to get it."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip(f"the nvidia-pytriton wheel's tritonserver is for Linux x86-64 (here: {sys.platform} "
                    f"{platform.machine()})")
    spec = importlib.util.find_spec("pytriton")
    folders = list(spec.submodule_search_locations or []) if spec else []
    found = [Path(f) / "tritonserver" for f in folders
             if (Path(f) / "tritonserver/bin/tritonserver").is_file()]
    if not found:
        pytest.skip(f"no tritonserver binary: the nvidia-pytriton wheel is not installed ({INSTALL})")
    return found[0]


def libpython_dir() -> str | None:
    """The folder of the shared libpython that the python backend's stub links to, preferring
    this interpreter's own; None when this Python has none (a static build, no libpython3.X)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    name = sysconfig.get_config_var("INSTSONAME") or f"libpython{version}.so.1.0"
    own = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent") / name
    if own.is_file():
        return str(own.parent)
    return "" if ctypes.util.find_library(f"python{version}") else None


def python_backend(dist: Path, folder: Path) -> Path:
    """A backends folder holding the python backend with the stub for this Python, as pytriton
    lays it out; skips saying why where the stub cannot run here."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        pytest.skip(f"the nvidia-pytriton wheel has no python backend stub for Python {version}")
    if libpython_dir() is None:
        pytest.skip(f"the python backend's stub needs a shared libpython{version}.so.1.0, which this "
                    f"Python ({sys.executable}) does not have (a CPython built with --enable-shared has)")
    backend = folder / "backends" / "python"
    shutil.copytree(dist / "backends" / "python", backend, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, backend / "triton_python_backend_stub")
    return folder / "backends"


@dataclass
class Triton:
    """A running tritonserver: its HTTP address and its log."""

    url: str
    log: Path

    def request(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(HTTP status, JSON answer) of a GET, or a POST of ``body``."""
        data = None if body is None else json.dumps(body).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, data=data), timeout=30) as r:
                text = r.read()
                return r.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def load(self, model: str) -> str:
        """Load ``model`` (explicit mode): '' when it loaded, else the server's error."""
        status, answer = self.request(f"/v2/repository/models/{model}/load", {})
        return "" if status == 200 else answer.get("error", f"HTTP {status}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def triton(dist: Path, repositories: list[Path], folder: Path, *options: str,
           backends: Path | None = None) -> Iterator[Triton]:
    """tritonserver on 127.0.0.1 (HTTP only), live within 30 s, always stopped after."""
    port = free_port()
    log = folder / f"tritonserver-{port}.log"
    command = [str(dist / "bin/tritonserver"), *(f"--model-repository={r}" for r in repositories),
               "--http-address=127.0.0.1", f"--http-port={port}", "--allow-grpc=false",
               "--allow-metrics=false", "--exit-on-error=false", "--strict-readiness=false", *options]
    if backends:
        command.append(f"--backend-directory={backends}")
    # The wheel's libraries, for the python backend and its stub copied out of the wheel's tree
    # (their RPATH is relative to it), and this Python's libpython for the stub.
    libraries = [str(dist.parent.parent / "nvidia_pytriton.libs"), libpython_dir() or ""]
    # The python backend's stub runs the interpreter that PATH names first: this venv's.
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(p for p in libraries if p),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder)
    server = Triton(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 30
        while not live(server):
            assert process.poll() is None, \
                f"tritonserver exited {process.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"tritonserver not live in 30 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def live(server: Triton) -> bool:
    with contextlib.suppress(OSError):
        return server.request("/v2/health/live")[0] == 200
    return False


def until(check, seconds: float = 20):
    """``check()``'s first true value, polled until ``seconds`` passed (then its last value)."""
    deadline = time.monotonic() + seconds
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> tuple[Path, Path]:
    """The wheel's tritonserver folder, and a repository that `optbuild deploy --to` published
    from a project of small models and four deploy steps."""
    dist = tritonserver_dist()
    root = tmp_path_factory.mktemp("deployed")
    proj = ProjectDir(root / "p")
    proj.write("optbuild.toml", PROJECT)
    proj.write("recipes/net.toml", RECIPE)
    make_mlp(proj.root / "recipes/net.onnx")
    tiny_onnx(proj.root / "recipes/fixed.onnx", dims=[2, 4])
    repo = root / "models"
    run = proj.cli("deploy", "--to", str(repo))
    assert run.returncode == 0, run.stderr
    assert sorted(c.parent.name for c in repo.glob("*/config.pbtxt")) == ["accelerated", "fixed", "ir", "net"]
    return dist, repo


def read_config(path: Path):
    """config.pbtxt as Triton's ModelConfig."""
    return text_format.Parse(path.read_text(), model_config_class()())


def missing_backend(config: Path) -> str:
    """The load error Triton gives a config it parsed and validated, when it lacks the backend.
    It looks for the backend before it checks the inputs and outputs: those a python twin checks."""
    parsed = read_config(config)
    platforms = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt"}
    backend = parsed.backend or platforms[parsed.platform]
    (version,) = parsed.version_policy.specific.versions
    return (f"load failed for model '{parsed.name}': version {version} is at UNAVAILABLE state: "
            f"Invalid argument: {NO_BACKEND.format(backend=backend)};\n")


def test_the_real_server_parses_every_config_deploy_wrote_and_lacks_only_the_backend(deployment, tmp_path):
    """A config the server parsed and validated fails to load on the backend alone (the wheel's
    server has only the python backend); a misspelt field fails on the config."""
    dist, repo = deployment
    configs = sorted(repo.glob("*/config.pbtxt"))
    broken = tmp_path / "broken"
    (broken / "misspelt/1").mkdir(parents=True)
    (broken / "misspelt/config.pbtxt").write_text(
        (repo / "net/config.pbtxt").read_text().replace('"net"', '"misspelt"')
        .replace("max_batch_size", "max_batch"))
    with triton(dist, [repo, broken], tmp_path, "--model-control-mode=explicit") as server:
        errors = {c.parent.name: server.load(c.parent.name) for c in configs}
        assert errors == {c.parent.name: missing_backend(c) for c in configs}, server.log.read_text()[-3000:]
        assert server.load("misspelt") == "failed to load 'misspelt', failed to poll from model repository"
        assert 'has no field named "max_batch"' in server.log.read_text()


def python_twins(repo: Path, folder: Path) -> Path:
    """A repository of python-backend models, one per deployed model and of its config but for
    the backend, each running the deployed model file (named by its parameter ``model``)."""
    for config in sorted(repo.glob("*/config.pbtxt")):
        parsed = read_config(config)
        (version,) = parsed.version_policy.specific.versions
        model = next(p for p in (config.parent / str(version)).iterdir() if p.suffix in (".onnx", ".xml"))
        parsed.platform, parsed.backend = "", "python"
        parsed.parameters["model"].string_value = str(model)
        (folder / parsed.name / str(version)).mkdir(parents=True)
        (folder / parsed.name / "config.pbtxt").write_text(text_format.MessageToString(parsed))
        (folder / parsed.name / str(version) / "model.py").write_text(MODEL_PY)
    return folder


def infer(server: Triton, model: str, x: np.ndarray) -> np.ndarray:
    """The model's output ``y`` for input ``x`` (float32), over HTTP as JSON."""
    status, answer = server.request(f"/v2/models/{model}/infer", {"inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert status == 200, answer
    (y,) = [o for o in answer["outputs"] if o["name"] == "y"]
    return np.array(y["data"], dtype=np.float32).reshape(y["shape"])


def direct(model: Path, x: np.ndarray) -> np.ndarray:
    """``y`` for ``x`` as onnxruntime (model.onnx) or OpenVINO (model.xml) gives it in this process."""
    if model.suffix == ".onnx":
        import onnxruntime as ort

        return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    from optbuild.backends.openvino.loader import import_openvino

    return next(iter(import_openvino().Core().compile_model(str(model), "CPU")({"x": x}).values()))


def test_each_deployed_model_served_by_a_python_model_answers_as_its_runtime_does(deployment, tmp_path):
    """Each deployed config, with the python backend in place of its own, loads (so the server
    checked its inputs and outputs too), and the deployed file answers over HTTP as onnxruntime
    or OpenVINO answers in this process; the same config with a wrong dim does not load."""
    dist, repo = deployment
    backends = python_backend(dist, tmp_path)
    twins = python_twins(repo, tmp_path / "twins")
    wrong = twins / "net/config.pbtxt"
    (twins / "wrong/1").mkdir(parents=True)
    (twins / "wrong/config.pbtxt").write_text(
        wrong.read_text().replace('"net"', '"wrong"').replace("dims: 3", "dims: 0"))
    shutil.copy2(twins / "net/1/model.py", twins / "wrong/1/model.py")
    rng = np.random.default_rng(0)
    with triton(dist, [twins], tmp_path, "--model-control-mode=explicit", backends=backends) as server:
        for config in sorted(repo.glob("*/config.pbtxt")):
            name = config.parent.name
            assert server.load(name) == "", server.log.read_text()[-3000:]
            model = Path(read_config(twins / name / "config.pbtxt").parameters["model"].string_value)
            x = rng.standard_normal([2, 4] if name == "fixed" else [3, 4]).astype(np.float32)
            assert np.array_equal(infer(server, name, x), direct(model, x)), name
        assert "model output 'y' dimension must be integer >= 1" in server.load("wrong")


def test_poll_mode_follows_the_version_deploy_pins_through_a_publish_and_a_rollback(deployment, tmp_path):
    """A server polling the repository loads the version config.pbtxt pins, and only it: the
    next publish switches it to the new version, a rollback back to the previous one. (Its
    repository index keeps naming the version of the first failed load, so the log tells.)"""
    dist, _ = deployment
    proj = ProjectDir(tmp_path / "p")
    proj.write("optbuild.toml", PROJECT)
    proj.write("recipes/net.toml", '[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n'
               '[steps.serve]\nkind = "deploy"\ninput = "src"\n')
    repo = tmp_path / "models"

    def publish(*args: str) -> None:
        run = proj.cli("deploy", "--to", str(repo), *args)
        assert run.returncode == 0, run.stderr

    def loaded(server: Triton) -> list[str]:
        """The versions of net the server tried to load, in order, each once per run of tries."""
        tries = re.findall(r'"loading: net:(\d+)"', server.log.read_text())
        return [v for i, v in enumerate(tries) if i == 0 or tries[i - 1] != v]

    tiny_onnx(proj.root / "recipes/net.onnx", dims=["batch", 4])
    publish()
    with triton(dist, [repo], tmp_path, "--model-control-mode=poll", "--repository-poll-secs=1") as server:
        assert until(lambda: loaded(server)) == ["1"], server.log.read_text()
        tiny_onnx(proj.root / "recipes/net.onnx", dims=["batch", 5])
        publish()
        assert sorted(p.name for p in (repo / "net").iterdir() if p.name.isdigit()) == ["1", "2"]
        assert until(lambda: loaded(server) == ["1", "2"]), loaded(server)
        publish("--rollback", "net")
        assert until(lambda: loaded(server) == ["1", "2", "1"]), loaded(server)
        failures = set(re.findall(r"failed to load 'net' version \d+: (.*)\"", server.log.read_text()))
    assert failures == {f"Invalid argument: {NO_BACKEND.format(backend='onnxruntime')}"}
