"""kind = "simplify": graph simplification by onnxsim (or onnxslim), numerically checked.

A rewrite is trusted only after it agrees with its input model: the same input and output
names, types and declared input shapes, and on ``check`` seeded random inputs (symbolic
dims set to 1, 2, 3, ... in turn) the same output shapes and values within ``tolerance``
(or ``atol``). onnxslim has been seen to change an output's shape, onnxsim to fail on some
graphs. A symbolic input dim may be renamed (onnxslim names unnamed ones ``input_d0``...):
it is still symbolic. Even with ``check = 0`` the result must pass onnx.checker's full check
and load in onnxruntime.

``input_shapes`` fixes inputs' symbolic dims through the backend's own option (onnxsim's
``overwrite_input_shapes``, onnxslim's ``input_shapes``), so the shape arithmetic folds
away; ``dim_names`` renames symbolic dims before the backend runs, e.g. to tell apart the
height and width that a paddle2onnx export both calls '?' (one name says they are equal).

Only the chosen backend's version enters the key (``tool_names``). onnxsim 0.8 imports
torch when it loads (~3.7 s); it is imported here, inside run, and nowhere else.
"""

from __future__ import annotations

import importlib
import inspect
import time
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from optbuild.common.errors import StepError, first_line
from optbuild.common.recipetable import KEYED_WHEN_SET, StepRef
from optbuild.model.inputdecl import InputDecl, InputDecls, StepInputs, inputs_field, narrowed
from optbuild.steps.base import TORCH_TOOLS, Step, StepContext, StepParams
from optbuild.steps.fields import check_field, input_field, tolerance_field
from optbuild.steps.rewrite_check import Atol, atol_field, check_rewrite, input_model, interface

InputShapes = Annotated[dict[str, list[Annotated[int, Field(ge=1)]]] | None, KEYED_WHEN_SET]
DimNames = Annotated[dict[str, dict[Annotated[int, Field(ge=0)], Annotated[str, Field(min_length=1)]]] | None,
                     KEYED_WHEN_SET]


class SimplifyParams(StepParams):
    input: StepRef = input_field("simplified: 'step' in this recipe or 'recipe:step'.", "export")
    backend: Literal["onnxsim", "onnxslim"] = Field("onnxsim", examples=["onnxslim"])
    """The simplifier: 'onnxsim' (onnx-simplifier; imports torch, slow to start) or 'onnxslim'.
    Only the chosen one's version enters the key."""
    check: int = check_field("names, types and input shapes are still compared, and the result must still "
                             "pass onnx.checker's full check and load in onnxruntime.", most=100)
    tolerance: float = tolerance_field("the simplified model", default=1e-4, most=1)
    atol: Atol = atol_field()
    input_shapes: InputShapes = Field(None, examples=[{"x": [1, 3, 48, 320]}])
    """Fix inputs' shapes in the simplified model: input name -> its full shape, one size per
    dim. Only symbolic dims may get a size (a dim the model fixes keeps its size); the backend's
    own option does it (onnxsim's overwrite_input_shapes, onnxslim's input_shapes), so shape
    arithmetic folds away. The result then declares, and the check feeds, exactly these shapes.
    Not set: inputs keep their symbolic dims."""
    dim_names: DimNames = Field(None, examples=[{"x": {0: "batch", 2: "height", 3: "width"}}])
    """Rename symbolic input dims before simplifying: input name -> {axis: name}, axes from 0,
    like export's dynamic_axes. Dims that share a name are one size to onnx and the simplifiers:
    give distinct names to dims that may differ (paddle2onnx calls both height and width '?').
    Only symbolic dims, and not in an input that input_shapes fixes."""
    inputs: StepInputs = inputs_field()

    def inputs_read(self) -> InputDecls | None:
        """Only the numeric check reads declarations (none with check = 0), and not the shape
        of an input that input_shapes fixes."""
        if self.check == 0:
            return None
        fixed = set(self.input_shapes or {})
        return {**(narrowed(self.inputs, names=set(self.inputs or {}) - fixed) or {}),
                **(narrowed(self.inputs, ("dtype", "range", "values"), fixed) or {})} or None

    @model_validator(mode="after")
    def _fixed_or_named(self) -> SimplifyParams:
        both = sorted(set(self.input_shapes or {}) & set(self.dim_names or {}))
        if both:
            raise ValueError(f"input {both[0]!r} is in both input_shapes (which fixes all its dims) "
                             "and dim_names (which names symbolic ones)")
        return self


