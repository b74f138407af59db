"""kind = "deploy" (issue 25): a Triton model repository entry, its config.pbtxt derived from the
model (ONNX on CPU and GPU, an OpenVINO IR, a TensorRT engine from its engine.json) and read back
with Triton's own ModelConfig schema."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from google.protobuf import text_format
from plugins.projects import ProjectDir
from plugins.steps import tiny_onnx

from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint
from optbuild.steps.base import Artifact, StepContext
from optbuild.steps.deploy import Deploy, DeployParams
from optbuild.steps.engine_ort import OrtEngine, OrtEngineParams
from optbuild.steps.triton_schema import model_config_class

PROJECT = '[project]\nrecipes = ["recipes/*.toml"]\n[build]\njobs = 1\n'


def read_config(path: Path):
    """config.pbtxt as Triton parses it."""
    return text_format.Parse(path.read_text(), model_config_class()())


def deploy(tmp_path: Path, inputs: dict[str, Artifact], upstream: dict | None = None, **params) -> Path:
    """Run a deploy step in this process, bound to ``upstream`` steps; its output folder."""
    step = Deploy(DeployParams.model_validate({"input": "x", **params}), tmp_path, tmp_path)
    step.bind(upstream or {})
    out = Path(tempfile.mkdtemp(prefix="out-", dir=tmp_path))
    step.run(StepContext(step_id="net:deploy", base_dir=tmp_path, project_root=tmp_path, out_dir=out,
                         inputs=inputs, host=Fingerprint()))
    return out


def files_of(folder: Path, step: str, primary: str | None) -> Artifact:
    files = {p.name: p for p in folder.iterdir()}
    return Artifact(step=step, dir=folder, files=files, primary=files[primary] if primary else None)


def test_an_onnx_model_on_cpu_gets_a_batched_cpu_config_built_through_a_recipe(tmp_path):
    proj = ProjectDir(tmp_path / "p")
    proj.write("optbuild.toml", PROJECT)
    proj.write("recipes/net.toml", '[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n'
               '[steps.ort]\nkind = "engine"\nbackend = "onnxruntime"\ninput = "src"\nlevel = "basic"\n\n'
               '[steps.serve]\nkind = "deploy"\ninput = "ort"\n')
    tiny_onnx(proj.root / "recipes" / "net.onnx", dims=["batch", 4])
    assert proj.build().ok
    entry = proj.root / "build/net/serve/net"
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*")) == \
        ["1", "1/model.onnx", "config.pbtxt"]
    config = read_config(entry / "config.pbtxt")
    assert (config.name, config.platform, config.max_batch_size) == ("net", "onnxruntime_onnx", 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("x", 11, [4])]  # 11: TYPE_FP32
    assert [(t.name, list(t.dims)) for t in config.output] == [("y", [4])]
    assert config.HasField("dynamic_batching")
    assert [(g.kind, g.count) for g in config.instance_group] == [(2, 1)]  # 2: KIND_CPU


def test_an_ort_format_model_is_not_served_and_the_error_says_to_write_onnx(tmp_path):
    """Triton's onnxruntime backend loads model.onnx; an ORT-format model is for minimal
    onnxruntime builds, so deploying one fails the build, naming the step and the fix."""
    proj = ProjectDir(tmp_path / "p")
    proj.write("optbuild.toml", PROJECT)
    proj.write("recipes/net.toml", '[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n'
               '[steps.ort]\nkind = "engine"\nbackend = "onnxruntime"\ninput = "src"\nformat = "ort"\n\n'
               '[steps.serve]\nkind = "deploy"\ninput = "ort"\n')
    tiny_onnx(proj.root / "recipes" / "net.onnx", dims=["batch", 4])
    result = proj.build()
    assert not result.ok and result.outcomes["net:ort"].status.ok
    error = result.outcomes["net:serve"].error
    assert "net:ort gives model.ort" in error and "use format = 'onnx'" in error, error
    assert not (proj.root / "build/net/serve").exists()


def test_a_cuda_engine_is_served_on_the_gpu_with_the_tensorrt_accelerator_when_asked(tmp_path):
    model = tiny_onnx(tmp_path / "model.onnx")
    cuda = OrtEngine(OrtEngineParams.model_validate({"backend": "onnxruntime", "input": "src",
                                                     "provider": "CUDAExecutionProvider"}), tmp_path, tmp_path)
    out = deploy(tmp_path, {"input": files_of(tmp_path, "net:ort", "model.onnx")}, {"input": cuda},
                 accelerator="tensorrt", accelerator_parameters={"precision_mode": "FP16"},
                 model_name="tiny", max_batch_size=32)
    config = read_config(out / "tiny/config.pbtxt")
    assert [g.kind for g in config.instance_group] == [1]  # KIND_GPU
    assert config.max_batch_size == 32
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert (accelerator.name, dict(accelerator.parameters)) == ("tensorrt", {"precision_mode": "FP16"})
    assert (out / "tiny/1/model.onnx").read_bytes() == model.read_bytes()


def test_a_fixed_first_dim_means_no_batching_and_asking_for_one_names_the_tensor(tmp_path):
    tiny_onnx(tmp_path / "model.onnx", dims=[2, 4])
    artifact = {"input": files_of(tmp_path, "net:src", "model.onnx")}
    config = read_config(deploy(tmp_path, artifact) / "net/config.pbtxt")
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, 4]
    assert not config.HasField("dynamic_batching")
    with pytest.raises(StepError, match=r"max_batch_size = 4 needs a dynamic first dim.*x \[2, 4\]"):
        deploy(tmp_path, artifact, max_batch_size=4)


def test_an_openvino_ir_is_read_from_its_xml(tmp_path):
    from optbuild.backends.openvino import loader

    loader.block_telemetry()
    ov = pytest.importorskip("openvino")
    ir = tmp_path / "ir"
    ir.mkdir()
    ov.save_model(ov.convert_model(str(tiny_onnx(tmp_path / "net.onnx", dims=["batch", 3, 8]))),
                  str(ir / "model.xml"))
    out = deploy(tmp_path, {"input": files_of(ir, "net:ov_fp32", "model.xml")})
    config = read_config(out / "net/config.pbtxt")
    assert (config.backend, config.platform, config.max_batch_size) == ("openvino", "", 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("x", 11, [3, 8])]
    assert [t.name for t in config.output] == ["y"]
    assert [g.kind for g in config.instance_group] == [2]  # KIND_CPU
    assert sorted(p.name for p in (out / "net/1").iterdir()) == ["model.bin", "model.xml"]


def engine_folder(tmp_path: Path) -> Path:
    """model.engine and the engine.json that optbuild.steps.engine_trt writes beside it."""
    folder = tmp_path / "trt"
    folder.mkdir()
    (folder / "model.engine").write_bytes(b"plan bytes")
    (folder / "engine.json").write_text(json.dumps({
        "backend": "tensorrt", "tensorrt_version": "10.13.0", "hardware_compatibility": "none",
        "version_compatible": False,
        "inputs": [{"name": "x", "shape": [-1, 4]}], "outputs": [{"name": "y", "shape": [-1, 4]}],
        "profiles": [{"x": {"min": [1, 4], "opt": [8, 4], "max": [16, 4]}},
                     {"x": {"min": [1, 4], "opt": [32, 4], "max": [64, 4]}}]}))
    return folder


def test_a_tensorrt_engine_gets_its_batch_from_its_profiles_and_types_from_its_source(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    tiny_onnx(source / "model.onnx")
    out = deploy(tmp_path, {"input": files_of(engine_folder(tmp_path), "net:trt", "model.engine"),
                            "source": files_of(source, "net:simplify", "model.onnx")}, source="simplify")
    config = read_config(out / "net/config.pbtxt")
    assert (config.platform, config.max_batch_size) == ("tensorrt_plan", 64)
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("x", 11, [4])]
    assert [g.kind for g in config.instance_group] == [1]  # KIND_GPU
    assert (out / "net/1/model.plan").read_bytes() == b"plan bytes"


def test_a_tensorrt_engine_without_its_source_says_which_step_to_name(tmp_path):
    from optbuild.steps.engine_trt import TensorRTEngine, TensorRTParams

    engine = TensorRTEngine(TensorRTParams.model_validate({"backend": "tensorrt", "input": "simplify"}),
                            tmp_path, tmp_path)
    with pytest.raises(StepError, match='set source = "simplify"'):
        deploy(tmp_path, {"input": files_of(engine_folder(tmp_path), "net:trt", "model.engine")},
               {"input": engine})


def test_a_batch_beyond_the_engines_profiles_fails(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    tiny_onnx(source / "model.onnx")
    with pytest.raises(StepError, match=r"larger than the engine's profiles allow \(64\)"):
        deploy(tmp_path, {"input": files_of(engine_folder(tmp_path), "net:trt", "model.engine"),
                          "source": files_of(source, "net:simplify", "model.onnx")},
               source="simplify", max_batch_size=128)


def test_the_recipes_own_config_is_merged_and_a_wrong_field_names_file_line_and_field(tmp_path):
    proj = ProjectDir(tmp_path / "p")
    proj.write("optbuild.toml", PROJECT)
    recipe = ('[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n[steps.serve]\nkind = "deploy"\ninput = "src"\n'
              'config = "dynamic_batching { max_queue_delay_microseconds: 100 } instance_group [{ count: 2 }]"\n')
    proj.write("recipes/net.toml", recipe)
    tiny_onnx(proj.root / "recipes" / "net.onnx")
    assert proj.build().ok
    config = read_config(proj.root / "build/net/serve/net/config.pbtxt")
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert [g.count for g in config.instance_group] == [2]  # replaced, not added to
    proj.write("recipes/net.toml", recipe.replace("max_queue_delay_microseconds", "max_queue_delay"))
    (problem,) = proj.problems()
    assert problem.startswith(f"{proj.root / 'recipes/net.toml'}:8: steps.serve.config: ")
    assert '(its line 1, column 20): Message type "inference.ModelDynamicBatching" has no field named ' \
        '"max_queue_delay"' in problem
    proj.write("recipes/net.toml", recipe.replace("instance_group", "input [{ name: 'z' }] instance_group"))
    (problem,) = proj.problems()
    assert "config sets input, which the deploy step derives from the model" in problem


@pytest.mark.parametrize("name", ["..", "a/b", ".hidden", ""])
def test_a_model_name_is_one_folder(name):
    with pytest.raises(ValueError, match="is not a model name"):
        DeployParams.model_validate({"input": "x", "model_name": name})


@pytest.mark.parametrize(("config", "message"), [
    ('runtime: "/tmp/libevil.so"', "config sets runtime, which names the backend's library"),
    ("version_policy { all { } }", "config sets version_policy, which is optbuild deploy's: it pins the version"),
    ('default_model_filename: "../../etc/passwd"',
     "config sets default_model_filename to '../../etc/passwd', which is not a plain file name"),
    ("cc_model_filenames { key: '8.9' value: '/srv/other.plan' }",
     "config sets cc_model_filenames['8.9'] to '/srv/other.plan', which is not a plain file name"),
    ("dynamic_batching { } " * 4000, "bytes; at most 65536"),
])
def test_the_recipes_config_may_not_load_another_file_nor_pin_versions_and_is_capped(tmp_path, config, message):
    proj = ProjectDir(tmp_path / "p")
    proj.write("optbuild.toml", PROJECT)
    proj.write("recipes/net.toml", '[steps.src]\nkind = "onnx"\npath = "net.onnx"\n\n[steps.serve]\nkind = "deploy"\n'
               f"input = \"src\"\nconfig = '''{config}'''\n")
    tiny_onnx(proj.root / "recipes" / "net.onnx")
    (problem,) = proj.problems()
    assert problem.startswith(f"{proj.root / 'recipes/net.toml'}:8: steps.serve.config: ")
    assert message in problem


def test_a_plain_model_file_name_in_the_recipes_config_is_kept():
    params = DeployParams.model_validate({"input": "x", "config": 'default_model_filename: "model.plan"'})
    assert params.config == 'default_model_filename: "model.plan"'
