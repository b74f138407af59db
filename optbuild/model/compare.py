"""How far a candidate model's outputs are from a reference's, in one place so that every step
measures alike. Two entry points share the elementary figures of optbuild.model.metrics:
- ``compare_outputs``: one feed, every output, pass or fail against a relative tolerance
  with an absolute floor: the checks of export, simplify, opset, quantize and the engines.
- ``output_figures``: one output over many samples, max_abs / max_rel / cosine / top-1, whole
  and by parts of different scales: verify's figures, checked by
  optbuild.model.thresholds and shown by optbuild.model.verifyreport.

numpy is imported inside the functions: the CLI imports the step modules, and so this one,
at load time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from optbuild.model.metrics import constant, cosine, max_errors, one_class, top1

# An output passes a comparison when its errors are within the relative tolerance or within
# this many epsilons of its element type (float32: 9.5e-07): rounding of values near 1 inside
# the model, which is all an output whose values are tiny (a sigmoid far from 0.5) can show.
ROUNDING_EPS = 8


# --- one feed, every output: pass or fail ---------------------------------------------------
@dataclass(frozen=True)
class OutputError:
    """One output's max abs error, max error relative to the reference's largest magnitude,
    and the machine epsilon of its element type (0 for integers and booleans)."""

    name: str
    max_abs: float
    max_rel: float
    eps: float


class Comparison:
    """How far ``candidate`` outputs are from ``reference`` ones (see compare_outputs)."""

    def __init__(self, max_abs: float, max_rel: float, worst: str | None, problem: str | None,
                 outputs: list[OutputError] | None = None):
        self.max_abs, self.max_rel, self.worst, self.problem = max_abs, max_rel, worst, problem
        self.outputs = outputs or []

    def describe(self, tolerance: float) -> str:
        if self.problem:
            return self.problem
        return (f"max relative error {self.max_rel:.3g} > tolerance {tolerance:g} (output "
                f"{self.worst!r}, max abs error {self.max_abs:.3g})")

    def failure(self, tolerance: float, atol: float | None = None) -> str | None:
        """Why the candidate fails, None when it passes: every output must be within
        ``tolerance`` (relative) or within ``atol`` (absolute; None: ROUNDING_EPS epsilons
        of its element type), so that float rounding does not fail an output of tiny values."""
        if self.problem:
            return self.problem
        for out in sorted(self.outputs, key=lambda o: -o.max_rel):
            floor = ROUNDING_EPS * out.eps if atol is None else atol
            if not (out.max_rel <= tolerance or out.max_abs <= floor):
                return (f"output {out.name!r}: max relative error {out.max_rel:.3g} > tolerance "
                        f"{tolerance:g} and max abs error {out.max_abs:.3g} > atol {floor:.3g}")
        return None


def compare_outputs(names: list[str], reference: list[Any], candidate: list[Any]) -> Comparison:
    """Max abs and relative errors (``max_errors``) of each output of one feed, and the worst
    of them (see Comparison.failure). A different output count or shape is a ``problem``
    (errors are then inf)."""
    import numpy as np

    if len(reference) != len(candidate):
        return Comparison(float("inf"), float("inf"), None,
                          f"{len(candidate)} outputs where {len(reference)} were expected")
    worst_abs = worst_rel = 0.0
    worst = None
    outputs = []
    for i, (ref, out) in enumerate(zip(reference, candidate)):
        name = names[i] if i < len(names) else f"#{i}"
        ref, out = np.asarray(ref), np.asarray(out)
        if ref.shape != out.shape:
            return Comparison(float("inf"), float("inf"), name,
                              f"output {name!r} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        if ref.size == 0:
            continue
        err, rel = max_errors(ref, out)
        eps = max(float(np.finfo(a.dtype).eps) if np.issubdtype(a.dtype, np.floating) else 0.0
                  for a in (ref, out))
        outputs.append(OutputError(name, err, rel, eps))
        if rel > worst_rel or worst is None:
            worst = name
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
    return Comparison(worst_abs, worst_rel, worst, None, outputs)


# --- one output over many samples: verify's figures -----------------------------------------
# A part of an output (indices along one axis) whose reference peak is under 1/SCALE_GAP of the
# output's peak holds another quantity than the rest (a detector's scores beside its box
# coordinates): one 8-bit scale shared by both gives it under 1/16 of its steps, and whole-output
# figures, dominated by the large part, cannot see it lost. Such parts are judged on their own.
SCALE_GAP = 16
# More runs than this along the axis: small and large indices interleave (noise, not a
# concatenation of a few quantities), and the output is judged whole.
MAX_RUNS = 8
# A reference whose values span less than this fraction of its largest magnitude (over the
# elements, for the collapse check; from sample to sample, for the flat warning) is taken as not
# varying: a candidate constant there is within this max_rel of it (a reference varying in its
# 7th significant digit is float rounding), and the thresholds judge it.
FLAT_REL = 1e-4


def split_axis(shape: tuple[int, ...]) -> int | None:
    """The axis a [batch, ...] output is sliced along: the non-batch axis of the smallest size
    of 2 or more (a detector's [1, 4 + classes, anchors]: axis 1; [1, anchors, 4 + classes]:
    axis 2), the first of equals; None for rank 0 or 1, or when no such axis exists."""
    sizes = [(size, axis) for axis, size in enumerate(shape) if axis >= 1 and size >= 2]
    return min(sizes)[1] if sizes else None


def scale_runs(reference: list[Any], axis: int) -> list[tuple[int, int]]:
    """Contiguous runs [start, stop) of the indices along ``axis`` that are all large (peak
    |reference| over every sample at least the output's peak / SCALE_GAP) or all small. One run
    when the output is of one scale, or when there would be more than MAX_RUNS."""
    import numpy as np

    size = reference[0].shape[axis]
    peaks = np.zeros(size)
    for array in reference:
        values = np.abs(np.moveaxis(np.asarray(array, dtype=np.float64), axis, 0).reshape(size, -1))
        peaks = np.maximum(peaks, np.where(np.isfinite(values), values, 0.0).max(axis=1, initial=0.0))
    small = peaks < peaks.max() / SCALE_GAP
    starts = [0, *(int(i) for i in np.flatnonzero(small[1:] != small[:-1]) + 1)]
    runs = list(zip(starts, [*starts[1:], size]))
    return runs if len(runs) <= MAX_RUNS else [(0, size)]


def slice_name(output: str, rank: int, axis: int, start: int, stop: int) -> str:
    """How a report names part of an output: ``output0[:, 4:84, :]``."""
    return f"{output}[{', '.join(f'{start}:{stop}' if a == axis else ':' for a in range(rank))}]"



def _part_figures(reference: list[Any], candidate: list[Any]) -> dict[str, Any]:
    """max_abs, max_rel, cosine, cosine_min of one output or part of it (arrays per sample);
    ``degenerate``: what the reference is when it is constant (comparing with it shows
    nothing); ``collapsed``: what the candidate is when it is constant where the reference
    spans more than FLAT_REL of its largest magnitude (it lost what the part holds; a smaller
    span is rounding, within that max_rel of a constant)."""
    import numpy as np

    refs = [np.asarray(a, dtype=np.float64).ravel() for a in reference]
    cands = [np.asarray(a, dtype=np.float64).ravel() for a in candidate]
    ref, cand = np.concatenate(refs), np.concatenate(cands)
    if ref.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "cosine_min": 1.0, "degenerate": None,
                "collapsed": None}
    figures: dict[str, Any] = dict(zip(("max_abs", "max_rel"), max_errors(ref, cand)))
    overall = cosine(ref, cand)  # NaN when any sample holds NaN or inf, and then so is the worst
    figures["cosine"] = overall
    figures["cosine_min"] = overall if math.isnan(overall) else min(map(cosine, refs, cands))
    figures["degenerate"] = constant(ref)
    figures["collapsed"] = None
    finite = ref[np.isfinite(ref)]
    varies = figures["degenerate"] is None and finite.size and (
        np.ptp(finite) > FLAT_REL * float(np.abs(finite).max()))
    if varies and (flat := constant(cand)) is not None:
        figures["collapsed"] = f"{flat} where the reference spans [{finite.min():.4g}, {finite.max():.4g}]"
    return figures


def _flat(reference: list[Any]) -> str | None:
    """What a float reference is when it barely depends on its input: its largest change from
    sample to sample under FLAT_REL of its largest magnitude (with such a reference any
    candidate passes); None when it varies, or with fewer than 2 samples of one shape."""
    import numpy as np

    arrays = [np.asarray(a, dtype=np.float64) for a in reference]
    if (len(arrays) < 2 or any(a.shape != arrays[0].shape for a in arrays)
            or not np.issubdtype(np.asarray(reference[0]).dtype, np.floating)):
        return None
    stack = np.stack(arrays)
    finite = np.isfinite(stack).all(axis=0)
    if not finite.any():
        return None
    values = stack[:, finite]
    spread, scale = float(np.ptp(values, axis=0).max()), float(np.abs(values).max())
    if spread > FLAT_REL * scale:
        return None
    return f"changes by at most {spread:.3g} from sample to sample (its values reach {scale:.4g})"


def output_figures(reference: list[Any], candidate: list[Any], top1_axis: int | None, name: str = "output",
                   slices: tuple[int, list[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """Figures of one output ``name`` over all samples (arrays per sample): shape, dtype,
    max_abs, max_rel and cosine over all samples concatenated, the worst sample's cosine
    (cosine_min), degenerate and collapsed (see _part_figures), flat (see _flat), and with
    ``top1_axis`` (the axis that holds class scores) top1 and one_class (see one_class);
    with ``slices`` (axis, runs [start, stop) along it; more than one run; the last taken to
    each sample's end) the same figures, top1 aside, of each part under ``slices``, keyed by
    slice_name. Samples of different shapes give ``shape_mismatch`` instead."""
    import numpy as np

    shapes = [(tuple(r.shape), tuple(c.shape)) for r, c in zip(reference, candidate)]
    figures: dict[str, Any] = {"shape": list(shapes[0][0]), "dtype": str(candidate[0].dtype)}
    bad = [(i, r, c) for i, (r, c) in enumerate(shapes) if r != c]
    if bad:
        i, r, c = bad[0]
        figures["shape_mismatch"] = f"sample {i}: {c} vs {r}"
        return figures
    figures |= _part_figures(reference, candidate)
    figures["flat"] = None if figures["degenerate"] else _flat(reference)
    figures["top1"] = None if top1_axis is None else top1(reference, candidate, top1_axis)
    figures["top1_axis"] = top1_axis
    figures["one_class"] = None if top1_axis is None else one_class(reference, top1_axis)
    if slices is not None and len(slices[1]) > 1:
        axis, runs = slices
        rank = len(shapes[0][0])

        def part(arrays: list[Any], start: int, stop: int | None) -> list[Any]:
            return [np.asarray(a)[(slice(None),) * axis + (slice(start, stop),)] for a in arrays]

        figures["slices"] = {}
        for start, stop in runs:
            end = None if stop == runs[-1][1] else stop  # the last part runs to each sample's end
            figures["slices"][slice_name(name, rank, axis, start, stop)] = _part_figures(
                part(reference, start, end), part(candidate, start, end))
    return figures