class Simplify(Step[SimplifyParams]):
    """Graph simplification by onnxsim or onnxslim, checked against its input on random inputs."""

    Params = SimplifyParams
    preload = TORCH_TOOLS
    tools = ("onnx", "onnxruntime")  # + the chosen backend: see tool_names

    def tool_names(self) -> tuple[str, ...]:
        return (*self.tools, self.params.backend)

    def run(self, ctx: StepContext) -> None:
        import onnx

        from optbuild.steps.source import uses_external_data

        p = self.params
        model, source, label = input_model(ctx, p.input, "simplify")
        self._check_shape_params(interface(model)["input_shapes"], label)
        self._name_dims(ctx, model)
        before, declared = len(model.graph.node), interface(model)  # before a backend can touch it
        declared["input_shapes"].update({name: list(shape) for name, shape in (p.input_shapes or {}).items()})
        started = time.perf_counter()
        backend = self._import_backend()
        imported = time.perf_counter()
        simplified = self._simplify(backend, model, label)
        elapsed = time.perf_counter() - imported
        if uses_external_data(simplified) or simplified.ByteSize() > 2**31 - 1:
            raise StepError(f"the simplified {label} does not fit one ONNX file (over 2 GiB): not supported")
        try:
            onnx.checker.check_model(simplified, full_check=True)
        except Exception as exc:
            raise StepError(f"{p.backend} produced a model that fails onnx.checker's full check "
                            f"({label}): {first_line(exc)}") from None
        self._same_interface(ctx, declared, simplified, label)
        out = ctx.out_dir / "model.onnx"
        onnx.save(simplified, str(out))
        after = len(simplified.graph.node)
        ctx.metrics.update(backend=p.backend, nodes_before=before, nodes_after=after,
                           import_s=round(imported - started, 3), simplify_s=round(elapsed, 3))
        ctx.log(f"{p.backend}: {before} -> {after} nodes in {elapsed:.2f} s "
                f"(+{imported - started:.2f} s to import it)")
        check_rewrite(ctx, source, out, label, p.backend, checks=p.check, tolerance=p.tolerance,
                      atol=p.atol, decls=self._check_decls())

    def _check_shape_params(self, shapes: dict[str, list], label: str) -> None:
        """StepError when input_shapes or dim_names name an input the model lacks, or
        contradict its rank or a dim it fixes: a recipe's mistake, said in its words."""
        p = self.params
        for param, entries in (("input_shapes", p.input_shapes), ("dim_names", p.dim_names)):
            for name, entry in (entries or {}).items():
                if name not in shapes:
                    raise StepError(f"{param}: {label} has no input {name!r} (its inputs: "
                                    f"{', '.join(shapes) or 'none'})")
                dims = shapes[name]
                if param == "input_shapes" and len(entry) != len(dims):
                    raise StepError(f"input_shapes.{name}: {entry} has rank {len(entry)}, {label} "
                                    f"declares {dims} (rank {len(dims)})")
                axes = enumerate(entry) if isinstance(entry, list) else entry.items()
                for axis, value in axes:
                    if axis >= len(dims):
                        raise StepError(f"dim_names.{name}: {label} declares {dims}, so it has no axis {axis}")
                    if _static(dims[axis]) and (param == "dim_names" or value != dims[axis]):
                        raise StepError(f"{param}.{name}: dim {axis} is fixed at {dims[axis]} in {label}, "
                                        f"{param} gives {value!r}; only symbolic dims can be "
                                        f"{'named' if param == 'dim_names' else 'given a size'}")

    def _name_dims(self, ctx: StepContext, model: Any) -> None:
        """Apply dim_names to the model's inputs. Its value_info goes too: annotations made
        under the old names would still tie the renamed dims together; the backends infer
        shapes again."""
        if not self.params.dim_names:
            return
        for value in model.graph.input:
            for axis, name in self.params.dim_names.get(value.name, {}).items():
                value.type.tensor_type.shape.dim[axis].dim_param = name
        del model.graph.value_info[:]
        shapes = interface(model)["input_shapes"]
        ctx.log("dim_names: " + "; ".join(f"{name} {shapes[name]}" for name in self.params.dim_names))

    def _check_decls(self) -> InputDecls | None:
        """The declarations the numeric check feeds from: an input fixed by input_shapes takes
        its fixed shape (the result takes no other), with its declared values or range."""
        decls = dict(self.params.inputs or {})
        for name, shape in (self.params.input_shapes or {}).items():
            decl = decls.get(name)
            decls[name] = (decl.model_copy(update={"shape": list(shape)}) if decl is not None
                           else InputDecl(shape=list(shape)))
        return decls or None

    def _import_backend(self) -> Any:
        name = self.params.backend
        try:
            return importlib.import_module(name)  # onnxsim: ~3.7 s, it loads torch
        except ImportError as exc:
            raise StepError(f"simplify backend {name!r} is not installed here "
                            f"(pip install {name}): {exc}") from None

    def _simplify(self, module: Any, model: Any, label: str) -> Any:
        backend, shapes = self.params.backend, self.params.input_shapes
        try:
            if backend == "onnxsim":
                options: dict[str, Any] = {"check_n": 0}  # the check below covers dynamic shapes
                if "certify" in inspect.signature(module.simplify).parameters:
                    # otherwise it runs when z3-solver happens to be installed and records its
                    # verdict in the model: output bytes that no key knows about
                    options["certify"] = False
                if shapes:
                    options["overwrite_input_shapes"] = {name: list(shape) for name, shape in shapes.items()}
                simplified, ok = module.simplify(model, **options)
                if not ok:
                    raise RuntimeError("onnxsim reports that its result differs from its input")
            elif shapes:  # onnxslim takes "name:1,3,48,320" strings
                simplified = module.slim(model, input_shapes=[f"{name}:{','.join(map(str, shape))}"
                                                              for name, shape in shapes.items()])
            else:
                simplified = module.slim(model)
        except Exception as exc:
            text = str(exc).strip()
            raise StepError(f"{backend} failed on {label}: {type(exc).__name__}: "
                            f"{text.splitlines()[0] if text else ''}") from None
        if simplified is None or not hasattr(simplified, "graph"):
            raise StepError(f"{backend} returned no model for {label}")
        return simplified

    def _same_interface(self, ctx: StepContext, before: dict[str, Any], simplified: Any, label: str) -> None:
        """Names, element types and ranks of inputs and outputs may not change, nor may the
        declared input dims, except that a symbolic dim may take another name (onnxslim names
        the unnamed ones): it still takes any size."""
        after, backend = interface(simplified), self.params.backend
        for what in ("inputs", "outputs"):
            if before[what] != after[what]:
                raise StepError(f"{backend} changed the {what} of {label}: (name, type, rank) "
                                f"{before[what]} -> {after[what]}")
        changed, renamed = [], []
        for name, dims in before["input_shapes"].items():
            for axis, (old, new) in enumerate(zip(dims, after["input_shapes"][name])):
                if old == new:
                    continue
                if _static(old) or _static(new):
                    changed.append(f"{name} dim {axis}: {old!r} became {new!r}")
                else:
                    renamed.append(f"{name} dim {axis} {old!r} -> {new!r}")
        if changed:
            raise StepError(f"{backend} changed the declared input shapes of {label}: "
                            f"{before['input_shapes']} -> {after['input_shapes']} ({'; '.join(changed)})")
        if renamed:
            ctx.log(f"{backend} renamed symbolic input dims (still symbolic): {', '.join(renamed)}")


def _static(dim: int | str) -> bool:
    """A dim of ``interface``'s input_shapes that fixes a size (not a name, '?' or -1)."""
    return isinstance(dim, int) and dim > 0
