"""kind = "deploy": a Triton Inference Server model repository entry for one model.

The output is what Triton loads from a model repository: ``<model_name>/<version>/model.onnx``
(onnxruntime), ``model.plan`` (TensorRT) or ``model.xml`` + ``model.bin`` (OpenVINO), and
``<model_name>/config.pbtxt`` written from the model itself: its inputs and outputs with
their data types and dims, the batch (``max_batch_size``, with dynamic batching) where every
tensor's first dim is dynamic, KIND_GPU or KIND_CPU from the runtime, and the execution
accelerator the recipe asks for. The configuration is parsed back with Triton's own schema
(optbuild.steps.triton_schema) and checked as Triton checks it when loading, so that a broken
one fails the build, not the server. ``optbuild deploy --to DIR`` then publishes it into a
served repository, switching versions atomically (optbuild.app.publish).

The input is an engine, an ONNX model (a quantize step's) or a select step's choice; the
model is read without its runtime (optbuild.steps.triton), so a deploy host needs none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from optbuild.backends.onnxruntime import providers
from optbuild.common.errors import StepError
from optbuild.common.paths import name_problem
from optbuild.common.recipetable import StepRef
from optbuild.steps.base import ONNX_TOOLS, Artifact, Step, StepContext, StepParams, link_files

_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
# The model file in an upstream artifact without a primary output (a select step whose
# candidates give different ones), in the order looked for.
_MODEL_FILES = ("model.engine", "model.xml", "model.onnx")
MAX_CONFIG = 64 << 10
# Fields of a recipe's config that would make Triton load another file than the one deployed:
# runtime names the backend's shared library; and the version the publish pins.
_REFUSED = {"runtime": "names the backend's library, which Triton would load: the deploy step chooses the "
                       "backend from the model",
            "version_policy": "is optbuild deploy's: it pins the version it publishes"}


# what a select or a benchmark writes beside the model it hands on: not served, not keyed
REPORTS = frozenset({"selection.json", "selection.txt", "benchmark.json"})


class DeployParams(StepParams):
    input: StepRef = Field(examples=["best"])
    """The step whose model Triton serves: an engine (onnxruntime, TensorRT, OpenVINO), a step
    that gives an ONNX model (simplify, quantize...), or a select step's choice."""
    model_name: str | None = Field(None, examples=["classifier"])
    """The model's name in Triton's repository (its folder and config's name): letters, digits,
    _ . - . Not set: the recipe's name."""
    version: int = Field(1, ge=1, examples=[3])
    """The version folder in this step's output; `optbuild deploy` numbers the versions it
    publishes itself."""
    max_batch_size: int | None = Field(None, ge=0, examples=[16])
    """Triton's max_batch_size: 0 turns batching off (dims then include the first). Not set:
    0 when a tensor's first dim is fixed; else a TensorRT engine's largest batch in its profiles,
    or default_batch for a model whose batch dim is unbounded."""
    default_batch: int = Field(8, ge=1, examples=[32])
    """max_batch_size for a model with an unbounded batch dim when max_batch_size is not set."""
    dynamic_batching: bool = Field(True, examples=[False])
    """Let Triton gather requests into batches (when the model batches)."""
    device: Literal["auto", "gpu", "cpu"] = Field("auto", examples=["gpu"])
    """Where the instances run: KIND_GPU or KIND_CPU. 'auto': GPU for a TensorRT engine and an
    onnxruntime model whose provider runs on a GPU (CUDA, ROCm, TensorRT...: its engine step's
    or, after a select, its engine.json's), CPU otherwise."""
    instances: int = Field(1, ge=1, examples=[2])
    """Model instances per device (instance_group count)."""
    accelerator: Literal["tensorrt", "openvino", "cuda"] | None = Field(None, examples=["tensorrt"])
    """For an ONNX model: onnxruntime's execution accelerator in Triton ('tensorrt' on a GPU,
    'openvino' on the CPU); 'cuda' only asserts the GPU (onnxruntime's default there)."""
    accelerator_parameters: dict[str, str] = Field({}, examples=[{"precision_mode": "FP16"}])
    """The accelerator's parameters, e.g. precision_mode = "FP16", max_workspace_size_bytes."""
    source: StepRef | None = Field(None, examples=["simplify"])
    """For a TensorRT engine: the step whose ONNX model it was built from, for the data types of
    its inputs and outputs (engine.json records names and shapes only)."""
    config: str = Field("", examples=['dynamic_batching { max_queue_delay_microseconds: 100 }'])
    """More of Triton's model configuration, in its text format, merged over what is derived
    from the model (a repeated field, such as instance_group, replaces the derived one). It may
    not set name, platform, backend, max_batch_size, input or output; nor runtime (the backend's
    library: Triton would load the file it names), nor version_policy (`optbuild deploy` pins
    the version it publishes); a model file name (default_model_filename, cc_model_filenames)
    must be a plain file name. At most 64 KiB."""

    @field_validator("model_name")
    @classmethod
    def _one_folder(cls, value: str | None) -> str | None:
        if value is not None and not _MODEL_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a model name: letters, digits, _ . - (not first), at most "
                             "100 characters; it becomes a folder of the model repository")
        return value

    @field_validator("config")
    @classmethod
    def _triton_text(cls, value: str) -> str:
        if len(value.encode()) > MAX_CONFIG:
            raise ValueError(f"config is {len(value.encode())} bytes; at most {MAX_CONFIG} (Triton's model "
                             "configuration is a few lines)")
        if value.strip():
            _extra_config(value)
        return value

    @model_validator(mode="after")
    def _accelerator_device(self) -> DeployParams:
        wants = {"tensorrt": "gpu", "cuda": "gpu", "openvino": "cpu"}.get(self.accelerator or "")
        if wants and self.device not in ("auto", wants):
            raise ValueError(f"accelerator {self.accelerator!r} runs on the {wants.upper()}, but device is "
                             f"{self.device!r}")
        if self.accelerator_parameters and self.accelerator in (None, "cuda"):
            raise ValueError("accelerator_parameters need accelerator = 'tensorrt' or 'openvino'")
        return self


