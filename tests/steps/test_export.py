"""kind = "export": PyTorch -> ONNX for real (torch 2.13 CPU), checked against PyTorch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from plugins.edits import compile_to_pycache, edit_within_the_same_second
from plugins.projects import ProjectDir
from plugins.steps import (
    INPUT_NAME,
    MODELS,
    RECIPES,
    REPO,
    build_example,
    context,
    exported_example,
    recipe_step,
)
from pydantic import ValidationError

from optbuild.common.errors import StepError
from optbuild.steps.export import Export, ExportParams

LINEAR = """\
import torch

def build():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2), (torch.randn(3, 4),)
"""


def ort_run(model: Path, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def export(tmp_path: Path, params: dict, base: Path | None = None, out: str = "out"):
    base = base or tmp_path
    step = Export(ExportParams.model_validate(params), base, base)
    ctx = context(tmp_path / out, base)
    step.run(ctx)
    return ctx


def write_model(directory: Path, text: str, name: str = "net.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory / name


# --- the example models ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_example_exports_match_pytorch_at_batch_1_and_3(name, tmp_path_factory):
    import onnx
    import torch

    ctx = exported_example(name, tmp_path_factory)
    path = ctx.out_dir / "model.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    (graph_input,) = model.graph.input
    assert graph_input.name == INPUT_NAME[name]
    assert graph_input.type.tensor_type.shape.dim[0].dim_param == "batch"
    (graph_output,) = model.graph.output
    assert graph_output.name == "logits"
    assert graph_output.type.tensor_type.shape.dim[0].dim_param == "batch"

    module, (example,) = build_example(name)
    for batch in (1, 3):
        x = example[:1].repeat(batch, *[1] * (example.dim() - 1))
        if name == "cnn":
            x = torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = module(x).numpy()
        (logits,) = ort_run(path, {INPUT_NAME[name]: x.numpy()})
        assert logits.shape == (batch, 10 if name == "cnn" else 4)
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)

    m = ctx.metrics
    assert m["exporter"] == "torchscript" and m["opset"] == 17 and m["nodes"] == len(model.graph.node)
    assert 0 <= m["max_abs_error"] < 1e-4 and m["max_rel_error"] < 1e-4
    assert m["dynamic_check"] == f"{INPUT_NAME[name]}[0] = 3"
    json.dumps(m)  # metrics travel as JSON from the worker


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_exports_are_self_contained_and_reproducible(name, tmp_path, tmp_path_factory):
    first = exported_example(name, tmp_path_factory)
    assert [p.name for p in first.out_dir.iterdir()] == ["model.onnx"]  # no external data file
    again = export(tmp_path, recipe_step(name, "export"), base=RECIPES)
    assert (again.out_dir / "model.onnx").read_bytes() == (first.out_dir / "model.onnx").read_bytes()


def test_the_key_covers_the_model_file_its_local_imports_weights_and_extra_files(tmp_path):
    step = Export(ExportParams.model_validate(recipe_step("cnn", "export")), RECIPES, REPO)
    assert step.key_files() == [MODELS / "cnn.py", MODELS / "blocks.py", MODELS / "calib.py"]  # fitted to its scenes
    assert step.tool_names() == ("torch", "onnx")
    step = Export(ExportParams(model="models/transformer.py:build", weights="w/encoder.pt",
                               extra_files=["config.yaml", "models/blocks.py"]), RECIPES, REPO)
    assert step.key_files() == [MODELS / "transformer.py", MODELS / "blocks.py",
                                RECIPES / "w/encoder.pt", RECIPES / "config.yaml"]
    dynamo = Export(ExportParams(model="models/cnn.py:build", exporter="dynamo", opset=18), RECIPES, REPO)
    assert dynamo.tool_names() == ("torch", "onnx", "onnxscript", "onnx-ir")


def test_the_dynamo_exporter_keeps_dynamic_batch_and_no_checkout_paths(tmp_path_factory):
    import onnx

    ctx = exported_example("cnn", tmp_path_factory, exporter="dynamo")
    path = ctx.out_dir / "model.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert ctx.metrics["exporter"] == "dynamo" and ctx.metrics["opset"] == 18
    assert [i.name for i in model.graph.input] == ["image"] and [o.name for o in model.graph.output] == ["logits"]
    assert [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == ["batch", 10]
    for batch in (1, 3):
        (logits,) = ort_run(path, {"image": np.zeros((batch, 3, 64, 64), np.float32)})
        assert logits.shape == (batch, 10)
    data = path.read_bytes()
    assert str(REPO).encode() not in data and b"stack_trace" not in data
    assert [p.name for p in ctx.out_dir.iterdir()] == ["model.onnx"]


# --- dynamic axes ----------------------------------------------------------------------
BAKED = """\
import torch

