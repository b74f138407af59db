"""kind = "engine", backends "tensorrt" and "tensorrt-rtx": a TensorRT engine from an ONNX model.

One implementation serves both: TensorRT (module ``tensorrt``) and TensorRT for RTX (module
``tensorrt_rtx``) have the same builder API. They differ in what the engine is tied to:

* TensorRT builds on, and for, the GPU of the build host (gpu.0 in CUDA's order): the key
  holds that GPU as the recipe's ``fingerprint`` policy says, and building needs a GPU.
* TensorRT-RTX compiles ahead of time with no GPU at all, for the compute capabilities named
  in ``targets``; the RTX GPU that loads the engine specializes it just in time. Its key holds
  the targets (parameters) and the TensorRT-RTX version, never the build host.

Networks are strongly typed: precision comes from the ONNX graph (fp16 tensors, Q/DQ nodes
for INT8). TensorRT 11 knows nothing else; with TensorRT 10, ``precision_flags`` may still ask
for the old weakly typed FP16/INT8 builder flags.

Before the builder runs, the profiles are checked against the network's inputs and against
the ONNX file's dim names: TensorRT takes dims of one name as one size. When the parser or
the builder fails, the error quotes TensorRT's messages, adds a hint for those it knows (see
``optbuild.backends.tensorrt.diagnose``) and, on a host without a GPU, sets TensorRT-RTX's
CUDA driver messages apart as no cause; after a build that succeeds they are left out of
the warnings.

Where this host has a GPU the new engine runs on, it is then loaded and timed on random
inputs through ``optbuild.backends.tensorrt`` (the runtime code verify steps share).

Nothing heavy is imported at module level: TensorRT is imported inside ``run``, in the worker.
"""

from __future__ import annotations

import importlib
import re
import statistics
import time
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, field_validator, model_validator

from optbuild.backends.base import module_missing
from optbuild.backends.manifest import write_manifest
from optbuild.backends.tensorrt import RUNTIMES, Runtime
from optbuild.backends.tensorrt import profiles as profile_form
from optbuild.backends.tensorrt.diagnose import (
    ModelFacts,
    dim_name_conflicts,
    hints,
    noise_note,
    read_model_facts,
    split_driver_noise,
)
from optbuild.backends.tensorrt.host import (
    RTX_DEFAULT_TARGETS,
    RTX_TARGETS,
    canonical_targets,
    gpu_missing,
    runtime_distribution,
    target_number,
)
from optbuild.backends.tensorrt.logger import capture_logger, errors, quote, warnings
from optbuild.common.atomic import write_atomic
from optbuild.common.errors import StepError, StepUnavailable
from optbuild.common.recipetable import RecipeTable, StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext, StepParams
from optbuild.steps.fields import input_field

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


# --- parameters --------------------------------------------------------------------------
class ShapeRange(RecipeTable):
    """min / opt / max shapes of one input in one optimization profile."""

    min: list[int]
    """The smallest shape the engine accepts, one positive size per dimension."""
    opt: list[int]
    """The shape TensorRT tunes its kernels for."""
    max: list[int]
    """The largest shape the engine accepts."""

    @model_validator(mode="after")
    def _consistent(self) -> ShapeRange:
        ranks = (len(self.min), len(self.opt), len(self.max))
        if len(set(ranks)) != 1:
            raise ValueError(f"min, opt and max must have the same rank, got ranks {ranks[0]}, "
                             f"{ranks[1]} and {ranks[2]}")
        if ranks[0] == 0:
            raise ValueError("a shape needs at least one dimension")
        for label, dims in (("min", self.min), ("opt", self.opt), ("max", self.max)):
            if any(d < 1 for d in dims):
                raise ValueError(f"dimensions must be positive, {label} is {dims}")
        for axis, (lo, mid, hi) in enumerate(zip(self.min, self.opt, self.max)):
            if not lo <= mid <= hi:
                raise ValueError(f"need min <= opt <= max in every dimension; dimension {axis} "
                                 f"has min {lo}, opt {mid}, max {hi}")
        return self


