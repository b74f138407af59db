"""TrtRunner: feed dicts of numpy arrays in, a dict of numpy output arrays out.

A pared-down counterpart of Polygraphy's ``TrtRunner``: the profile that takes the feed's
shapes is activated, input shapes are set for dynamic dimensions, device buffers are
allocated with cuda-python (and grown, never shrunk, across calls), inputs are copied in,
the engine runs on its own stream, outputs are copied back. ``last_inference_ms`` times the
execution alone (enqueue to stream synchronize), copies excluded.

It is a ``Runner`` (optbuild.backends.base): built from a function that loads the engine,
it loads on entering its ``with`` block, where the execution context, stream and buffers
live, and frees them on leaving it.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Callable, Mapping
from typing import Any

from optbuild.backends.base import Runner, TensorSpec
from optbuild.backends.tensorrt.profiles import Bounds, ShapeMismatch, choose_profile
from optbuild.common.errors import StepError

if typing.TYPE_CHECKING:
    import numpy as np

    from optbuild.backends.tensorrt.loader import LoadedEngine


class RunnerError(StepError):
    """The engine could not run on a feed (bad feed, CUDA error, failed enqueue)."""


class UnsupportedEngine(RunnerError):
    """An engine this runner cannot feed: data-dependent output shapes, shape-tensor
    inputs, or tensor types numpy has no dtype for (bf16, fp8, int4...)."""


def _check(result: Any, what: str) -> Any:
    """The value of a cuda-python call's (error, value...) result; RunnerError on error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RunnerError(f"CUDA {what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


