"""The elementary figures of one output against a reference's: its largest errors, its cosine
similarity, top-1 agreement, and whether an array holds one value or one class throughout. The
per-feed checks and verify's figures (optbuild.model.compare) and the INT8 report
(optbuild.model.int8report) all measure with these, so that every step measures alike.

numpy is imported inside the functions: the CLI imports the step modules, and so this one,
at load time.
"""

from __future__ import annotations

from typing import Any


def max_errors(reference: Any, candidate: Any) -> tuple[float, float]:
    """(max_abs, max_rel) of one output: the largest |candidate - reference|, and that over the
    reference's largest finite magnitude. Relative to the output's scale, not element-wise, so
    values near zero do not blow it up. NaN or inf in the same places on both sides count as
    equal; anywhere else they make the error inf. Arrays of the same shape; empty: (0, 0)."""
    import numpy as np

    r, o = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    if r.size == 0:
        return 0.0, 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(r - o)
    same = (np.isnan(r) & np.isnan(o)) | (np.isinf(r) & (r == o))
    diff = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
    err = float(diff.max())
    finite = np.abs(r[np.isfinite(r)])
    scale = float(finite.max()) if finite.size else 0.0
    return err, err / max(scale, 1e-12)


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two flat arrays: whether the outputs point the same way, whatever
    their scale (quantization noise lowers it, a sign flip makes it negative). 1 when both are
    all zeros, 0 when one is; NaN when either holds NaN or inf."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def top1(reference: list[Any], candidate: list[Any], axis: int = -1) -> float | None:
    """Share of positions (every index but ``axis``, over all samples) whose argmax over
    ``axis`` agrees: top-1 agreement of class scores (per token of [batch, seq, vocab], per
    pixel of [batch, classes, H, W] with axis 1). None when there are no positions."""
    import numpy as np

    agree = total = 0
    for r, c in zip(reference, candidate):
        a, b = _argmax(r, axis), _argmax(c, axis)
        agree += int(np.sum(a == b))
        total += a.size
    return agree / total if total else None


def _argmax(array: Any, axis: int) -> Any:
    """The argmax over ``axis`` at every other index, flat."""
    import numpy as np

    moved = np.moveaxis(np.asarray(array), axis, -1)
    return np.argmax(moved.reshape(-1, moved.shape[-1]), axis=-1)


# Fewer positions (rows, tokens, pixels over all samples) than this may all get one class by chance.
ONE_CLASS_POSITIONS = 8


def one_class(reference: list[Any], axis: int) -> int | None:
    """The class a reference's argmax over ``axis`` gives at every position of every sample,
    when it is one and there are ONE_CLASS_POSITIONS positions or more (a classifier that says
    the same for any input: comparing with it shows little); None otherwise."""
    import numpy as np

    found = np.concatenate([_argmax(r, axis) for r in reference]) if reference else np.array([])
    return int(found[0]) if found.size >= ONE_CLASS_POSITIONS and bool(np.all(found == found[0])) else None


def constant(values: Any) -> str | None:
    """What a flat array is when it holds one value throughout ("constant 0"), or no finite
    value; None when it varies, or has fewer than 2 elements (nothing to tell)."""
    import numpy as np

    if values.size < 2:
        return None
    if not np.isfinite(values).any():
        return "no finite value"
    return f"constant {float(values[0]):.4g}" if bool(np.all(values == values[0])) else None
