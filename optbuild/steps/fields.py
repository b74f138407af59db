"""The parameters several step kinds share, declared once: the model a step takes
(``input``), a data source with its callable's arguments and sample count (``data``,
``data_args``, ``samples``), the seeded random inputs (``seed``, ``dynamic_size``), and a
numeric check against the input model (``check``, ``tolerance``). Each factory takes only what differs between the steps (a phrase of the
description, the default, the examples) and returns the pydantic ``Field``: one wording and
one set of bounds for what means the same everywhere. ``DataSourceStep`` puts a step's data
source into its key.

See also ``inputs_field`` (optbuild.model.inputdecl) and ``atol_field``
(optbuild.steps.rewrite_check).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, Field

from optbuild.common.callables import Call
from optbuild.model.samples import check_data_source, data_calls, data_key_files
from optbuild.steps.base import P, Step

# A data source as a recipe names it: an .npz file, a folder of .npy files, or 'file.py:callable'.
DataSource = Annotated[str, AfterValidator(check_data_source)]

_DATA_FORMS = ("an .npz file (one array per input, under its name), a folder of `<input>.npy` files "
               "or `<input>/` sub-folders of per-sample .npy files, or 'file.py:callable' returning "
               "feed dicts (see 'Data sources and data callables')")


def input_field(what: str, example: str = "simplify") -> Any:
    """The ``input`` parameter: the step whose ONNX model this one takes; ``what`` ends "The
    step whose ONNX model is ..." ("simplified: ...")."""
    return Field(description=f"The step whose ONNX model is {what}", examples=[example])


def data_field(what: str, *, note: str = "", default: Any = ..., examples: list[str] | None = None) -> Any:
    """A data source parameter (calibrate's ``data``): ``what`` the samples are for (the
    description's opening), ``note`` what follows the common part; required unless a
    ``default`` is given."""
    return Field(
        default,
        description=f"{what}, relative to the recipe file: {_DATA_FORMS}. The data files, or the "
                    f"callable's file and the project-local modules it imports, enter the key.{note}",
        examples=examples or ["models/calib.py:images", "calib/images.npz"])


def data_args_field(name: str = "data_args", *, source: str = "data", note: str = "",
                    seed: int = 0) -> Any:
    """The keyword arguments of a data callable: ``name`` the parameter, ``source`` the data
    source's parameter it goes with, ``note`` a remark after the call, ``seed`` the example's."""
    return Field(
        {},
        description=f"Keyword arguments for a {source} callable: names -> strings, integers, floats or "
                    f"booleans, passed as `callable(**{name})`{note}. Only with a 'file.py:callable' "
                    f"{source} source; they enter the key.",
        examples=[{"count": 64, "seed": seed}])


def samples_field(description: str, *, default: int | None = None, example: int = 128) -> Any:
    """The ``samples`` parameter: how many samples of the data a step uses (at least 1)."""
    return Field(default, ge=1, description=description, examples=[example])


def check_field(still: str, *, most: int | None = None, scope: str = "") -> Any:
    """The ``check`` parameter of a step compared with its input model on seeded random
    inputs (3 by default, at most ``most``); ``scope`` narrows where it runs, ``still`` says
    what holds with ``check = 0``."""
    bounds = f", 0 to {most}" if most is not None else ""
    return Field(
        3, ge=0, le=most,
        description=f"How many seeded random-input comparisons with the input model to run{bounds} "
                    f"(declared inputs, else symbolic dims set to 1, 2, 3 in turn){scope}. 0 skips "
                    f"the numeric check: {still}",
        examples=[0])


def seed_field(scope: str = "", note: str = "") -> Any:
    """The ``seed`` of a step's seeded random inputs; ``scope`` opens the description
    ("Random inputs only: "), ``note`` follows it."""
    return Field(
        0, ge=0,
        description=_sentence(f"{scope}the seed of the random inputs' generator (numpy default_rng), so "
                              f"that they are the same on every run.{note}"),
        examples=[1])


def dynamic_size_field(model: str, *, scope: str = "", note: str = "", example: int = 4) -> Any:
    """``dynamic_size``: the size of every dim of ``model`` ("the reference") that neither the
    model nor a declaration fixes, in a step's seeded random inputs."""
    return Field(
        1, ge=1,
        description=_sentence(f"{scope}the size given to every dimension {model} does not fix and no "
                              f"input declaration sets (symbolic or unknown, the batch axis included){note}."),
        examples=[example])


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def tolerance_field(what: str, *, default: float | None, most: float | None = None, unset: str = "",
                    example: float = 1e-3) -> Any:
    """The ``tolerance`` parameter: the relative error ``what`` ("the simplified model") may
    have against its input model (above 0, at most ``most``); ``unset`` says what no value
    means, where the default is None."""
    bounds = f" (0 < tolerance <= {most:g})" if most is not None else ""
    return Field(
        default, gt=0, le=most,
        description=f"Largest accepted error of {what} against its input, relative to the largest "
                    f"magnitude of each of the input model's outputs{bounds}; errors within atol "
                    f"pass too.{unset}",
        examples=[example])


class DataSourceStep(Step[P]):
    """A step that reads the data source parameter ``data_param`` (its callable's arguments
    in ``args_param``): the data files, or the callable's file and the project-local modules
    it imports, enter the key, and the callable is checked as it is called."""

    data_param: ClassVar[str] = "data"
    args_param: ClassVar[str] = "data_args"

    def key_files(self) -> list[Path]:
        files = super().key_files()
        source = getattr(self.params, self.data_param)
        files.extend(p for p in data_key_files(source, self.base_dir, self.project_root) if p not in files)
        return files

    def key_folders(self, files: Sequence[Path]) -> list[Path]:
        """The folders of the Python files (a callable's imports resolve there) and of the
        .npy files (a data folder is listed); the others are named."""
        return sorted({path.parent for path in files if path.suffix in (".py", ".npy")})

    def calls(self) -> list[Call]:
        return [*super().calls(), *data_calls(getattr(self.params, self.data_param),
                                              getattr(self.params, self.args_param),
                                              self.data_param, self.args_param)]