class TrtRunner(Runner):
    """Runs an engine on feed dicts; see the module docstring. ``load`` gives the engine
    (``loader.open_engine`` over a file, ``loader.load_engine`` over a fresh plan)."""

    @property
    def on_gpu(self) -> bool:
        return True

    def __init__(self, load: Callable[[], LoadedEngine]):
        self._load = load
        self.loaded: Any = None
        self.input_names: list[str] = []
        self._outputs: list[str] = []
        self.inputs: dict[str, tuple[int, ...]] = {}  # declared shapes, -1 where dynamic
        self.profiles: list[dict[str, Bounds]] = []  # each profile's bounds of the dynamic inputs
        self.last_inference_ms: float | None = None
        self._context: Any = None
        self._stream: Any = None
        self._profile = 0
        self._buffers: dict[str, tuple[Any, int]] = {}  # name -> (device pointer, bytes)

    # --- lifetime ------------------------------------------------------------------------
    def _open(self) -> None:
        self.loaded = loaded = self._load()
        trt, engine, cudart = loaded.trt, loaded.engine, loaded.cudart
        self.label = f"{loaded.label} on {loaded.device}"
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self._outputs = [n for n in names if not is_input[n]]
        self.inputs = {n: tuple(engine.get_tensor_shape(n)) for n in self.input_names}
        dynamic = [n for n, shape in self.inputs.items() if any(d < 0 for d in shape)]
        self.profiles = [
            {n: Bounds(*(tuple(s) for s in engine.get_tensor_profile_shape(n, i))) for n in dynamic}
            for i in range(engine.num_optimization_profiles)] if dynamic else []
        for name in self.input_names:
            if engine.is_shape_inference_io(name):
                raise UnsupportedEngine(f"input {name!r} is a shape tensor; this runner feeds "
                                        "execution tensors only")
        self._context = engine.create_execution_context()
        if self._context is None:
            raise RunnerError(f"{loaded.label} could not create an execution context on {loaded.device}")
        self._stream = _check(cudart.cudaStreamCreate(), "cudaStreamCreate")

    def _close(self) -> None:
        if self.loaded is None:
            return
        cudart = self.loaded.cudart
        for pointer, _ in self._buffers.values():
            cudart.cudaFree(pointer)
        self._buffers.clear()
        if self._stream is not None:
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        self._context = None

    # --- the Runner contract -------------------------------------------------------------
    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec(n, self.dtype(n).name, tuple(None if d < 0 else d for d in shape))
                for n, shape in self.inputs.items()]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec(n, self.dtype(n).name, tuple(None if d < 0 else d for d in self.loaded.engine.get_tensor_shape(n)))
                for n in self._outputs]

    # --- types and buffers ---------------------------------------------------------------
    def dtype(self, name: str) -> np.dtype:
        """The numpy dtype of tensor ``name``; UnsupportedEngine when numpy has none."""
        import numpy as np

        trt, engine = self.loaded.trt, self.loaded.engine
        try:
            return np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        except (TypeError, KeyError):
            raise UnsupportedEngine(f"tensor {name!r} is {engine.get_tensor_dtype(name)}, which has "
                                    "no numpy type") from None

    def _buffer(self, name: str, nbytes: int) -> Any:
        pointer, size = self._buffers.get(name, (None, 0))
        if pointer is None or size < nbytes:
            if pointer is not None:
                self.loaded.cudart.cudaFree(pointer)
                del self._buffers[name]
            size = max(1, nbytes)
            pointer = _check(self.loaded.cudart.cudaMalloc(size), "cudaMalloc")
            self._buffers[name] = (pointer, size)
        return pointer

    def _as_input(self, name: str, value: Any) -> np.ndarray:
        """``value`` in the engine's dtype for ``name``: floats to floats, integers to
        integers (when every value fits); anything else is the caller's mistake."""
        import numpy as np

        array, want = np.asarray(value), self.dtype(name)
        if array.dtype != want:
            same_kind = {array.dtype.kind, want.kind} <= {"f"} or {array.dtype.kind, want.kind} <= {"i", "u"}
            if not same_kind:
                raise RunnerError(f"input {name!r} is {array.dtype}; the engine takes {want}")
            if want.kind in "iu" and array.size:
                info = np.iinfo(want)
                if array.min() < info.min or array.max() > info.max:
                    raise RunnerError(f"input {name!r} holds values outside {want}'s range, which the "
                                      "engine takes")
            array = array.astype(want)
        return np.ascontiguousarray(array)

    # --- running ------------------------------------------------------------------------------
    def infer(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the engine once on ``feed`` (input name -> array); output name -> array."""
        import numpy as np

        if self._context is None:
            raise RunnerError("TrtRunner.infer outside its 'with' block")
        cudart, context, stream = self.loaded.cudart, self._context, self._stream
        missing = [n for n in self.input_names if n not in feed]
        unknown = [n for n in feed if n not in self.inputs]
        if missing or unknown:
            raise RunnerError(f"the feed lacks inputs {missing} / has unknown inputs {unknown}; the "
                              f"engine's inputs are {self.input_names}")
        arrays = {n: self._as_input(n, feed[n]) for n in self.input_names}
        try:
            profile = choose_profile(self.inputs, self.profiles, {n: a.shape for n, a in arrays.items()})
        except ShapeMismatch as exc:
            raise RunnerError(str(exc)) from None
        if profile != self._profile:
            if not context.set_optimization_profile_async(profile, int(stream)):
                raise RunnerError(f"{self.loaded.label} could not switch to optimization profile {profile}")
            self._profile = profile
        h2d, d2h = (cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        for name, array in arrays.items():
            if not context.set_input_shape(name, array.shape):
                raise RunnerError(f"{self.loaded.label} refused shape {list(array.shape)} for input {name!r}")
            pointer = self._buffer(name, array.nbytes)
            _check(cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, h2d, stream), "cudaMemcpyAsync")
            context.set_tensor_address(name, int(pointer))
        outputs = {}
        for name in self._outputs:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise UnsupportedEngine(f"the shape of output {name!r} depends on data ({list(shape)})")
            outputs[name] = np.empty(shape, self.dtype(name))
            context.set_tensor_address(name, int(self._buffer(name, outputs[name].nbytes)))
        _check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # inputs are in
        started = time.perf_counter()
        if not context.execute_async_v3(int(stream)):
            raise RunnerError(f"{self.loaded.label} failed to run the engine (execute_async_v3 returned False)")
        _check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        self.last_inference_ms = (time.perf_counter() - started) * 1000
        for name, array in outputs.items():
            pointer, _ = self._buffers[name]
            _check(cudart.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, d2h, stream), "cudaMemcpyAsync")
        _check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return outputs


def random_feed(runner: TrtRunner, profile: int = 0, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs at profile ``profile``'s opt shapes: standard normal floats, zeros
    otherwise (zeros are valid indices and masks)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feed = {}
    for name, declared in runner.inputs.items():
        shape = runner.profiles[profile][name].opt if any(d < 0 for d in declared) else declared
        dtype = runner.dtype(name)
        feed[name] = (rng.standard_normal(shape) if dtype.kind == "f" else np.zeros(shape)).astype(dtype)
    return feed