def _extra_config(text: str) -> Any:
    """The recipe's ``config`` text as a ModelConfig; ValueError naming the line and field."""
    from optbuild.steps import triton

    try:
        extra = triton.parse(text, "config")
    except StepError as exc:
        raise ValueError(str(exc)) from None
    fields = {d.name for d, _ in extra.ListFields()}
    derived = [name for name in triton.DERIVED if name in fields]
    if derived:
        raise ValueError(f"config sets {', '.join(derived)}, which the deploy step derives from the model "
                         "(use max_batch_size for the batch)")
    for field, why in _REFUSED.items():
        if field in fields:
            raise ValueError(f"config sets {field}, which {why}")
    files = [("default_model_filename", extra.default_model_filename)] * bool(extra.default_model_filename)
    files += [(f"cc_model_filenames[{key!r}]", value) for key, value in sorted(extra.cc_model_filenames.items())]
    for field, name in files:
        if name_problem(name) is not None:
            raise ValueError(f"config sets {field} to {name!r}, which is not a plain file name in the version "
                             "folder (letters, digits, _ . -)")
    return extra


class Deploy(Step[DeployParams]):
    """A Triton model repository entry: the model under its version, and its config.pbtxt."""

    Params = DeployParams
    preload = ONNX_TOOLS
    tools = ("protobuf",)  # writes config.pbtxt with protobuf's text format
    primary_output = None

    def __init__(self, params: DeployParams, base_dir: Path, project_root: Path):
        super().__init__(params, base_dir, project_root)
        self._provider: str | None = None
        self._engine_source: str | None = None

    def bind(self, upstream: Mapping[str, Step]) -> None:
        """Learn what runs the input: an onnxruntime engine's provider (GPU or CPU), a TensorRT
        engine's own input (named in the error when source is missing)."""
        step = upstream.get("input")
        params = getattr(step, "params", None)
        self._provider = getattr(params, "provider", None)
        self._engine_source = getattr(params, "input", None)

    def runs_on(self) -> dict[str, Any] | None:
        return None  # Triton runs it, outside optbuild

    def outputs_read(self, field: str, outputs: dict[str, str]) -> dict[str, str]:
        """The model and the files beside it, not a select's or a benchmark's report: their
        timings change on every run, and a select that chose the same model again must deploy
        nothing new."""
        return {name: digest for name, digest in outputs.items() if name not in REPORTS}

    def run(self, ctx: StepContext) -> None:
        from optbuild.steps import triton

        p = self.params
        artifact = ctx.inputs["input"]
        model = _model_file(artifact)
        name = p.model_name or ctx.step_id.partition(":")[0]
        runtime, signature, files = self._read(ctx, artifact, model)
        provider = self._provider or _manifest(artifact).get("provider")  # a select's choice says it
        gpu = (p.device == "gpu" or p.accelerator in ("tensorrt", "cuda")
               or (p.device == "auto" and (runtime == "tensorrt" or _on_gpu(provider))))
        if runtime == "tensorrt" and not gpu:
            raise StepError("a TensorRT engine runs on a GPU only: device must be 'gpu' or 'auto'")
        if p.accelerator in ("tensorrt", "openvino") and runtime != "onnxruntime":
            raise StepError(f"accelerator {p.accelerator!r} is onnxruntime's; {artifact.step} gives a "
                            f"{runtime} model")
        serving = triton.Serving(name, runtime, p.dynamic_batching, gpu, p.instances,
                                 None if p.accelerator == "cuda" else p.accelerator, dict(p.accelerator_parameters))
        max_batch = triton.batch_size(signature, p.max_batch_size, p.default_batch)
        config = triton.parse(triton.render(signature, serving, max_batch), "the derived config.pbtxt")
        if p.config.strip():
            triton.overlay(config, _extra_config(p.config))
        triton.check(config)
        text = triton.to_text(config)
        folder = ctx.out_dir / name
        link_files({f"{p.version}/{dest}": src for dest, src in files.items()}, folder)
        (folder / "config.pbtxt").write_text(text)
        ctx.log(f"{name}/config.pbtxt:\n{text}")
        ctx.metrics.update(model=name, runtime=runtime, max_batch_size=max_batch,
                           kind="KIND_GPU" if gpu else "KIND_CPU",
                           inputs=len(signature.inputs), outputs=len(signature.outputs))

    def _read(self, ctx: StepContext, artifact: Artifact, model: Path) -> tuple[str, Any, dict[str, Path]]:
        """The runtime, the signature and the files Triton needs (name in the version folder -> file)."""
        from optbuild.steps import triton

        if model.suffix == ".onnx":
            return "onnxruntime", triton.onnx_signature(model), {"model.onnx": model, **_external_data(model)}
        if model.suffix == ".xml":
            weights = model.with_suffix(".bin")
            if not weights.is_file():
                raise StepError(f"{artifact.step} gives {model.name} without {weights.name}")
            return "openvino", triton.openvino_signature(model), {"model.xml": model, "model.bin": weights}
        if model.suffix == ".engine":
            manifest = artifact.files.get("engine.json")
            backend = _manifest(artifact).get("backend")
            if manifest is None or backend != "tensorrt":
                raise StepError(f"{artifact.step} gives {model.name} built by {backend or 'an unknown builder'}"
                                "; Triton's TensorRT backend loads engines of TensorRT ('engine' with backend "
                                "'tensorrt'), not TensorRT-RTX")
            source = ctx.inputs.get("source")
            signature = triton.tensorrt_signature(
                manifest, triton.onnx_signature(_onnx(source)) if source else None, self._engine_source)
            return "tensorrt", signature, {"model.plan": model}
        raise StepError(f"{artifact.step} gives {model.name}: Triton serves model.onnx, a TensorRT engine or an "
                        "OpenVINO IR (an ORT-format model.ort is not one of them: use format = 'onnx')")