class Flatten(torch.nn.Module):
    def forward(self, x):
        return x.reshape(int(x.shape[0]), -1) * 2   # int(): a traced constant

def build():
    return Flatten(), (torch.randn(2, 3, 4),)
"""
BAKED_PARAMS = {"model": "net.py:build", "input_names": ["x"], "output_names": ["y"],
                "dynamic_axes": {"x": {"0": "batch"}, "y": {"0": "batch"}}}


def test_a_size_baked_in_by_tracing_fails_the_torchscript_export(tmp_path):
    write_model(tmp_path, BAKED)
    with pytest.raises(StepError, match=r"does not follow its dynamic axes: at x\[0\] = 3") as info:
        export(tmp_path, BAKED_PARAMS)
    assert "exporter = 'dynamo'" in str(info.value)


def test_the_dynamo_exporter_handles_what_tracing_bakes_in(tmp_path):
    import onnx

    write_model(tmp_path, BAKED)
    ctx = export(tmp_path, {**BAKED_PARAMS, "exporter": "dynamo", "opset": 18,
                            "dynamic_axes": {"x": {"0": "batch"}, "y": {"0": "rows"}}})
    (y,) = ort_run(ctx.out_dir / "model.onnx", {"x": np.ones((5, 3, 4), np.float32)})
    assert y.shape == (5, 12) and np.all(y == 2)
    output = onnx.load(str(ctx.out_dir / "model.onnx")).graph.output[0]
    assert output.type.tensor_type.shape.dim[0].dim_param == "rows"  # dynamo's own name replaced


def test_several_inputs_and_outputs_with_their_own_axes(tmp_path):
    write_model(tmp_path, """\
import torch

class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        h = self.proj(x) * mask.unsqueeze(-1)
        return {"hidden": h, "pooled": h.sum(dim=1)}

def build():
    torch.manual_seed(0)
    return Two(), (torch.randn(2, 5, 8), torch.ones(2, 5))
""")
    ctx = export(tmp_path, {"model": "net.py:build", "input_names": ["x", "mask"],
                            "output_names": ["hidden", "pooled"],
                            "dynamic_axes": {"x": {"0": "batch", "1": "seq"}, "mask": {"0": "batch", "1": "seq"},
                                             "hidden": {"0": "batch", "1": "seq"}, "pooled": {"0": "batch"}}})
    assert ctx.metrics["dynamic_check"] == "x[0] = 3, x[1] = 6, mask[0] = 3, mask[1] = 6"
    hidden, pooled = ort_run(ctx.out_dir / "model.onnx", {"x": np.ones((4, 7, 8), np.float32),
                                                          "mask": np.ones((4, 7), np.float32)})
    assert hidden.shape == (4, 7, 8) and pooled.shape == (4, 8)


EXTRA_OUTPUTS = """\
import torch

class Head(torch.nn.Module):
    \"\"\"A detector in eval mode: its predictions, and its feature maps besides.\"\"\"
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x):
        features = self.stem(x)
        return self.head(features), [features, features * 2]

def build():
    torch.manual_seed(0)
    return Head(), (torch.randn(2, 3, 8, 8),)

