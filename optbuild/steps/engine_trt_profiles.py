"""What the TensorRT engine steps check of a model before building, and keep between builds:
the profiles its inputs need (declared, or checked against the model's inputs and their
dimension names), the parser's errors, and the timing cache's file per runtime and device."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optbuild.backends.tensorrt.diagnose import (
    dim_name_conflicts,
)
from optbuild.common.errors import StepError
from optbuild.model.inputdecl import InputDecls
from optbuild.steps.engine_trt_params import Profile, ShapeRange


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


def parser_errors(parser: Any) -> list[str]:
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


def cache_entries(cache: Any) -> int | None:
    try:
        return len(cache.queryKeys())
    except (AttributeError, RuntimeError):
        return None
