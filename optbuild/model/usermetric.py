"""A user's own metric for verify (``metric = "file.py:fn"``): the figure a task is judged by
(detection agreement, character error rate, embedding similarity), where max_abs, cosine and
top-1 over raw outputs cannot say what a user of the model would see.

The contract: ``fn(reference, candidate, names)``, where ``reference`` and ``candidate`` map
each compared output name to its arrays, one per sample in sample order, and ``names`` lists
those outputs in the models' order. It returns a dict: ``"passed"``, True or False, and any
other entries named figures, numbers (or None), reported as they are, e.g.
``{"box_agreement": 0.97, "passed": True}``. The file is imported from its current source
(optbuild.common.usermodule), with its folder first on sys.path.
"""

from __future__ import annotations

import numbers
import traceback
from pathlib import Path
from typing import Any

from optbuild.common import usermodule
from optbuild.common.errors import StepError

CONTRACT = ("fn(reference, candidate, names) -> {'passed': True or False, 'figure': number, ...}: "
            "reference and candidate map each output name to its arrays, one per sample")


def run_metric(ref: str, base_dir: Path, reference: dict[str, list[Any]], candidate: dict[str, list[Any]],
               names: list[str]) -> tuple[dict[str, float | None], bool]:
    """(figures, passed) of the metric callable ``ref`` ("file.py:fn", relative to
    ``base_dir``) on the outputs; StepError naming the parameter, the file and the fix when
    it cannot be loaded, raises, or breaks the contract."""

    def error(message: str) -> StepError:
        hint = (f" (metric = {ref!r}, relative to the recipe file)" if message.startswith("file not found")
                else f"; it must be {CONTRACT}" if message.endswith("is not callable") else "")
        return StepError(f"metric: {message}{hint}")

    path = (base_dir / ref.rpartition(":")[0]).resolve()
    with usermodule.callable_at(ref, base_dir, error) as target:
        try:
            result = target(reference, candidate, list(names))
        except Exception as exc:
            where = _user_frame(exc, path)
            raise StepError(f"metric: {ref} raised {type(exc).__name__}: {exc}{where}") from exc
    return _checked(ref, result)


def _user_frame(exc: BaseException, path: Path) -> str:
    """' (at file.py line N, in fn)' for the innermost frame of ``path`` in the traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    return f" (at {path.name} line {frames[-1].lineno}, in {frames[-1].name})" if frames else ""


def _checked(ref: str, result: Any) -> tuple[dict[str, float | None], bool]:
    if not isinstance(result, dict):
        raise StepError(f"metric: {ref} returned {type(result).__name__}; it must return a dict: {CONTRACT}")
    if "passed" not in result:
        raise StepError(f"metric: {ref} returned no 'passed' (it gave {sorted(map(str, result))}); {CONTRACT}")
    passed = result["passed"]
    if not isinstance(passed, bool) and type(passed).__name__ != "bool_":  # numpy's bool too
        raise StepError(f"metric: {ref} returned passed = {passed!r}; it must be True or False")
    figures: dict[str, float | None] = {}
    for key, value in result.items():
        if key == "passed":
            continue
        if not isinstance(key, str) or not (value is None or (isinstance(value, numbers.Real)
                                                             and not isinstance(value, bool))):
            raise StepError(f"metric: {ref} returned {key!r}: {value!r}; each figure must be a name "
                            f"(string) -> a number or None ({CONTRACT})")
        figures[key] = None if value is None else float(value)
    return figures, bool(passed)
