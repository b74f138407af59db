"""The contract between optbuild and a step kind.

A step kind is a class: a pydantic ``Params`` model (validated when the project loads),
the tools and host fingerprint fields its output depends on (they enter its action key),
and ``run``, which executes in a worker process and writes files into ``ctx.out_dir``.
Step modules must import nothing heavy at module level: the CLI imports them to validate
recipes, and a no-op build must stay instant. Import torch/onnx/tensorrt inside ``run``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from optbuild.common.callables import Call
from optbuild.common.errors import StepError
from optbuild.common.links import link_or_copy
from optbuild.common.recipetable import (
    CALLABLE_REF,
    INPUT_PATH,
    STEP_REF,
    CallableRef,  # noqa: F401 (the field types of a kind's Params: this module's API for step kinds)
    InputPath,  # noqa: F401
    RecipeTable,
    StepRef,  # noqa: F401
    fields_with,
)

if typing.TYPE_CHECKING:
    from optbuild.common.fingerprint import Fingerprint


# The preload sets of the built-in step kinds (Step.preload): steps sharing one share a fork server.
ONNX_TOOLS = ("numpy", "onnx")
TORCH_TOOLS = ("numpy", "onnx", "sympy", "torch", "torch.onnx")  # sympy: torch.fx, onnxsim
# The heavy tools a step's process reports having imported itself (ChildResult.imported), so
# that later steps of its kind fork from a server that preloaded them (process.pool).
PRELOADABLE = frozenset(name.partition(".")[0] for name in TORCH_TOOLS)


class StepParams(RecipeTable):
    """Base of every step's parameters."""

    def inputs_read(self) -> Any:
        """The part of the ``inputs`` declarations (recipe's and step's, merged) this step reads
        with these parameters: the loader keeps only that, so the key holds only what the step
        reads. A kind that reads less narrows it (optbuild.model.inputdecl.narrowed)."""
        return getattr(self, "inputs", None)


@dataclass(frozen=True)
class Artifact:
    """The materialized output of an upstream step, as a downstream step sees it."""

    step: str
    dir: Path
    files: dict[str, Path]
    primary: Path | None


