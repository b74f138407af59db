"""TensorRT / TensorRT-RTX failures explained before and after the builder (issue #9 items 7, 8).

``optbuild.backends.tensorrt.diagnose`` works on log lines and ONNX models, so most of this
runs on any host with onnx: the log lines below are what TensorRT-RTX 1.7.1 logged on a host
without a GPU for the models built here, and TensorRT's CUDA initialization messages as its
users report them. Where TensorRT-RTX is installed the same models go through real builds.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from plugins.trt import make_ctx, requires_rtx, small_convnet

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper
from plugins.thirdparty_models import corpus_model

from optbuild.backends.tensorrt.diagnose import (
    hints,
    model_facts,
    noise_note,
    read_model_facts,
    split_driver_noise,
)
from optbuild.backends.tensorrt.host import gpu_missing
from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint
from optbuild.steps.engine_trt import TensorRTRTXEngine, check_dim_names

GPU_LESS = gpu_missing(Fingerprint()) is not None

CUDA_35 = ("[checkMacros.cpp::catchCudaError::250] Error Code 1: Cuda Runtime (In catchCudaError at "
           "/_src/common/dispatch/checkMacros.cpp:250 (cudaError 35: CUDA driver version is insufficient "
           "for CUDA runtime version))")
CONV_MIXED = ("ITensor::getDimensions: Error Code 4: API Usage Error (/backbone/conv1/Conv: IConvolutionLayer "
              "`input` and `kernel` must be of same type. `input` type is Float but `kernel` is of type Half. "
              "In validateTypes at /_src/optimizer/common/nodes/convolutionNode.cpp:88)")
NO_SHAPE = ("ITensor::getDimensions: Error Code 4: API Usage Error (Output shape can not be computed for node "
            "/backbone/conv1/Conv. In needTypeAndDimensions at /_src/optimizer/shapeof/graphShapeAnalyzer.cpp:3026)")
# TensorRT-RTX's parser errors, as engine_trt_profiles.parser_errors writes them
CONV_NODE = "node '/backbone/conv1/Conv' (Conv): Invalid Node - /backbone/conv1/Conv"
CONV_PARSE_ERROR = f"{CONV_NODE}\n{CONV_MIXED}\n{CUDA_35}\n{NO_SHAPE}\n{CUDA_35}"
LSTM_NODE = ("node 'If_0_then_branch__Inline_0__/decoder/rnn/LSTM' (LSTM): Invalid Node - "
             "If_0_then_branch__Inline_0__/decoder/rnn/LSTM")
LSTM_MIXED = ("ITensor::getDimensions: Error Code 4: API Usage Error ((Unnamed Layer* 698) [Matrix Multiply]: "
              "IMatrixMultiplyLayer must have same input types. `A` is of type Float and `B` is of type Half. In "
              "validateTypes at /_src/optimizer/common/nodes/matrixMultiplyNode.cpp:38)")
LSTM_PARSE_ERROR = f"{LSTM_NODE}\n{LSTM_MIXED}\n{CUDA_35}"
BIAS_NODE = "node 'B1_DequantizeLinear' (DequantizeLinear): Invalid Node - B1_DequantizeLinear"
BIAS_INT32 = ("ITensor::getDimensions: Error Code 4: API Usage Error (B1_DequantizeLinear: input has type Int32 but "
              "must have type FP8, FP4, Int4, Int8, or UInt8. In checkType at /_src/optimizer/common/nodeBase.cpp:456)")
BIAS_PARSE_ERROR = f"{BIAS_NODE}\n{BIAS_INT32}\n{CUDA_35}"
# TensorRT on a host without a usable GPU (NVIDIA/TensorRT#1052, FeiYull/TensorRT-Alpha#106)
CUDA_INIT = ("CUDA initialization failure with error: 35. Please check your CUDA installation:  "
             "http://docs.nvidia.com/cuda/cuda-installation-guide-linux/index.html")

MIXED_HINT = ("hint: node '/backbone/conv1/Conv' mixes float32 and float16 operands (input type is Float but "
              "kernel is of type Half): the fp16 conversion converted only part of it. Keep it in float32: "
              "node_block_list = [\"/backbone/conv1/Conv\"] in the quantize step (mode = \"fp16\") that made "
              "this model.")
BIAS_HINT = ("hint: this Q/DQ model quantizes biases to int32 (DequantizeLinear 'B1_DequantizeLinear' gives the "
             "bias of 'conv1'), which TensorRT does not take. In the quantize step (mode = \"static\") that made "
             "it, set extra_options = { QuantizeBias = false } (biases stay float), with activation_type = "
             "\"int8\" and symmetric_activations = true: symmetric int8, as TensorRT wants.")


# --- models ---------------------------------------------------------------------------------------
def save(model, path: Path, check: bool = True) -> Path:
    if check:
        onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mixed_conv(path: Path) -> Path:
    """A float32 input into a Conv whose kernel is float16: what an fp16 conversion that stopped
    half way leaves (onnx.checker rejects it; TensorRT's parser names the node)."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float16), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], name="/backbone/conv1/Conv", pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [weight])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path, check=False)


def in_a_subgraph(path: Path) -> Path:
    """An If whose then-branch holds the node 'If_0_then_branch__Inline_0__/decoder/rnn/LSTM'."""
    def branch(name: str, node: str):
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"{name}_y"], name=node)], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="If_0",
                          then_branch=branch("then", "If_0_then_branch__Inline_0__/decoder/rnn/LSTM"),
                          else_branch=branch("else", "If_0_else_branch__Inline_0__/decoder/rnn/LSTM"))], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def qdq_convnet(path: Path, quantize_bias: bool) -> Path:
    """conftest_trt's small convnet, quantized by onnxruntime to symmetric int8 Q/DQ; by
    default onnxruntime quantizes conv1's bias to int32."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Images(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.feeds = iter([{"image": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.feeds, None)

    fp32 = small_convnet(path.with_name(path.stem + "_fp32.onnx"))
    quantize_static(str(fp32), str(path), Images(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": quantize_bias})
    return path


def two_inputs(path: Path, a: list, b: list) -> Path:
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, a),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, b)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, a)])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def rtx(tmp_path: Path, **params) -> TensorRTRTXEngine:
    params = {"backend": "tensorrt-rtx", "input": "model", "targets": ["sm86"], **params}
    return TensorRTRTXEngine(TensorRTRTXEngine.Params.model_validate(params), tmp_path, tmp_path)


def rng(low: list[int], opt: list[int], high: list[int]) -> dict:
    return {"min": low, "opt": opt, "max": high}


# --- driver noise -------------------------------------------------------------------------------------
def test_driver_noise_is_set_apart_only_on_a_host_without_a_gpu():
    lines, noise = split_driver_noise([CONV_PARSE_ERROR], gpu_less=True)
    assert lines == [CONV_NODE, CONV_MIXED, NO_SHAPE]
    assert noise == [CUDA_35]  # twice in the message, once here
    assert noise_note(noise) == ("1 CUDA driver message left out, expected on a host without a GPU (TensorRT-RTX "
                                 f"builds without one): {CUDA_35}")
    lines, noise = split_driver_noise([CONV_PARSE_ERROR], gpu_less=False)  # with a GPU: a driver problem
    assert CUDA_35 in lines and noise == []


def test_driver_noise_among_warnings_of_a_build_that_succeeds():
    warnings = ["Unable to determine GPU memory usage", CUDA_INIT,
                "ModelImporter.cpp:1071: Make sure input sr has Int64 binding."]
    shown, noise = split_driver_noise(warnings, gpu_less=True)
    assert shown == ["ModelImporter.cpp:1071: Make sure input sr has Int64 binding."]
    assert noise_note(noise).startswith("2 CUDA driver messages left out, expected on a host without a GPU")


# --- hints for known messages --------------------------------------------------------------------
def test_mixed_float_and_half_names_the_node_and_node_block_list(tmp_path):
    facts = read_model_facts(mixed_conv(tmp_path / "mixed.onnx"))
    lines, _ = split_driver_noise([CONV_PARSE_ERROR], gpu_less=True)
    assert hints(lines, facts) == [MIXED_HINT]
    assert hints(lines, None) == [MIXED_HINT]  # no model to read: the node as TensorRT names it


def test_mixed_types_in_a_subgraph_names_the_control_flow_node(tmp_path):
    facts = read_model_facts(in_a_subgraph(tmp_path / "if.onnx"))
    assert facts.enclosing["If_0_then_branch__Inline_0__/decoder/rnn/LSTM"] == "If_0"
    lines, _ = split_driver_noise([LSTM_PARSE_ERROR], gpu_less=True)
    (hint,) = hints(lines, facts)
    assert hint == (
        "hint: node 'If_0_then_branch__Inline_0__/decoder/rnn/LSTM' mixes float32 and float16 operands (A is of "
        "type Float and B is of type Half): the fp16 conversion converted only part of it. It sits in a subgraph "
        "of 'If_0', where blocking nodes one by one moves the mismatch to the next: keep all of 'If_0' in float32 "
        "with node_block_list = [\"If_0\"] in the quantize step (mode = \"fp16\") that made this model.")


def test_int32_biases_found_and_hinted(tmp_path):
    pytest.importorskip("onnxruntime")
    facts = read_model_facts(qdq_convnet(tmp_path / "qdq.onnx", quantize_bias=True))
    assert facts.int32_biases == [("B1_DequantizeLinear", "conv1")]
    lines, _ = split_driver_noise([BIAS_PARSE_ERROR], gpu_less=True)
    assert hints(lines, facts) == [BIAS_HINT]
    assert hints(["Network must have at least one output."], facts) == []  # another failure: no such hint
    assert read_model_facts(qdq_convnet(tmp_path / "float_bias.onnx", quantize_bias=False)).int32_biases == []


# --- dims of one name, before the builder ------------------------------------------------------------
def test_dims_of_one_name_must_get_one_range(tmp_path):
    facts = read_model_facts(two_inputs(tmp_path / "m.onnx", ["batch", 4], ["batch", 4]))
    assert facts.dim_names == {"a": ["batch", None], "b": ["batch", None]}
    params = TensorRTRTXEngine.Params.model_validate
    same = params({"backend": "tensorrt-rtx", "input": "m", "profiles": [
        {"a": rng([1, 4], [2, 4], [8, 4]), "b": rng([1, 4], [2, 4], [8, 4])}]}).profiles
    check_dim_names(same, facts.dim_names, "m.onnx", declared=False)
    other = params({"backend": "tensorrt-rtx", "input": "m", "profiles": [
        {"a": rng([1, 4], [2, 4], [8, 4]), "b": rng([1, 4], [2, 4], [8, 4])},
        {"a": rng([1, 4], [2, 4], [4, 4]), "b": rng([1, 4], [4, 4], [8, 4])}]}).profiles
    with pytest.raises(StepError) as info:
        check_dim_names(other, facts.dim_names, "m.onnx", declared=False)
    assert str(info.value) == (
        "profile 1 gives the dims that m.onnx names 'batch' different ranges: 'a' dim 0 (min 1, opt 2, max 4); "
        "'b' dim 0 (min 1, opt 4, max 8). TensorRT takes the dims of one name as one size and would reject the "
        "profile: give them equal min, opt and max in profile 1, or, where they are independent, give them "
        "distinct names in the ONNX model (the dim_param of its inputs' dims)")


def test_question_marks_are_one_name_to_tensorrt(tmp_path):
    # PP-OCR's classifier: x [-1, 3, '?', '?'], height and width both named '?'
    facts = model_facts(onnx.load(str(two_inputs(tmp_path / "q.onnx", [1, 3, "?", "?"], [1, 3, "?", "?"]))))
    declared = TensorRTRTXEngine.Params.model_validate({"backend": "tensorrt-rtx", "input": "m", "profiles": [
        {"a": rng([1, 3, 48, 48], [1, 3, 48, 192], [1, 3, 48, 320]),
         "b": rng([1, 3, 48, 48], [1, 3, 48, 192], [1, 3, 48, 320])}]}).profiles
    with pytest.raises(StepError) as info:
        check_dim_names(declared, facts.dim_names, "cls.onnx", declared=True)
    assert str(info.value).startswith(
        "the profile made from the declared input shapes gives the dims that cls.onnx names '?' ('?' is a name "
        "to TensorRT like any other) different ranges: 'a' dim 2 (min 48, opt 48, max 48); 'a' dim 3 (min 48, "
        "opt 192, max 320); 'b' dim 2 (min 48, opt 48, max 48); 'b' dim 3 (min 48, opt 192, max 320). TensorRT "
        "takes the dims of one name as one size and would reject the profile: declare one size or range for "
        "all of them ([inputs.NAME] shape, or the step's inputs), or, where")


# --- real TensorRT-RTX builds ------------------------------------------------------------------------
@requires_rtx
def test_rtx_unequal_dims_of_one_name_fail_before_the_builder(tmp_path):
    model = two_inputs(tmp_path / "m.onnx", ["batch", 4], ["batch", 4])
    step = rtx(tmp_path, profiles=[{"a": rng([1, 4], [2, 4], [4, 4]), "b": rng([1, 4], [4, 4], [8, 4])}])
    with pytest.raises(StepError, match=r"^profile 0 gives the dims that m.onnx names 'batch' different ranges"):
        step.run(make_ctx(tmp_path, model))
    # the profile made from declared shapes: PP-OCR-like '?' height and width declared apart
    model = two_inputs(tmp_path / "q.onnx", [1, 3, "?", "?"], [1, 3, "?", "?"])
    shape = {"shape": [1, 3, 48, [48, 192, 320]]}
    with pytest.raises(StepError, match=r"^the profile made from the declared input shapes gives the dims "
                                        r"that q.onnx names '\?'"):
        rtx(tmp_path, inputs={"a": shape, "b": shape}).run(make_ctx(tmp_path, model))
    step = rtx(tmp_path, inputs={"a": {"shape": [1, 3, [48, 64, 320], [48, 64, 320]]},
                                 "b": {"shape": [1, 3, [48, 64, 320], [48, 64, 320]]}})
    ctx = make_ctx(tmp_path, model)
    step.run(ctx)  # declared alike: TensorRT-RTX builds it
    assert (ctx.out_dir / "model.engine").stat().st_size > 0


@requires_rtx
def test_rtx_mixed_types_get_the_node_block_list_hint_and_no_driver_noise(tmp_path):
    with pytest.raises(StepError) as info:
        rtx(tmp_path).run(make_ctx(tmp_path, mixed_conv(tmp_path / "mixed.onnx")))
    message = str(info.value)
    assert message.startswith("TensorRT-RTX ") and "cannot parse mixed.onnx:\n" in message
    assert "\n" + MIXED_HINT + "\n" in message + "\n"
    quoted = message.split("\nhint: ")[0]
    assert "must be of same type" in quoted
    if GPU_LESS:
        assert "cudaError" not in quoted
        assert message.splitlines()[-1].startswith("not the cause: ")
        assert "expected on a host without a GPU" in message.splitlines()[-1]


@requires_rtx
def test_rtx_int32_biases_get_the_quantize_bias_hint(tmp_path):
    pytest.importorskip("onnxruntime")
    profile = [{"image": rng([1, 3, 32, 32], [1, 3, 32, 32], [4, 3, 64, 64])}]
    with pytest.raises(StepError) as info:
        rtx(tmp_path, profiles=profile).run(make_ctx(tmp_path, qdq_convnet(tmp_path / "qdq.onnx", quantize_bias=True)))
    assert BIAS_HINT in str(info.value).splitlines()
    ctx = make_ctx(tmp_path, qdq_convnet(tmp_path / "float_bias.onnx", quantize_bias=False))
    rtx(tmp_path, profiles=profile).run(ctx)  # as the hint says: it builds
    assert (ctx.out_dir / "model.engine").stat().st_size > 0


@requires_rtx
@pytest.mark.slow
def test_rtx_silero_fp16_hint_leads_past_the_mixed_types(tmp_path):
    """silero-vad through onnxconverter-common's fp16 conversion (what an fp16 quantize step
    runs): its If subgraphs come out half converted. (The quantize step's own onnxruntime check
    rejects this model before an engine step sees it; other tools do not.)"""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    model = onnx.load(str(corpus_model("silero_vad")))
    profile = [{"input": rng([1, 512], [1, 512], [1, 512]), "state": rng([2, 1, 128], [2, 1, 128], [2, 1, 128])}]

    def fp16(name: str, **options) -> Path:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # float32 values truncated to float16's range
            converted = float16.convert_float_to_float16(model, keep_io_types=True, **options)
        return save(converted, tmp_path / name, check=False)

    with pytest.raises(StepError) as info:
        rtx(tmp_path, profiles=profile).run(make_ctx(tmp_path, fp16("silero_fp16.onnx")))
    message = str(info.value)
    assert "node 'If_0_then_branch__Inline_0__/stft/Conv' mixes float32 and float16 operands" in message
    assert "node_block_list = [\"If_0\"] in the quantize step (mode = \"fp16\")" in message
    try:
        rtx(tmp_path, profiles=profile).run(make_ctx(tmp_path, fp16("blocked.onnx", node_block_list=["If_0"])))
    except StepError as exc:  # TensorRT-RTX 1.7 then stops at an internal assertion of its own
        assert "cannot parse" not in str(exc) and "float16" not in str(exc)