# One optimization profile: input name -> its shape range.
Profile = dict[str, ShapeRange]

_TRT_ONLY = ("hardware_compatibility", "version_compatible", "precision_flags", "fingerprint")
_RTX_ONLY = ("targets",)


class EngineParams(StepParams):
    """Parameters both backends share."""

    # The other backend's parameters, rejected by name, and that backend.
    _foreign: ClassVar[tuple[tuple[str, ...], str]] = ((), "")

    input: StepRef = input_field("built into an engine. Precision comes from the graph: a quantize step "
                                 "with mode 'fp16' for FP16, a Q/DQ model (mode 'static', activation_type "
                                 "'int8', symmetric) for INT8.")
    profiles: list[Profile] = Field(default_factory=list, examples=[profile_form.EXAMPLE])
    """Optimization profiles for dynamic inputs: a list of tables, each mapping input name -> {
    min = [...], opt = [...], max = [...] } (shapes of the same rank, min <= opt <= max in every
    dimension; a dimension the model fixes must be that size in all three; dimensions the ONNX
    model gives one name, within or across inputs, must be given equal sizes, as TensorRT takes
    them as one, checked before building). Every dynamic input must appear in every profile;
    required when the model has dynamic inputs whose shapes 'inputs' does not declare (checked
    when it is parsed). Empty: one profile from the declared shapes, or none when the model's
    inputs are all static. At run time each input batch must fit one profile."""
    inputs: StepInputs = Field(None, examples=[{"x": {"shape": [[1, 4, 8], 3, 224, 224]}}])
    """What the model's inputs take (see 'Model inputs'); replaces the recipe's [inputs.NAME]
    entry of the same input. Without profiles, one profile is made from the declared shapes:
    min, opt and max of each dim's range (dims the model gives one name must be declared
    alike)."""
    optimization_level: int = Field(3, ge=0, le=5, examples=[5])
    """TensorRT's builder optimization level: 0 (fastest build) to 5 (slowest build, most
    tactics tried)."""
    workspace: int | None = Field(None, examples=["2 GiB"])
    """Limit of the builder's workspace memory pool: bytes, or a size string such as "1 GiB" or
    "512MB". Not set: TensorRT's default (the device's memory)."""

    @field_validator("profiles", mode="before")
    @classmethod
    def _profiles_form(cls, value: Any) -> Any:
        if (problem := profile_form.form_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("profiles")
    @classmethod
    def _profiles_name_inputs(cls, value: list[Profile]) -> list[Profile]:
        for index, profile in enumerate(value):
            if not profile:
                raise ValueError(f"profile {index} names no input")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_keys(cls, data: Any) -> Any:
        foreign, owner = cls._foreign
        if isinstance(data, dict) and (keys := [k for k in foreign if k in data]):
            raise ValueError(f"{', '.join(map(repr, keys))} only apply to backend {owner!r}")
        return data

    @field_validator("workspace", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if isinstance(value, str):
            from optbuild.common.units import parse_size

            value = parse_size(value)
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            raise ValueError("workspace must be a positive size")
        return value


class TensorRTParams(EngineParams):
    _foreign = (_RTX_ONLY, "tensorrt-rtx")

    backend: Literal["tensorrt"] = Field(examples=["tensorrt"])
    """Selects this engine: TensorRT, built on and for this host's NVIDIA GPU."""
    hardware_compatibility: Literal["none", "ampere+", "same-compute-capability"] = Field(
        "none", examples=["ampere+"])
    """Which GPUs the engine may run on besides the build GPU's kind: 'none' (that kind only),
    'ampere+' (any Ampere or newer GPU; needs one to build) or 'same-compute-capability' (GPUs
    of the build GPU's compute capability)."""
    version_compatible: bool = Field(False, examples=[True])
    """Build an engine that later TensorRT versions of the same major version can load."""
    precision_flags: list[Literal["fp16", "bf16", "int8", "fp8", "int4", "fp4"]] = Field(
        default_factory=list, examples=[["fp16"]])
    """TensorRT 10 only: weakly typed builder precision flags (fp16, bf16, int8, fp8, int4,
    fp4). TensorRT 11 builds strongly typed networks only and rejects them: put the precision in
    the ONNX graph instead. Empty: strongly typed."""
    fingerprint: Literal["exact", "compute-capability", "hardware-compatibility"] = Field(
        "compute-capability", examples=["exact"])
    """What of the build GPU enters the key: 'exact' (its model and compute capability),
    'compute-capability', or 'hardware-compatibility' (nothing beyond the hardware_compatibility
    level; needs it other than 'none')."""

    @field_validator("precision_flags")
    @classmethod
    def _canonical_flags(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @model_validator(mode="after")
    def _policy(self) -> TensorRTParams:
        if self.fingerprint == "hardware-compatibility" and self.hardware_compatibility == "none":
            raise ValueError("fingerprint = 'hardware-compatibility' needs hardware_compatibility "
                             "'ampere+' or 'same-compute-capability' (with 'none' the engine "
                             "is tied to the build GPU)")
        return self


class TensorRTRTXParams(EngineParams):
    _foreign = (_TRT_ONLY, "tensorrt")

    backend: Literal["tensorrt-rtx"] = Field(examples=["tensorrt-rtx"])
    """Selects this engine: TensorRT for RTX, compiled ahead of time without a GPU."""
    targets: list[str] = Field(
        default_factory=list,
        description="Compute capabilities to build for, written \"sm86\", \"sm_86\" or \"8.6\" "
                    "(known to TensorRT-RTX: " + ", ".join(RTX_TARGETS) + "; checked against the "
                    "installed TensorRT-RTX when the step runs). They enter the key instead of the "
                    "build host. Empty: TensorRT-RTX's default set (" + ", ".join(RTX_DEFAULT_TARGETS)
                    + "), portable across its Ampere-and-later RTX GPUs.",
        examples=[["sm86", "sm89"]])

    @field_validator("targets")
    @classmethod
    def _canonical_targets(cls, value: list[str]) -> list[str]:
        return canonical_targets(value)


# --- model inputs and profiles --------------------------------------------------------------
def _describe_inputs(inputs: list[tuple[str, tuple[int, ...]]]) -> str:
    return ", ".join(f"{name} {list(shape)}{' (dynamic)' if any(d < 0 for d in shape) else ''}"
                     for name, shape in inputs)


def declared_profiles(inputs: list[tuple[str, tuple[int, ...]]], decls: InputDecls | None) -> list[Profile]:
    """One profile from the declared shapes of the network's dynamic inputs; [] when one of
    them is not declared (static inputs need none)."""
    from optbuild.backends.base import TensorSpec
    from optbuild.model.inputdecl import profile_shapes

    specs = [TensorSpec(name, "", tuple(d if d >= 0 else None for d in shape)) for name, shape in inputs]
    shapes = profile_shapes(specs, decls)
    if not shapes:
        return []
    return [{name: ShapeRange(min=low, opt=opt, max=high) for name, (low, opt, high) in shapes.items()}]


def check_profiles(profiles: list[Profile], inputs: list[tuple[str, tuple[int, ...]]],
                   model: str) -> None:
    """StepError unless ``profiles`` fit the network ``inputs`` ((name, shape), -1 = dynamic)."""
    shapes = dict(inputs)
    real = _describe_inputs(inputs)
    dynamic = [name for name, shape in inputs if any(d < 0 for d in shape)]
    for index, profile in enumerate(profiles):
        unknown = [name for name in profile if name not in shapes]
        if unknown:
            raise StepError(f"profile {index} names input(s) {', '.join(map(repr, unknown))}, which "
                            f"{model} does not have; its inputs are: {real}")
    if dynamic and not profiles:
        example = ", ".join(f"{name} = {{ min = [...], opt = [...], max = [...] }}" for name in dynamic)
        raise StepError(f"{model} has dynamic inputs ({_describe_inputs([(n, shapes[n]) for n in dynamic])}) "
                        f"and the step gives no optimization profile: add profiles = [{{ {example} }}], or "
                        f"declare the inputs' shapes ([inputs.{dynamic[0]}] shape = [...], a dim as "
                        "[min, opt, max]) and one profile is made from them")
    for index, profile in enumerate(profiles):
        missing = [name for name in dynamic if name not in profile]
        if missing:
            raise StepError(f"profile {index} gives no shapes for dynamic input(s) "
                            f"{', '.join(map(repr, missing))} of {model} (inputs: {real})")
        for name, rng in profile.items():
            shape = shapes[name]
            if len(rng.min) != len(shape):
                raise StepError(f"profile {index}, input {name!r}: the model's input has rank "
                                f"{len(shape)} {list(shape)}, the profile's shapes rank {len(rng.min)}")
            for axis, fixed in enumerate(shape):
                if fixed >= 0 and not rng.min[axis] == rng.opt[axis] == rng.max[axis] == fixed:
                    raise StepError(
                        f"profile {index}, input {name!r}: dimension {axis} is fixed at {fixed} in "
                        f"the model, but the profile gives min {rng.min[axis]}, opt {rng.opt[axis]}, "
                        f"max {rng.max[axis]}")


def check_dim_names(profiles: list[Profile], dim_names: Mapping[str, Sequence[str | None]], model: str,
                    declared: bool) -> None:
    """StepError unless the dims that ``model`` gives one name (``dim_names``: input -> each
    dim's name, from the ONNX file) get the same min / opt / max in every profile: TensorRT
    takes them as one size, and its builder's error names neither the input nor the profile.
    ``declared``: the profile was made from the declared input shapes, not written."""
    for index, profile in enumerate(profiles):
        shapes = {name: (rng.min, rng.opt, rng.max) for name, rng in profile.items()}
        for dim_name, dims in dim_name_conflicts(shapes, dim_names):
            where = "the profile made from the declared input shapes" if declared else f"profile {index}"
            change = ("declare one size or range for all of them ([inputs.NAME] shape, or the step's "
                      "inputs)" if declared else f"give them equal min, opt and max in profile {index}")
            also = " ('?' is a name to TensorRT like any other)" if dim_name == "?" else ""
            raise StepError(
                f"{where} gives the dims that {model} names {dim_name!r}{also} different ranges: "
                f"{'; '.join(dims)}. TensorRT takes the dims of one name as one size and would reject "
                f"the profile: {change}, or, where they are independent, give them distinct names in "
                "the ONNX model (the dim_param of its inputs' dims)")


def _parser_errors(parser: Any) -> list[str]:
    lines = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        desc = error.desc()
        node = error.node() if hasattr(error, "node") else -1
        name = error.node_name() if hasattr(error, "node_name") else ""
        op = error.node_operator() if hasattr(error, "node_operator") else ""
        if node >= 0 or name:
            where = f"node {name!r}" if name else f"node #{node}"
            where += f" ({op})" if op else ""
            lines.append(f"{where}: {desc}")
        else:
            lines.append(desc)
    return lines


# --- persistent state -------------------------------------------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "unknown"


def timing_cache_file(state_dir: Path, backend: str, version: str, device: str) -> Path:
    """Where the timing cache of ``backend`` ``version`` for ``device`` lives."""
    return Path(state_dir) / "tensorrt-timing" / f"{_slug(backend)}-{_slug(version)}-{_slug(device)}.cache"


def _cache_entries(cache: Any) -> int | None:
    try:
        return len(cache.queryKeys())
    except (AttributeError, RuntimeError):
        return None


# --- the step ---------------------------------------------------------------------------------
EP = TypeVar("EP", bound=EngineParams)  # the parameters of one of the two TensorRT kinds


class _TensorRTBase(Step[EP]):
    """Builds ``model.engine`` from the ONNX primary output of the step named by ``input``."""

    version = "1"
    primary_output = "model.engine"
    # The Python module and how to get it; set by the two backends below.
    runtime: ClassVar[Runtime]  # which TensorRT: module, label, pip extra, backend name

    # --- what the key covers -------------------------------------------------------------
    def tool_names(self) -> tuple[str, ...]:
        return (runtime_distribution(self.runtime.module),)

    def _module_missing(self) -> str | None:
        return module_missing(self.runtime.module, self.runtime.label, self.runtime.extra)

    # --- execution -----------------------------------------------------------------------
    def run(self, ctx: StepContext) -> None:
        model = self._model(ctx)
        trt = importlib.import_module(self.runtime.module)
        version = str(trt.__version__)
        self._check_api(trt, version)
        facts = read_model_facts(model)
        logger = capture_logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(self._network_flags(trt))
        parser = trt.OnnxParser(network, logger)
        self._configure_parser(trt, parser)
        if not parser.parse_from_file(str(model)):
            raise self._failure(ctx, f"{self.runtime.label} {version} cannot parse {model.name}",
                                _parser_errors(parser) or errors(trt, logger), facts)
        if network.num_outputs == 0:  # protobuf reads some junk as an empty ModelProto
            raise StepError(f"{self.runtime.label} {version} read {model.name} as a model with no graph "
                            "outputs: not an ONNX model, or an empty one")
        inputs = [(t.name, tuple(t.shape)) for t in (network.get_input(i) for i in range(network.num_inputs))]
        outputs = [(t.name, tuple(t.shape)) for t in (network.get_output(i) for i in range(network.num_outputs))]
        profiles = self.params.profiles or declared_profiles(inputs, self.params.inputs)
        check_profiles(profiles, inputs, model.name)
        if facts is not None:
            check_dim_names(profiles, facts.dim_names, model.name, declared=not self.params.profiles)
        else:
            ctx.log(f"dims of one name not checked against the profiles: onnx is not installed or "
                    f"cannot read {model.name} (pip install 'optbuild[onnx]')")
        if profiles and not self.params.profiles:
            ctx.log(f"profile from the declared inputs: {profiles[0]}")

        config = builder.create_builder_config()
        config.builder_optimization_level = self.params.optimization_level
        if self.params.workspace is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.params.workspace)
        self._configure(trt, config, ctx)
        for index, profile in enumerate(profiles):
            trt_profile = builder.create_optimization_profile()
            for name, rng in profile.items():
                trt_profile.set_shape(name, rng.min, rng.opt, rng.max)
            if config.add_optimization_profile(trt_profile) < 0:
                raise self._failure(ctx, f"{self.runtime.label} rejected profile {index}",
                                    errors(trt, logger), facts)
        cache = self._load_timing_cache(trt, config, ctx, version)

        started = time.perf_counter()
        plan = builder.build_serialized_network(network, config)
        build_s = time.perf_counter() - started
        shown, noise = split_driver_noise(warnings(trt, logger), self._gpu_less(ctx))
        for message in shown:
            ctx.log(f"{self.runtime.label}: {message}")
        if noise:
            ctx.log(f"{self.runtime.label}: {noise_note(noise)}")
        if plan is None:
            raise self._failure(ctx, f"{self.runtime.label} {version} could not build an engine from {model.name}",
                                errors(trt, logger), facts)
        engine_path = ctx.out_dir / "model.engine"
        engine_path.write_bytes(plan)
        self._write_manifest(ctx, version, inputs, outputs, profiles)
        ctx.metrics["build_s"] = round(build_s, 3)
        ctx.metrics["engine_bytes"] = engine_path.stat().st_size
        self._save_timing_cache(trt, config, cache, ctx)
        ctx.log(f"{self.runtime.label} {version}: {model.name} -> model.engine "
                f"({ctx.metrics['engine_bytes']} bytes) in {build_s:.2f} s")
        self._maybe_infer(ctx, trt, logger, plan)

    @staticmethod
    def _gpu_less(ctx: StepContext) -> bool:
        """Whether this host has no NVIDIA GPU: its CUDA driver errors are then noise."""
        return gpu_missing(ctx.host) is not None

    def _failure(self, ctx: StepContext, headline: str, messages: list[str], facts: ModelFacts | None) -> StepError:
        """The error for a failed parse or build: TensorRT's messages, hints for those it knows,
        and the CUDA driver noise of a host without a GPU set apart as no cause."""
        lines, noise = split_driver_noise(messages, self._gpu_less(ctx))
        text = [f"{headline}:", quote(lines or ["(no error message; run with a verbose logger)"])]
        text += hints(lines, facts)
        if noise:
            text.append(f"not the cause: {noise_note(noise)}")
        return StepError("\n".join(text))

    def _model(self, ctx: StepContext) -> Path:
        artifact = ctx.inputs.get("input")
        if artifact is None or artifact.primary is None:
            raise StepError(f"step {self.params.input!r} has no primary output to build an engine from")
        if artifact.primary.suffix != ".onnx":
            raise StepError(f"an engine is built from an ONNX model, but step {artifact.step!r} "
                            f"produces {artifact.primary.name}")
        return artifact.primary

    def _network_flags(self, trt: Any) -> int:
        strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if strongly_typed is None or getattr(self.params, "precision_flags", None):
            return 0
        return 1 << int(strongly_typed)

    def _check_api(self, trt: Any, version: str) -> None:
        """Before any work: what the recipe asks of the installed TensorRT exists."""

    def _configure_parser(self, trt: Any, parser: Any) -> None:
        pass

    def _configure(self, trt: Any, config: Any, ctx: StepContext) -> None:
        raise NotImplementedError

    def _timing_device(self, ctx: StepContext) -> str | None:
        """What the timing cache is specific to besides backend and version; None: no cache."""
        return None

    def _load_timing_cache(self, trt: Any, config: Any, ctx: StepContext, version: str) -> Any:
        device = self._timing_device(ctx)
        if device is None or ctx.state_dir is None:
            ctx.metrics.setdefault("timing_cache", "disabled")
            return None
        path = timing_cache_file(ctx.state_dir, self.runtime.backend, version, device)
        data = path.read_bytes() if path.is_file() else b""
        try:
            cache = config.create_timing_cache(data)
            usable = cache is not None and config.set_timing_cache(cache, False)
        except Exception:  # a damaged file; TensorRT's error types vary
            usable = False
        if not usable:
            ctx.log(f"timing cache {path.name} is unusable for this build; starting a new one")
            data, cache = b"", config.create_timing_cache(b"")
            config.set_timing_cache(cache, False)
        # The cache object must outlive the build: it travels in the returned state.
        return {"cache": cache, "path": path, "loaded": len(data), "entries": _cache_entries(cache)}

    def _save_timing_cache(self, trt: Any, config: Any, state: Any, ctx: StepContext) -> None:
        if state is None:
            return
        cache, path = state["cache"], state["path"]
        after_entries = _cache_entries(cache)
        serialized = bytes(memoryview(cache.serialize()))
        if not state["loaded"]:
            status = "miss"
        elif after_entries is not None and state["entries"] is not None:
            status = "hit" if after_entries == state["entries"] else "partial"
        else:
            status = "hit" if len(serialized) == state["loaded"] else "partial"
        ctx.metrics["timing_cache"] = status
        ctx.metrics["timing_cache_hit"] = status == "hit"
        if after_entries is not None:
            ctx.metrics["timing_cache_entries"] = after_entries
        if status != "hit":
            # Merge what a concurrent build may have written meanwhile, then replace atomically.
            if path.is_file():
                try:
                    other = config.create_timing_cache(path.read_bytes())
                    cache.combine(other, False)
                    serialized = bytes(memoryview(cache.serialize()))
                except Exception as exc:  # a foreign or damaged file: ours replaces it
                    ctx.log(f"timing cache {path.name} not merged: {exc}")
            write_atomic(path, serialized)
        ctx.metrics["timing_cache_bytes"] = len(serialized)

    def _write_manifest(self, ctx: StepContext, version: str, inputs: list, outputs: list,
                        profiles: list[Profile]) -> None:

        manifest = {
            "backend": self.runtime.backend,
            "tensorrt_version": version,
            "inputs": [{"name": n, "shape": list(s)} for n, s in inputs],
            "outputs": [{"name": n, "shape": list(s)} for n, s in outputs],
            "profiles": [{name: rng.model_dump() for name, rng in p.items()} for p in profiles],
            **self._manifest_extra(),
        }
        write_manifest(ctx.out_dir, manifest)

    def _manifest_extra(self) -> dict[str, Any]:
        return {}

    def runs_on(self) -> dict[str, Any]:
        return {"backend": self.runtime.backend, **self._manifest_extra()}

    # --- an inference check, where a suitable GPU is present ------------------------------
    def _run_targets(self) -> list[str]:
        """The compute capabilities the engine runs on; empty: the backend's default."""
        return []

    def _maybe_infer(self, ctx: StepContext, trt: Any, logger: Any, plan: Any, runs: int = 10) -> None:
        """Load the new engine and time ``runs`` inferences on random data at profile 0's
        opt shapes, where this host can; otherwise record why not (the build stands)."""
        from optbuild.backends.tensorrt.loader import load_engine
        from optbuild.backends.tensorrt.runner import TrtRunner, UnsupportedEngine, random_feed

        times = []
        try:
            def load() -> Any:
                return load_engine(trt, plan, ctx.host, runtime=self.runtime, targets=self._run_targets(),
                                   logger=logger)

            with TrtRunner(load) as runner:
                feed = random_feed(runner)
                for _ in range(runs + 1):
                    runner.infer(feed)
                    assert runner.last_inference_ms is not None  # infer() has just timed it
                    times.append(runner.last_inference_ms)
        except (StepUnavailable, UnsupportedEngine) as exc:
            ctx.metrics["inference"] = f"skipped: {exc}"
            ctx.log(f"inference check skipped: {exc}")
            return
        figures = {"first_run_ms": round(times[0], 3), "latency_ms": round(statistics.median(times[1:]), 4)}
        ctx.metrics.update(figures)
        ctx.metrics["inference"] = "ok"
        ctx.log(f"inference on gpu.0: {figures['latency_ms']:.3f} ms (first run "
                f"{figures['first_run_ms']:.1f} ms)")


_HW_LEVELS = {"ampere+": "AMPERE_PLUS", "same-compute-capability": "SAME_COMPUTE_CAPABILITY"}


class TensorRTEngine(_TensorRTBase[TensorRTParams]):
    """TensorRT (10.x, 11.x): builds on and for this host's GPU; needs an NVIDIA GPU."""

    Params = TensorRTParams
    preload = ONNX_TOOLS
    runtime = RUNTIMES["tensorrt"]

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        policy, level = self.params.fingerprint, self.params.hardware_compatibility
        if policy == "exact":
            fields: tuple[str, ...] = ("gpu.0.name", "gpu.0.compute_capability")
        elif policy == "compute-capability" or level == "same-compute-capability":
            fields = ("gpu.0.compute_capability",)
        else:  # hardware-compatibility, ampere+: the level is in the params already
            fields = ()
        return {name: host.get(name) for name in fields}

    def unavailable(self, host: Fingerprint) -> str | None:
        needs = []
        if (error := gpu_missing(host)) is not None:
            needs.append(f"an NVIDIA GPU to build on (here: {error}; backend 'tensorrt-rtx' "
                         "builds without one)")
        elif self.params.hardware_compatibility == "ampere+":
            cc = host.get("gpu.0.compute_capability")
            if cc and float(cc) < 8.0:
                needs.append(f"an Ampere or newer GPU for hardware_compatibility = 'ampere+' "
                             f"(gpu.0 is {host.get('gpu.0.name')}, compute capability {cc})")
        if (missing := self._module_missing()) is not None:
            needs.append(missing)
        return "needs " + " and ".join(needs) if needs else None

    def _check_api(self, trt: Any, version: str) -> None:
        flags = self.params.precision_flags
        major = int(version.split(".")[0])
        absent = [f for f in flags if getattr(trt.BuilderFlag, f.upper(), None) is None]
        if flags and (major >= 11 or absent):
            raise StepError(
                f"TensorRT {version} builds strongly typed networks only: precision_flags "
                f"{flags} do not exist there. Put the precision in the ONNX graph (fp16 tensors "
                "for FP16, QuantizeLinear/DequantizeLinear nodes for INT8) and leave "
                "precision_flags empty.")
        level = _HW_LEVELS.get(self.params.hardware_compatibility)
        if level and getattr(getattr(trt, "HardwareCompatibilityLevel", None), level, None) is None:
            raise StepError(f"TensorRT {version} has no hardware compatibility level {level}")

    def _configure_parser(self, trt: Any, parser: Any) -> None:
        # Version-compatible engines may not embed the InstanceNormalization plugin.
        native = getattr(getattr(trt, "OnnxParserFlag", None), "NATIVE_INSTANCENORM", None)
        if self.params.version_compatible and native is not None:
            parser.set_flag(native)

    def _configure(self, trt: Any, config: Any, ctx: StepContext) -> None:
        for flag in self.params.precision_flags:
            config.set_flag(getattr(trt.BuilderFlag, flag.upper()))
        if (level := _HW_LEVELS.get(self.params.hardware_compatibility)) is not None:
            config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)
        if self.params.version_compatible:
            config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)

    def _timing_device(self, ctx: StepContext) -> str | None:
        name = ctx.host.get("gpu.0.name") or "unknown-gpu"
        cc = str(ctx.host.get("gpu.0.compute_capability") or "").replace(".", "")
        return f"{name}-sm{cc}"

    def _manifest_extra(self) -> dict[str, Any]:
        return {"hardware_compatibility": self.params.hardware_compatibility,
                "version_compatible": self.params.version_compatible}