def _model_file(artifact: Artifact) -> Path:
    if artifact.primary is not None:
        return artifact.primary
    for name in _MODEL_FILES:
        if name in artifact.files:
            return artifact.files[name]
    raise StepError(f"{artifact.step} gives no model ({', '.join(sorted(artifact.files)) or 'no files'})")


def _onnx(artifact: Artifact) -> Path:
    model = artifact.primary
    if model is None or model.suffix != ".onnx":
        raise StepError(f"source {artifact.step} gives no ONNX model")
    return model


def _manifest(artifact: Artifact) -> dict[str, Any]:
    """The engine.json an engine step wrote beside its model ({} when there is none)."""
    from optbuild.backends.manifest import MANIFEST, ManifestError, read_manifest

    path = artifact.files.get(MANIFEST)
    try:
        return read_manifest(path) if path else {}
    except ManifestError as exc:
        raise StepError(f"{artifact.step}: {exc}") from None


def _external_data(model: Path) -> dict[str, Path]:
    """The files an ONNX model keeps its weights in, beside it (name -> file)."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    def tensors(graph: Any) -> Any:
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                yield from ([attribute.t] if attribute.HasField("t") else [])
                yield from attribute.tensors
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from tensors(sub)

    graph = onnx.load(str(model), load_external_data=False).graph
    files = {ExternalDataInfo(t).location for t in tensors(graph) if uses_external_data(t)}
    for name in files:
        if Path(name).name != name or not (model.parent / name).is_file():
            raise StepError(f"{model.name} keeps weights in {name!r}, which is not a file beside it")
    return {name: model.parent / name for name in sorted(files)}


def _on_gpu(provider: Any) -> bool:
    """Whether onnxruntime runs a model on a GPU there (``providers.Provider.gpu``): Triton
    places its instances on the GPU then."""
    return isinstance(provider, str) and providers.get(provider).gpu