def predictions_only():
    module, inputs = build()

    class Only(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = module

        def forward(self, x):
            return self.model(x)[0]

    return Only(), inputs
"""


@pytest.mark.parametrize("exporter, opset", [("torchscript", 17), ("dynamo", 18)])
def test_outputs_output_names_does_not_name_are_refused_with_the_fix(tmp_path, exporter, opset):
    """Before: 3 outputs exported for the one name, the extras under the exporter's names."""
    write_model(tmp_path, EXTRA_OUTPUTS)
    params = {"model": "net.py:build", "input_names": ["x"], "output_names": ["boxes"],
              "exporter": exporter, "opset": opset}
    with pytest.raises(StepError) as error:
        export(tmp_path, params)
    message = str(error.value)
    assert message.startswith("net.py:build's forward() returns 3 tensors but output_names names 1 "
                              "['boxes']: the export would also have 2 output(s) you did not ask for, '")
    assert "[2, 4, 8, 8]" in message
    assert "Name every output in output_names" in message and "self.model(x)[0]" in message

    ctx = export(tmp_path, {**params, "output_names": ["boxes", "features", "doubled"]}, out="named")
    assert [o.name for o in onnx_outputs(ctx)] == ["boxes", "features", "doubled"]
    ctx = export(tmp_path, {**params, "model": "net.py:predictions_only"}, out="wrapped")
    assert [o.name for o in onnx_outputs(ctx)] == ["boxes"]


def test_output_names_beyond_the_outputs_are_refused(tmp_path):
    """dynamo dropped the extra name silently."""
    write_model(tmp_path, EXTRA_OUTPUTS)
    with pytest.raises(StepError, match=r"output_names names 4 outputs but net.py:build's forward\(\) returns "
                                        r"3 tensors: \['spare'\] name nothing; remove them from output_names"):
        export(tmp_path, {"model": "net.py:build", "input_names": ["x"], "exporter": "dynamo", "opset": 18,
                          "output_names": ["boxes", "features", "doubled", "spare"]})


def onnx_outputs(ctx) -> list:
    import onnx

    return list(onnx.load(str(ctx.out_dir / "model.onnx")).graph.output)


FRAMES = """\
import torch

class Frames(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], -1, 4).sum(-1)  # the length must be a multiple of 4

def build():
    return Frames(), (torch.randn(1, 8),)
"""


def test_the_dynamic_axes_recheck_uses_the_declared_sizes(tmp_path):
    """One larger (9) is a length this model cannot take: the re-check is skipped; a
    declared range gives it a size it takes (its max, 16), and the re-check runs."""
    write_model(tmp_path, FRAMES)
    params = {"model": "net.py:build", "input_names": ["x"], "output_names": ["y"],
              "dynamic_axes": {"x": {"1": "length"}, "y": {"1": "frames"}}}
    guessed = export(tmp_path, params, out="guessed")
    assert "dynamic_check" not in guessed.metrics
    declared = export(tmp_path, {**params, "inputs": {"x": {"shape": [1, [8, 16]]}}}, out="declared")
    assert declared.metrics["dynamic_check"] == "x[1] = 16"
    assert declared.metrics["dynamic_max_rel_error"] <= 1e-3


def test_a_dynamic_axis_beyond_the_input_rank_is_an_error(tmp_path):
    write_model(tmp_path, LINEAR)
    with pytest.raises(StepError, match="input 'x' has 2 dimensions, so it has no axis 2"):
        export(tmp_path, {"model": "net.py:build", "input_names": ["x"], "dynamic_axes": {"x": {"2": "n"}}})


# --- what real models met, and the fix each message names ------------------------------------
ATTENTION = """\
import functools
import torch


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def attention():
    torch.manual_seed(0)
    return Attention(), (torch.randn(2, 5, 8),)


def encoder_layer(batch=2):
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), (torch.randn(batch, 5, 8),)


def encoder_layer_batch_1():
    return encoder_layer(batch=1)


class Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


def spectrum():
    return Spectrum(), (torch.randn(2, 16),)


def cache_off(forward):  # as transformers' decorators do
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        kwargs.setdefault("use_cache", False)
        return forward(self, *args, **kwargs)
    return wrapper


class Decorated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    @cache_off
    def forward(self, x, mask=None, use_cache=None):
        return self.linear(x)


def decorated():
    torch.manual_seed(0)
    return Decorated(), (torch.randn(2, 4),)


class Keywords(torch.nn.Module):  # the fix the message names
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x=x)


def decorated_called_with_keywords():
    model, inputs = decorated()
    return Keywords(model), inputs
"""
BATCH = {"input_names": ["x"], "dynamic_axes": {"x": {0: "batch"}}}


def test_multi_head_attention_exports_with_the_torchscript_exporter(tmp_path):
    """Its eval-mode fast path is one operator no opset translates; the export turns it off."""
    write_model(tmp_path, ATTENTION)
    ctx = export(tmp_path, {"model": "net.py:attention", **BATCH})
    assert ctx.metrics["opset"] == 17 and ctx.metrics["dynamic_max_rel_error"] < 1e-3
    import torch

    assert torch.backends.mha.get_fastpath_enabled()  # on again for whatever runs next


@pytest.mark.parametrize(("callable_", "message"), [
    ("spectrum", (r"'aten::fft_rfft' to ONNX opset version 17 is not supported; the dynamo exporter "
                  r"translates more operators: exporter = 'dynamo' with opset >= 18, or a higher opset "
                  r"\(up to 20\), or replace aten::fft_rfft in the model")),
    ("decorated", (r"got multiple values for argument 'use_cache'; the TorchScript exporter passes every "
                   r"parameter of forward\(\) positionally.*a wrapper module whose forward\(\) calls the "
                   r"model with keywords.*return_dict=False\), or use exporter = 'dynamo'")),
    ("encoder_layer", (r"'is_causal' .* must be bool, not Tensor; the TorchScript exporter passes every "
                       r"parameter of forward\(\) positionally")),
])
def test_torchscript_failures_name_the_fix(tmp_path, callable_, message):
    write_model(tmp_path, ATTENTION)
    with pytest.raises(StepError, match=message):
        export(tmp_path, {"model": f"net.py:{callable_}"})


def test_the_keyword_wrapper_the_message_names_exports(tmp_path):
    write_model(tmp_path, ATTENTION)
    ctx = export(tmp_path, {"model": "net.py:decorated_called_with_keywords", **BATCH})
    assert ctx.metrics["max_rel_error"] < 1e-3


def test_a_dynamic_batch_of_1_in_a_dynamo_example_is_named_and_a_batch_of_2_exports(tmp_path):
    """torch.export takes the example's size 1 for a constant; the message says to give 2."""
    write_model(tmp_path, ATTENTION)
    dynamo = {"exporter": "dynamo", "opset": 18, **BATCH}
    with pytest.raises(StepError, match=r"does not run with dynamic axes at x\[0\] = 2: .*torch\.export "
                                        r"takes a dynamic axis of size 1 .*\(x\[0\] is 1\): return example "
                                        r"inputs of size 2 or more on every dynamic axis"):
        export(tmp_path, {"model": "net.py:encoder_layer_batch_1", **dynamo})
    ctx = export(tmp_path, {"model": "net.py:encoder_layer", **dynamo}, out="batch2")
    assert ctx.metrics["dynamic_check"] == "x[0] = 3" and ctx.metrics["dynamic_max_rel_error"] < 1e-3


# --- weights -----------------------------------------------------------------------------
def test_weights_are_loaded_into_the_module(tmp_path):
    import torch

    write_model(tmp_path, LINEAR)
    torch.save({"weight": torch.full((2, 4), 0.5), "bias": torch.tensor([1.0, -1.0])}, tmp_path / "w.pt")
    ctx = export(tmp_path, {"model": "net.py:build", "weights": "w.pt", "input_names": ["x"]})
    (y,) = ort_run(ctx.out_dir / "model.onnx", {"x": np.ones((3, 4), np.float32)})
    np.testing.assert_allclose(y, [[3.0, 1.0]] * 3, rtol=1e-6)


def test_weights_that_do_not_fit_or_load_are_named(tmp_path):
    import torch

    write_model(tmp_path, LINEAR)
    torch.save({"weight": torch.zeros(2, 4)}, tmp_path / "partial.pt")
    with pytest.raises(StepError, match=r"weights .*partial\.pt do not fit the module of net\.py:build.*bias"):
        export(tmp_path, {"model": "net.py:build", "weights": "partial.pt"})
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(StepError, match=r"tensor\.pt holds a Tensor, not a state_dict"):
        export(tmp_path, {"model": "net.py:build", "weights": "tensor.pt"}, out="o2")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(StepError, match=r"junk\.pth cannot be loaded with weights_only=True"):
        export(tmp_path, {"model": "net.py:build", "weights": "junk.pth"}, out="o3")


INIT_KIND = """
from optbuild.steps.base import Step, StepParams


class InitParams(StepParams):
    value: float = 0.5


class InitWeights(Step):
    \"\"\"Writes a state_dict for the Linear(4, 2) of net.py: every weight ``value``.\"\"\"

    Params = InitParams
    primary_output = "weights.pt"

    def run(self, ctx):
        import torch

        torch.save({"weight": torch.full((2, 4), self.params.value), "bias": torch.zeros(2)},
                   ctx.out_dir / "weights.pt")
"""


def test_weights_can_come_from_another_steps_output(tmp_path):
    """A checkpoint an earlier step wrote (issue #14): no subclass needed, and the export
    rebuilds when the checkpoint's content changes."""
    from plugins.projects import ProjectDir

    project = ProjectDir(tmp_path / "proj")
    project.write("optbuild.toml", '[kinds]\ninit = "kinds.py:InitWeights"\n')
    project.write("kinds.py", INIT_KIND)
    write_model(project.root / "recipes", LINEAR)
    recipe = ('[steps.init]\nkind = "init"\nvalue = {value}\n\n'
              '[steps.export]\nkind = "export"\nmodel = "net.py:build"\nweights_from = "init"\n'
              'input_names = ["x"]\n')
    project.write("recipes/m.toml", recipe.format(value=0.5))
    assert project.build().ok
    model = project.root / "build" / "m" / "export" / "model.onnx"
    (y,) = ort_run(model, {"x": np.ones((3, 4), np.float32)})
    np.testing.assert_allclose(y, [[2.0, 2.0]] * 3, rtol=1e-6)
    project.write("recipes/m.toml", recipe.format(value=0.25))
    result = project.build()
    assert result.ok and result.outcomes["m:export"].status == "built"
    (y,) = ort_run(model, {"x": np.ones((3, 4), np.float32)})
    np.testing.assert_allclose(y, [[1.0, 1.0]] * 3, rtol=1e-6)


def test_weights_and_weights_from_exclude_each_other():
    with pytest.raises(ValidationError, match="set weights .a file. or weights_from .a step., not both"):
        ExportParams.model_validate({"model": "net.py:build", "weights": "w.pt", "weights_from": "init"})
    # not set, it stays out of the key: caches made before it existed stay valid
    from optbuild.builder.keys import key_params

    assert "weights_from" not in key_params(ExportParams.model_validate({"model": "net.py:build"}))


# --- the callable ------------------------------------------------------------------------
@pytest.mark.parametrize(("source", "ref", "message"), [
    ("def build():\n    raise RuntimeError('no weights here')\n", "net.py:build",
     r"net\.py:build raised RuntimeError: no weights here \(at .*net\.py:2\)"),
    ("def other():\n    pass\n", "net.py:build", r"net\.py:build: .*net\.py has no attribute 'build'"),
    ("build = 42\n", "net.py:build", r"'build' in .*net\.py is an int, not a callable"),
    ("def build():\n    return 'model'\n", "net.py:build", r"must return \(torch\.nn\.Module, .*got a str"),
    ("import torch\ndef build():\n    return torch.nn.ReLU(), 'x'\n", "net.py:build",
     r"its second item is a str"),
    ("def build():\n    return object(), ()\n", "net.py:build", r"its first item is an object"),
    ("import missing_sibling\n", "net.py:build",
     r"net\.py:build: importing .*net\.py failed: ModuleNotFoundError: No module named 'missing_sibling'"),
    ("def build(:\n", "net.py:build", r"importing .*net\.py failed: SyntaxError"),
    ("import torch\ndef build():\n    return torch.nn.Linear(4, 2), (torch.randn(3, 5),)\n", "net.py:build",
     r"the module fails on its own example inputs: RuntimeError"),
    ("", "gone.py:build", r"gone\.py:build: .*gone\.py does not exist"),
])
def test_callable_failures_name_the_file_and_callable(tmp_path, source, ref, message):
    write_model(tmp_path, source)
    with pytest.raises(StepError, match=message):
        export(tmp_path, {"model": ref})


# A library that wraps an import error in its own, as transformers' lazy modules do.
WRAPPED_IMPORT = """\
def load_bert():
    try:
        import torchvision_nms_operator_missing
    except ImportError as exc:
        raise RuntimeError("Failed to import models.bert (look up to see its traceback)") from exc


"""


@pytest.mark.parametrize(("source", "line"), [
    (WRAPPED_IMPORT + "def build():\n    return load_bert()\n", 9),  # the callable raises
    (WRAPPED_IMPORT + "load_bert()\n\ndef build():\n    pass\n", 8),  # importing the file raises
])
def test_a_failed_steps_log_holds_the_users_traceback_and_its_causes(tmp_path, source, line):
    project = ProjectDir(tmp_path / "proj")
    project.write("optbuild.toml", "[build]\njobs = 1\n")
    project.write("recipes/m.toml", '[steps.export]\nkind = "export"\nmodel = "net.py:build"\n')
    net = write_model(project.root / "recipes", source)
    result = project.build()
    assert result.outcomes["m:export"].status == "failed"
    assert "Failed to import models.bert" in result.outcomes["m:export"].error
    # the one line a user reads names what to fix too: the innermost cause
    assert ("caused by ModuleNotFoundError: No module named 'torchvision_nms_operator_missing'"
            in result.outcomes["m:export"].error)
    log = project.read("build/.logs/m/export.log")
    assert "No module named 'torchvision_nms_operator_missing'" in log  # the cause's message
    assert f'File "{net}", line {line}' in log  # the user's own frame
    assert f'File "{net}", line 3, in load_bert' in log  # ... and the frame of the cause


def test_more_input_names_than_example_inputs_is_an_error(tmp_path):
    write_model(tmp_path, LINEAR)
    with pytest.raises(StepError, match="input_names has 2 names but net.py:build returns 1 example"):
        export(tmp_path, {"model": "net.py:build", "input_names": ["x", "extra"]})


def test_local_siblings_import_and_do_not_leak_between_exports(tmp_path):
    model = "import torch\nfrom layers import WIDTH\n\ndef build():\n    return torch.nn.Linear(4, WIDTH), (torch.randn(2, 4),)\n"
    for width, project in ((3, "a"), (5, "b")):
        write_model(tmp_path / project, model)
        write_model(tmp_path / project, f"WIDTH = {width}\n", "layers.py")
    path_before = list(sys.path)
    for width, project in ((3, "a"), (5, "b")):
        ctx = export(tmp_path / project, {"model": "net.py:build", "input_names": ["x"]})
        (y,) = ort_run(ctx.out_dir / "model.onnx", {"x": np.ones((2, 4), np.float32)})
        assert y.shape == (2, width)
    assert sys.path == path_before
    assert "layers" not in sys.modules


# --- parameters --------------------------------------------------------------------------
def test_toml_string_axis_keys_become_ints_and_the_recipes_validate():
    params = ExportParams.model_validate(recipe_step("cnn", "export"))
    assert params.dynamic_axes == {"image": {0: "batch"}, "logits": {0: "batch"}}
    assert ExportParams.model_validate(recipe_step("transformer", "export")).opset == 17
    # what the worker gets back from JSON validates to the same parameters
    assert ExportParams.model_validate(json.loads(params.model_dump_json())) == params


@pytest.mark.parametrize(("change", "message"), [
    ({"opset": 5}, "greater than or equal to 7"),
    ({"opset": 24}, "less than or equal to 23"),
    ({"opset": 21}, "torchscript exporter supports opset <= 20"),
    ({"exporter": "dynamo"}, "dynamo exporter emits opset >= 18"),
    ({"exporter": "onnx"}, "'torchscript' or 'dynamo'"),
    ({"dynamic_axes": {"images": {"0": "batch"}}}, r"names \['images'\] are not in input_names"),
    ({"dynamic_axes": {"image": {"-1": "batch"}}}, "axis -1 is negative"),
    ({"dynamic_axes": {"image": {"first": "batch"}}}, "valid integer"),
    ({"dynamic_axes": {"image": {"0": " "}}}, "needs a symbolic name"),
    ({"dynamic_axes": {"image": {}}}, "no axes given"),
    ({"input_names": ["image", "image"]}, "duplicate names"),
    ({"output_names": ["image"]}, "both inputs and outputs"),
    ({"model": "models/cnn.py"}, "expected 'path/to/file.py:callable'"),
    ({"tolerance": 0}, "greater than 0"),
    ({"opsett": 17}, "Extra inputs are not permitted"),
])
def test_invalid_params_are_validation_errors(change, message):
    params = {"model": "models/cnn.py:build", "input_names": ["image"], "output_names": ["logits"], **change}
    with pytest.raises(ValidationError, match=message):
        ExportParams.model_validate(params)


def test_a_helper_edited_within_the_second_of_an_import_is_exported_as_edited(tmp_path):
    """CPython would run the helper's stale .pyc (same size, same whole-second mtime): the
    export must run the code its key names."""
    proj = ProjectDir.with_test_kinds(tmp_path / "proj")
    proj.write("optbuild.toml", '[project]\nrecipes = ["recipes/*.toml"]\n')
    helper = proj.write("recipes/m/helper.py", "SCALE = 21.25\n")
    proj.write("recipes/m/model.py", "import torch\nfrom helper import SCALE\n\n\n"
               "class Scale(torch.nn.Module):\n    def forward(self, x):\n        return x * SCALE\n\n\n"
               "def build():\n    return Scale(), (torch.ones(1, 2),)\n")
    proj.write("recipes/m.toml", '[steps.export]\nkind = "export"\nmodel = "m/model.py:build"\n')
    assert proj.build().ok
    compile_to_pycache(helper.parent, "helper")
    edit_within_the_same_second(helper, "21.25", "21.75")
    assert proj.build().ok
    model = proj.root / "build" / "m" / "export" / "model.onnx"
    (scaled,) = ort_run(model, {"onnx::Mul_0": np.ones((1, 2), np.float32)})
    assert scaled.tolist() == [[21.75, 21.75]]