class TensorRTRTXEngine(_TensorRTBase[TensorRTRTXParams]):
    """TensorRT for RTX: compiles ahead of time, with no GPU, for the named compute capabilities."""

    Params = TensorRTRTXParams
    runtime = RUNTIMES["tensorrt-rtx"]

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        return {}  # the targets (parameters) replace the build host's GPU

    def unavailable(self, host: Fingerprint) -> str | None:
        missing = self._module_missing()
        return f"needs {missing}" if missing else None

    def _offered_targets(self, trt: Any) -> dict[str, Any]:
        return {name.lower(): member for name, member in trt.ComputeCapability.__members__.items()
                if re.fullmatch(r"SM\d+", name)}

    def _check_api(self, trt: Any, version: str) -> None:
        offered = self._offered_targets(trt)
        unknown = [t for t in self.params.targets if t not in offered]
        if unknown:
            raise StepError(f"TensorRT-RTX {version} cannot build for {', '.join(unknown)}; it "
                            f"offers {', '.join(sorted(offered, key=target_number))}")

    def _configure(self, trt: Any, config: Any, ctx: StepContext) -> None:
        # No timing cache: in TensorRT-RTX the ITimingCache API is a deprecated no-op (1.2+)
        # that does not change the engine, and using it makes the ahead-of-time build look
        # for a GPU. Its run-time counterpart (the runtime cache of JIT kernels) belongs to
        # whoever loads the engine on an RTX GPU. Hardware compatibility levels do not exist
        # either: the targets are the portability.
        ctx.metrics["timing_cache"] = "unsupported"
        targets = self.params.targets
        if targets:
            offered = self._offered_targets(trt)
            config.num_compute_capabilities = len(targets)
            for index, target in enumerate(targets):
                if not config.set_compute_capability(offered[target], index):
                    raise StepError(f"TensorRT-RTX refused target {target}")

    def _manifest_extra(self) -> dict[str, Any]:
        return {"targets": list(self.params.targets) or "default"}

    def _run_targets(self) -> list[str]:
        return list(self.params.targets)