@dataclass
class StepContext:
    """What ``Step.run`` gets inside the worker process."""

    step_id: str
    base_dir: Path
    project_root: Path
    out_dir: Path
    inputs: dict[str, Artifact]
    host: Fingerprint
    # Persistent, mutable per-tool state that is not an output (e.g. TensorRT timing
    # caches): under the cache root, shared by builds on this machine. Update atomically.
    state_dir: Path | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # a kind that takes partial inputs (``Step.partial_inputs``): the inputs whose steps did
    # not succeed, by field ("candidates.2"): {"step": "r:s", "why": "unavailable: no GPU"}
    missing: dict[str, dict[str, str]] = field(default_factory=dict)
    progress_file: Path | None = None  # where ``progress`` writes; None: nobody watches

    def path(self, relative: str) -> Path:
        """Resolve a recipe-relative path (an ``InputPath`` field) to an absolute one."""
        return (self.base_dir / relative).resolve()

    def log(self, message: str) -> None:
        """A line for the step's log (stored with its action entry)."""
        print(message, file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        """A warning for the build's output (and --json), not only the step's log: kept in the
        metrics under "warnings", so a cached result repeats it each build until its cause goes."""
        self.log(f"warning: {message}")
        self.metrics.setdefault("warnings", []).append(message)

    def progress(self, message: str) -> None:
        """Say what the step is doing now ("calibrating sample 12 of 32"): the build shows it
        beside the step while it runs, so a long step is seen to move. A small file replaced
        whole (from a forked child too), so a loop may call it once per iteration."""
        if self.progress_file is None:
            return
        part = self.progress_file.with_name(f".{self.progress_file.name}.{os.getpid()}")
        try:
            part.write_text(message)
            os.replace(part, self.progress_file)
        except OSError:  # a message lost; the step goes on
            pass

    def onnx_input(self, who: str) -> Path:
        """The ONNX model file of the ``input`` artifact; StepError, saying ``who`` ("calibrate")
        needs one, when that step gives another file or none."""
        artifact = self.inputs["input"]
        model = artifact.primary
        if model is None or model.suffix != ".onnx" or not model.is_file():
            raise StepError(f"{who} needs an ONNX model; {artifact.step} gives "
                            f"{model.name if model else 'no file'}")
        return model

    def private_copy(self, model: Path) -> Path:
        """``model`` seen from a fresh folder of its own, its sibling files (external data)
        beside it: hard links, or copies across file systems. For libraries that write next
        to the file they are given (onnxruntime.quantization writes ``model-inferred.onnx``
        and deletes it): they must not touch the upstream artifact, nor race the other steps
        that read it at the same time. The folder lies in the step's staging area (on the
        cache's file system), removed with it."""
        folder = Path(tempfile.mkdtemp(prefix="private-", dir=self.out_dir.parent))
        for source in model.parent.iterdir():
            if source.is_file():
                link_or_copy(source, folder / source.name)
        return folder / model.name


P = TypeVar("P", bound=StepParams)  # a kind's parameters


class Step(Generic[P]):
    """Base class of step kinds. Subclasses set the class attributes and implement run();
    a kind is generic over its parameters (``class Quantize(Step[QuantizeParams])``), so that
    a type checker checks its code against its own ``self.params``."""

    # Bump when the implementation changes what it produces: every earlier entry is disowned.
    version: str = "1"  # a class attribute; a kind may set it per instance from its parameters (quantize)
    Params: ClassVar[type[StepParams]]
    # Python distributions whose versions change the output (their versions enter the key).
    tools: ClassVar[tuple[str, ...]] = ()
    # Modules the fork server imports once for every step of this kind (optbuild.process.forkserver):
    # heavy ones whose import leaves no thread running (not onnxruntime: see the fork server);
    # ONNX_TOOLS and TORCH_TOOLS are the built-in kinds' sets.
    preload: ClassVar[tuple[str, ...]] = ()
    # Host fingerprint fields the output depends on (see optbuild.common.fingerprint).
    host_fields: ClassVar[tuple[str, ...]] = ()
    # Name of the main output file inside out_dir, handed to downstream steps as `primary`
    # (a kind may set it per step, from its parameters: the onnxruntime engine's format).
    primary_output: str | None = "model.onnx"
    # Builds with nothing else building beside it (a measurement that other steps would skew).
    exclusive: ClassVar[bool] = False
    # True: its steps may run one after another in one worker process (forked once from the
    # fork server), sparing each a fork; for kinds whose run() leaves nothing behind that a
    # later step would see (a module global it sets, a thread, a changed cwd or signal
    # handler). A crash still fails only the step that crashed. False: a process per step.
    shares_process: ClassVar[bool] = False
    # Runs while one of a list of its inputs (``candidates = [...]``) succeeded: the others
    # are left out and named in ``StepContext.missing`` (select chooses among what ran).
    partial_inputs: ClassVar[bool] = False
    # What commands that read built models (``optbuild bench``) learn of a kind, instead of
    # spelling its name: its output is a copy of the model of the step it measured or chose
    # (benchmark, select), so it is benched there;
    carries_model: ClassVar[bool] = False
    # the parameter that names the model it checks (verify's ``candidate``), whose figures
    # bench shows beside that model;
    checks_model: ClassVar[str | None] = None
    # its output is an engine a runtime made of its input (labelled "-optimized" where the same
    # runtime runs that input). Its ``precision()`` below; a kind with a ``load_module(ctx)``
    # (export's) is benched beside that module run in PyTorch, eager.
    builds_engine: ClassVar[bool] = False

    def __init__(self, params: P, base_dir: Path, project_root: Path):
        self.params: P = params
        self.base_dir = base_dir
        self.project_root = project_root

    # --- what the key covers -------------------------------------------------------
    def tool_names(self) -> tuple[str, ...]:
        """Distributions whose versions enter the key; override when params choose a tool."""
        return self.tools

    def outputs_read(self, field: str, outputs: dict[str, str]) -> dict[str, str]:
        """Of the outputs (name -> digest) of the step that parameter ``field`` names, those
        this step reads: only they enter its key and are given to it. All of them unless a
        kind says otherwise (deploy leaves out a select's report, whose timings change on
        every run, so that the same choice deploys nothing new)."""
        return outputs

    def step_refs(self) -> dict[str, str]:
        """Field name -> referenced step, for every StepRef field that is set; a list of
        them (``candidates = ["a", "b"]``) gives ``candidates.0``, ``candidates.1``... (a
        matrix step's ``NAME[*]`` in it stands for all its instances, see recipe)."""
        refs = {}
        for name in fields_with(type(self.params), STEP_REF):
            value = getattr(self.params, name)
            if isinstance(value, (list, tuple)):
                refs.update({f"{name}.{i}": item for i, item in enumerate(value)})
            elif value is not None:
                refs[name] = value
        return refs

    def bind(self, upstream: Mapping[str, Step]) -> None:
        """Called once the project is loaded, with the steps that this step's StepRef fields
        name (field -> step), before any key is made. For a step whose needs depend on what
        its inputs are, e.g. a verify that runs an engine: it learns that here, instead of
        the recipe repeating it. Default: nothing to learn."""

    def key_files(self) -> list[Path]:
        """Absolute paths of the files whose bytes enter the key.

        Default: every InputPath field and the file of every CallableRef field.
        """
        files = []
        for marker in (INPUT_PATH, CALLABLE_REF):
            for name in fields_with(type(self.params), marker):
                value = getattr(self.params, name)
                for item in value if isinstance(value, (list, tuple)) else [value]:
                    if item is not None:
                        relative = item.rpartition(":")[0] if marker is CALLABLE_REF else item
                        files.append((self.base_dir / relative).resolve())
        return files

    def key_folders(self, files: Sequence[Path]) -> list[Path]:
        """The folders whose names decide ``files`` (this step's ``key_files``): a file added
        to one may be a new key file (a data folder listed), or what a key file's import now
        resolves to. The no-op fast path checks the names these folders hold, and a key file
        elsewhere alone. Default: none, as every key file of ``Step.key_files`` is named by
        the recipe. A kind that overrides ``key_files`` says its own; one that does not is
        given the folder of every key file (``steps.base.key_folders``), which is always safe."""
        return []

    def calls(self) -> list[Call]:
        """The ``file.py:callable`` parameters this step calls, and how: checked by reading
        their files when the project loads (optbuild.common.callables). Default: every CallableRef
        field, with its arguments unknown (only the name is checked)."""
        calls = []
        for name in fields_with(type(self.params), CALLABLE_REF):
            value = getattr(self.params, name)
            calls += [Call(name, item) for item in (value if isinstance(value, (list, tuple)) else [value])
                      if item is not None]
        return calls

    def host_key(self, host: Fingerprint) -> dict[str, Any]:
        """The part of the host fingerprint that enters the key."""
        return {name: host.get(name) for name in self.host_fields}

    def unavailable(self, host: Fingerprint) -> str | None:
        """None when this step can run on ``host``; else what it needs, in words."""
        return None

    def runs_on(self) -> dict[str, Any] | None:
        """What will run this step's output, as the manifest beside it will say
        ({"backend": name, ...}; see optbuild.backends.registry), known before it is built;
        None when no backend runs it. Default: the backend that opens the primary output's
        suffix (onnxruntime for .onnx and .ort). Engine steps name their own."""
        from optbuild.backends.registry import by_suffix

        backend = by_suffix(Path(self.primary_output or "").suffix)
        return {"backend": backend.name} if backend is not None else None

    def precision(self) -> str | None:
        """What its model computes in when this step decides it ("fp16", "static INT8",
        "int8"); None: as the model it came from. Default: its ``precision`` parameter."""
        chosen = getattr(self.params, "precision", None)
        return chosen if isinstance(chosen, str) else None

    # --- execution (worker process) ------------------------------------------------
    def run(self, ctx: StepContext) -> None:
        """Write the outputs into ``ctx.out_dir``; record figures in ``ctx.metrics``."""
        raise NotImplementedError


def link_files(files: Mapping[str, Path], out_dir: Path) -> int:
    """Hard-link (else copy) ``files`` (name -> path) into ``out_dir`` under their names;
    their total size in bytes."""
    size = 0
    for name, source in sorted(files.items()):
        dest = out_dir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(source, dest)
        size += dest.stat().st_size
    return size


def key_folders(step: Step, files: Sequence[Path]) -> list[Path]:
    """``step.key_folders(files)`` where the class that says it also says ``key_files`` (or
    derives from the one that does); else the folder of every key file: a kind overriding
    ``key_files`` may list a folder, and its folders cannot be known otherwise."""
    mro = type(step).__mro__
    says_files = next(c for c in mro if "key_files" in c.__dict__)
    says_folders = next(c for c in mro if "key_folders" in c.__dict__)
    if issubclass(says_folders, says_files):
        return step.key_folders(files)
    return sorted({path.parent for path in files})
