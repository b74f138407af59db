"""The stable API for writing step kinds: what a project's own kind (``[kinds]`` in
optbuild.toml) or a package's kind (entry point group ``optbuild.steps``) imports.

Everything else in optbuild is internal and moves between releases; the names here keep
their meaning, and a name that goes is first deprecated for a release. A kind::

    from optbuild.plugin import Step, StepContext, StepError, StepParams, StepRef

    class UpperParams(StepParams):
        input: StepRef  # another step's output: "step" or "recipe:step"

    class Upper(Step):
        \"\"\"Upper-cases its input's text.\"\"\"  # first line: the kind's summary (optbuild kinds)

        Params = UpperParams
        primary_output = "data.txt"

        def run(self, ctx: StepContext) -> None:
            source = ctx.inputs["input"].primary
            if source is None:
                raise StepError(f"upper needs a file; {ctx.inputs['input'].step} gives none")
            (ctx.out_dir / "data.txt").write_text(source.read_text().upper())

What each name is for:

- ``Step``: the base class of a kind: its ``Params``, ``version`` (bump it when the output
  changes), ``tools`` (distributions whose versions enter the key), ``host_fields`` (host
  fingerprint fields that do), ``preload``, ``shares_process`` (its steps may run one after
  another in one worker process, sparing each a fork: for a kind whose ``run`` changes no
  state a later step would see), ``primary_output`` and ``run(ctx)``; overridable
  ``unavailable(host)``, ``key_files()`` with ``key_folders(files)`` (the folders whose names
  decide the key files: a no-op checks those; a kind overriding ``key_files`` alone is given
  the folder of every key file), ``bind(upstream)``.
- ``StepParams``: the base of a kind's parameters (a pydantic model, validated when the
  project loads, strict: a recipe's ``"50"`` is not an integer).
- ``StepRef``, ``InputPath``, ``CallableRef``: the field types whose values enter the key as
  more than text: another step's output (``"step"`` or ``"recipe:step"``), a file's bytes
  (relative to the recipe file), a ``"file.py:callable"``'s file.
- ``StepContext``: what ``run`` gets: ``out_dir`` to write the outputs into, ``inputs`` (the
  ``StepRef`` fields' outputs by field name, a list's as ``"name.0"``, ``"name.1"``...),
  ``path(...)`` to resolve an ``InputPath``, ``onnx_input(who)``, ``metrics``, ``log``,
  ``warn``, ``progress``, ``private_copy``.
- ``Artifact``: one of ``ctx.inputs``: the upstream ``step``, its folder ``dir``, its
  ``files`` (name -> path) and its ``primary`` output (None when it names none).
- ``StepError``: raise it for a failure the kind can explain; the build prints its message,
  not a traceback.
- ``ONNX_TOOLS``, ``TORCH_TOOLS``: ``preload`` sets shared with the built-in kinds (steps
  with the same set fork from one server that imported them once).
- ``link_files``: hard-link (else copy) files into ``out_dir``, for a kind that passes
  its input's files on.
- ``callable_at``: a ``CallableRef`` parameter's callable, imported from its current source
  for a ``with`` block.
- ``local_imports``: the project's Python files a file imports, found by reading it; a kind
  that runs a user's module adds them in ``key_files`` so that editing them rebuilds it.
- ``Fingerprint``: the type of the ``host`` that ``unavailable`` gets (``host.get("gpu.count")``).
"""

from __future__ import annotations

from optbuild.common.errors import StepError
from optbuild.common.fingerprint import Fingerprint
from optbuild.common.pyimports import local_imports
from optbuild.common.recipetable import CallableRef, InputPath, StepRef
from optbuild.common.usermodule import callable_at
from optbuild.steps.base import (
    ONNX_TOOLS,
    TORCH_TOOLS,
    Artifact,
    Step,
    StepContext,
    StepParams,
    link_files,
)

__all__ = [
    "ONNX_TOOLS",
    "TORCH_TOOLS",
    "Artifact",
    "CallableRef",
    "Fingerprint",
    "InputPath",
    "Step",
    "StepContext",
    "StepError",
    "StepParams",
    "StepRef",
    "callable_at",
    "link_files",
    "local_imports",
]
