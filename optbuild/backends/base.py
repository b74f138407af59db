"""The contract every runtime backend meets, so that verify, bench and the steps' own checks
run any artifact the same way (Polygraphy's BaseRunner, reduced to what optbuild needs).

A ``Backend`` says what it runs and what that needs, cheaply and without importing its
runtime: the artifacts it opens (by suffix, or by the ``backend`` an ``engine.json`` beside
them names), the distributions whose versions key results obtained with it, the pip extra
that installs it, the host fields those results depend on, and why a host cannot run it.
``Backend.open`` gives a ``Runner``: an opened artifact that describes its inputs and
outputs and infers on feed dicts of numpy arrays. A runner is a context manager; it loads
on enter (``load_ms`` is that time) and frees on exit.
"""

from __future__ import annotations

import importlib.util
import time
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

if typing.TYPE_CHECKING:
    import numpy as np

    from optbuild.common.fingerprint import Fingerprint, RuntimeProbe

# What an artifact says of itself: its engine.json (or, before it is built, what its step will
# write there), e.g. {"backend": "tensorrt-rtx", "targets": ["sm86"]}; empty for a plain model.
Manifest = Mapping[str, Any]


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as its runtime declares it: dims are ints, names, or None
    (unknown)."""

    name: str
    dtype: str  # numpy dtype name ("float32"), or the runtime's type string when numpy has none
    shape: tuple[int | str | None, ...]

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype} [{dims}]"

    def __str__(self) -> str:
        return f"{self.name}: {self.describe()}"


class Runner(ABC):
    """An opened artifact that infers on feed dicts; use it in a ``with`` block."""

    label: str = ""  # what runs it, for reports: "onnxruntime 1.23.2 (CPU)", from what loaded
    load_ms: float = 0.0  # the time ``__enter__`` took

    @property
    def on_gpu(self) -> bool:
        """Whether it runs on an NVIDIA GPU (once entered)."""
        return False

    def __enter__(self) -> Self:
        started = time.perf_counter()
        self._open()
        self.load_ms = (time.perf_counter() - started) * 1000
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _open(self) -> None:
        """Load the artifact (runners that load in ``__init__`` need nothing here)."""

    def _close(self) -> None:
        """Free what ``_open`` took."""

    @abstractmethod
    def input_specs(self) -> list[TensorSpec]:
        """The inputs, with the dims the artifact leaves open as names or None."""

    @abstractmethod
    def output_specs(self) -> list[TensorSpec]:
        """The outputs, in the artifact's order."""

    def output_names(self) -> list[str]:
        return [spec.name for spec in self.output_specs()]

    @abstractmethod
    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on ``feed`` (input name -> array); output name -> array."""

    def timed_call(self, feed: Mapping[str, np.ndarray]) -> Callable[[], object]:
        """A call that runs ``feed`` once each time, for timing: it returns when the work is
        done (a GPU runner synchronizes its device). Runners that compute on a device put
        ``feed`` there once, beforehand, so that the time is the inference's, not the copies'.
        Default: ``infer``."""
        return lambda: self.infer(feed)

    def cast(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feed`` with float inputs in the float type the artifact takes (a float16 model
        gets float16); other inputs as they are."""
        floats = ("float16", "float32", "float64")
        want = {spec.name: spec.dtype for spec in self.input_specs()}
        return {name: value.astype(want[name]) if want.get(name, str(value.dtype)) != str(value.dtype)
                and want[name] in floats and str(value.dtype) in floats else value
                for name, value in feed.items()}


class Backend(ABC):
    """One runtime: what it runs, what that needs, and how to open it. Instances are
    registered by name in ``optbuild.backends.registry``; nothing here imports the runtime."""

    name: ClassVar[str]  # as recipes and engine.json spell it: "onnxruntime", "tensorrt"
    label: ClassVar[str]  # for messages: "TensorRT-RTX"
    short: ClassVar[str]  # for table rows: "TRT-RTX"
    extra: ClassVar[str]  # the optbuild pip extra that installs it
    suffixes: ClassVar[tuple[str, ...]] = ()  # artifacts it opens without an engine.json naming it
    # The optimization levels it opens a model at, its default first and each lower after it:
    # a check lowers a level that crashed it (optbuild.model.runmodels). Empty: none to choose.
    levels: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def distributions(self) -> tuple[str, ...]:
        """The installed distributions whose versions key what is computed by running it."""

    def host_fields(self, manifest: Manifest) -> tuple[str, ...]:
        """Fingerprint fields that results obtained by running ``manifest``'s artifact here
        depend on (the kernels that ran): they enter the key of a step that runs it."""
        return ()

    @abstractmethod
    def unavailable(self, host: Fingerprint, manifest: Manifest) -> str | None:
        """Why ``host`` cannot run ``manifest``'s artifact ("needs ..."), or None."""

    def level_setting(self, level: str) -> str:
        """How a server opens a model at ``level`` (one of ``levels``), for reports."""
        return f"level {level}"

    def unfit(self, manifest: Manifest, feed: Mapping[str, np.ndarray]) -> str | None:
        """Why ``manifest``'s artifact cannot take ``feed`` (an engine's optimization
        profiles), said from the manifest before anything loads; None when it can. Runtimes
        that take any shape keep the default."""
        return None

    @abstractmethod
    def open(self, model: Path, manifest: Manifest, host: Fingerprint, *, threads: int | None = None,
             literal: bool = False) -> Runner:
        """A runner over the artifact ``model`` that ``manifest`` describes (not yet loaded:
        enter it). ``threads``:
        intra-op threads (None: the runtime's default). ``literal``: run the graph as written,
        without the runtime's own graph rewrites, for a reference that must not share the
        mistakes of the rewrite it checks (runtimes that cannot honour it ignore it)."""


def has_module(name: str) -> bool:
    """Whether module ``name`` is importable, found without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package raises
        return False


def module_missing(module: str, label: str, extra: str) -> str | None:
    """What to install when ``module`` is absent, in words; None when it is there."""
    if not has_module(module):
        return f"{label}'s Python module {module!r} (pip install 'optbuild[{extra}]')"
    return None


# --- what a runtime reports about the host (its ``probe`` module, see ``probes``) ----------
# section name -> (probe, field -> words)
Sections = Mapping[str, tuple["RuntimeProbe", Mapping[str, str]]]


def distribution_section(module: str) -> RuntimeProbe:
    """A probe of "<module>.version" and "<module>.distribution": the distribution whose files
    ``import module`` loads, read from metadata (the module is not imported)."""
    from optbuild.common.toolchain import loaded_distribution

    def probe(host: Fingerprint) -> dict[str, Any]:
        distribution, version = loaded_distribution(module)
        return {f"{module}.version": version, f"{module}.distribution": distribution}

    probe.__name__ = f"probe_{module}"
    return probe
