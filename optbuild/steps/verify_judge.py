"""Verify's judgement of the outputs both models gave on the samples: which outputs hold class
scores (top-1), where an output is cut into parts, the figures (optbuild.model.compare), the
threshold checks (optbuild.model.thresholds), the user's metric, and the warnings of a reference
that barely depends on its input. The step (optbuild.steps.verify) runs the models.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbuild.common.errors import StepError
from optbuild.model import classaxes, compare, thresholds
from optbuild.model.isolation import Stage
from optbuild.steps.verify_params import VerifyParams


@dataclass(frozen=True)
class Verdict:
    """What report.json says of the comparison: the thresholds set, the figures per output, the
    user metric's figures and verdict, every check, and the warnings."""

    thresholds: dict[str, float | None]
    figures: dict[str, dict[str, Any]]
    user: dict[str, Any] | None
    checks: list[dict[str, Any]]
    warnings: list[str]


def judge(p: VerifyParams, reference: Path, results: dict[str, dict[str, list[Any]]], names: list[str],
          samples: int, base_dir: Path, stage: Stage) -> Verdict:
    """The verdict on ``results`` (per side, per compared output ``names``, an array per sample)
    of the ``reference`` model's file against the candidate's; ``base_dir`` is where the
    metric's file is found. Run in verify's forked child: ``stage`` says what it does."""
    stage("comparing the outputs")
    first = {n: results["reference"][n][0] for n in names}
    warnings: list[str] = []
    top1_axes = _top1_axes(p, reference, names, first)
    if p.min_top1 is not None and not top1_axes:
        warnings.append(_top1_not_applied(p, names, first))
    if unknown := sorted(set(p.slices or {}) - set(names)):
        raise StepError(f"slices: no compared output {unknown[0]!r} (compared: {names})")
    figures = {n: compare.output_figures(results["reference"][n], results["candidate"][n], top1_axes.get(n),
                                         name=n, slices=_slices(p, n, results["reference"][n],
                                                                guess=n not in top1_axes))
               for n in names}
    warnings += _reference_warnings(figures, samples)
    limits = {"max_abs": p.max_abs, "max_rel": p.max_rel, "min_cosine": p.min_cosine, "min_top1": p.min_top1}
    checks = thresholds.threshold_checks(figures, limits, list(top1_axes), samples=samples)
    user = None
    if p.metric is not None:
        from optbuild.model.usermetric import run_metric

        stage("running the metric")
        user_figures, user_passed = run_metric(p.metric, base_dir, results["reference"], results["candidate"], names)
        user = {"callable": p.metric, "figures": user_figures, "passed": user_passed}
        checks.append({"output": p.metric, "metric": "passed", "value": user_passed, "op": "==",
                       "threshold": True, "ok": user_passed})
    return Verdict(limits, figures, user, checks, warnings)


def _top1_axes(p: VerifyParams, reference: Path, names: list[str], first: dict[str, Any]) -> dict[str, int]:
    """Compared output -> the axis that holds its class scores: top1_outputs' (the axis the
    graph says, else the last), else those classaxes.class_axis finds in the reference's graph."""
    axes, linear = classaxes.softmax_axes(reference), classaxes.linear_axes(reference)
    found = {n: axis for n in names if (axis := classaxes.class_axis(first[n], axes.get(n), linear.get(n))) is not None}
    if not p.top1_outputs:
        return found
    named = {}
    for n in p.top1_outputs:
        if n not in names:
            raise StepError(f"top1_outputs: no compared output {n!r} (compared: {names})")
        named[n] = found.get(n, -1)
        if not classaxes.argmax_applies(first[n], named[n]):
            raise StepError(f"top1 does not apply to output {n!r} ({first[n].dtype} "
                            f"{list(first[n].shape)}): it needs a float output with a last axis "
                            "of 2 or more")
    return named

def _top1_not_applied(p: VerifyParams, names: list[str], first: dict[str, Any]) -> str:
    """The warning for min_top1 where no compared output holds class scores: a template's
    min_top1 over a classifier and an encoder applies to the classifier only (a table cannot
    unset it per model). With no other threshold nothing would be checked: a StepError."""
    shapes = ", ".join(f"{n} {first[n].dtype} {list(first[n].shape)}" for n in names)
    why = (f"no compared output holds class scores on an axis ({shapes}): by default only a float output that a "
           "Softmax / LogSoftmax computes over its last axis (or axis 1 of [batch, classes, H, W]), a "
           "[batch, classes] or [batch, seq, vocab] one that a linear layer (Gemm, MatMul, MatMul + Add) "
           "computes, or a [batch, classes, H, W] one that a 1x1 Conv computes, does, as the reference's "
           "ONNX graph says; name the outputs whose last axis is the classes in top1_outputs")
    if all(t is None for t in (p.max_abs, p.max_rel, p.min_cosine, p.metric)):
        raise StepError(f"min_top1 is the only threshold, and it applies nowhere: {why}")
    return f"min_top1 not applied: {why}"

def _slices(p: VerifyParams, name: str, reference: list[Any], *,
            guess: bool) -> tuple[int, list[tuple[int, int]]] | None:
    """(axis, runs [start, stop)) ``name`` is cut into (see the slices parameter): as
    declared, else (with ``guess``) where its reference's scales part; None for an output
    judged whole. Class scores are not guessed at: some logits are far below the top
    ones by nature, and a cut there would judge noise."""
    import numpy as np

    shape = reference[0].shape
    if (decl := (p.slices or {}).get(name)) is not None:
        if decl.axis >= len(shape):
            raise StepError(f"slices.{name}.axis: {decl.axis} is past the last axis of {name} "
                            f"{list(shape)}; give an axis from 0 to {len(shape) - 1}")
        size = min(r.shape[decl.axis] if r.ndim == len(shape) else 0 for r in reference)  # every sample's
        if decl.at and decl.at[-1] >= size:
            raise StepError(f"slices.{name}.at: {decl.at[-1]} is not below the size {size} of axis "
                            f"{decl.axis} of {name} {list(shape)}; give indices from 1 to {size - 1}")
        bounds = [0, *decl.at, shape[decl.axis]]
        return decl.axis, list(itertools.pairwise(bounds))
    if (not guess or not np.issubdtype(reference[0].dtype, np.floating) or (axis := compare.split_axis(shape)) is None
            or any(r.shape != shape for r in reference)):  # parts of samples of other shapes: not guessed
        return None
    return axis, compare.scale_runs(reference, axis)


def _reference_warnings(figures: dict[str, dict[str, Any]], samples: int) -> list[str]:
    """A warning per output whose reference barely depends on its input (the same class at every
    position, or values that hardly change from sample to sample): every candidate passes
    against such a reference, so the verdict shows little."""
    found = []
    for name, f in figures.items():
        if f.get("one_class") is not None:
            what = f"gives class {f['one_class']} at every position of all {samples} samples"
        elif f.get("flat"):
            what = f["flat"]
        else:
            continue
        found.append(f"the reference's output {name!r} barely depends on its input: it {what}, so any candidate close to "
                     "a constant passes. Give the reference trained weights (a randomly initialised model often "
                     "ignores its input: re-estimate its BatchNorm statistics on a few batches), or samples "
                     "that make it vary (data)")
    return found
