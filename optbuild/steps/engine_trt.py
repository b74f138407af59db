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
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from optbuild.backends.base import module_missing
from optbuild.backends.manifest import write_manifest
from optbuild.backends.tensorrt import RUNTIMES, Runtime
from optbuild.backends.tensorrt.diagnose import (
    ModelFacts,
    hints,
    noise_note,
    read_model_facts,
    split_driver_noise,
)
from optbuild.backends.tensorrt.host import (
    gpu_missing,
    runtime_distribution,
    target_number,
)
from optbuild.backends.tensorrt.logger import capture_logger, errors, quote, warnings
from optbuild.common.atomic import write_atomic
from optbuild.common.errors import StepError, StepUnavailable
from optbuild.steps.base import ONNX_TOOLS, Step, StepContext
from optbuild.steps.engine_trt_params import EngineParams, Profile, TensorRTParams, TensorRTRTXParams
from optbuild.steps.engine_trt_profiles import (
    cache_entries,
    check_dim_names,
    check_profiles,
    declared_profiles,
    parser_errors,
    timing_cache_file,
)

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


# --- the step ---------------------------------------------------------------------------------
EP = TypeVar("EP", bound=EngineParams)  # the parameters of one of the two TensorRT kinds


class _TensorRTBase(Step[EP]):
    """Builds ``model.engine`` from the ONNX primary output of the step named by ``input``."""

    version = "1"
    primary_output = "model.engine"
    builds_engine = True
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
                                parser_errors(parser) or errors(trt, logger), facts)
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
        return {"cache": cache, "path": path, "loaded": len(data), "entries": cache_entries(cache)}

    def _save_timing_cache(self, trt: Any, config: Any, state: Any, ctx: StepContext) -> None:
        if state is None:
            return
        cache, path = state["cache"], state["path"]
        after_entries = cache_entries(cache)
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
