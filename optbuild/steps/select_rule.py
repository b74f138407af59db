"""Select's judgement: why a candidate is dropped whatever its speed (its verify, size and
cosine) or for it (the latency and throughput limits), and the tie rule that picks the winner
among the rest (the rule and its worked example: Select's docstring, docs/steps.md#select).
"""

from __future__ import annotations

import typing
from typing import Any

if typing.TYPE_CHECKING:
    from optbuild.steps.select_params import SelectParams

OBJECTIVES = {  # what is better: lower or higher
    "p50_ms": min, "p90_ms": min, "throughput_per_s": max, "size_bytes": min,
}

# A tie goes to the smaller model only when it is smaller by more than this; within it (an
# onnxruntime-optimized copy 20 KB off its 109 MB source), to the candidate listed first.
SIZE_MARGIN = 1.05


def rejections(p: SelectParams, row: dict[str, Any]) -> list[str]:
    """Why the candidate is dropped whatever its speed: its verify, cosine and size."""
    verify, size = row["verify"], row["benchmark"]["size_bytes"]
    why = []
    if verify is not None and not verify.get("passed", False):
        why.append("its verify step failed")
    if p.max_size_mb is not None and size > p.max_size_mb * (1 << 20):
        why.append(f"size {size / (1 << 20):.2f} MiB > {p.max_size_mb}")
    if p.min_cosine is not None:
        cosine = None if verify is None else verify.get("cosine")
        if cosine is None:
            why.append("no verify cosine to check min_cosine against")
        elif cosine < p.min_cosine:
            why.append(f"cosine {cosine:.6f} < {p.min_cosine}")
    return why

def over_limits(p: SelectParams, figures: dict[str, float]) -> list[str]:
    """Why the candidate is dropped for its speed, by the figures judged."""
    why = []
    if p.max_p50_ms is not None and figures["p50_ms"] > p.max_p50_ms:
        why.append(f"p50 {figures['p50_ms']:.3f} ms > {p.max_p50_ms}")
    if p.min_throughput is not None and figures["throughput_per_s"] < p.min_throughput:
        why.append(f"throughput {figures['throughput_per_s']:.1f}/s < {p.min_throughput}")
    return why

def decide(p: SelectParams, eligible: list[dict[str, Any]], times: dict[int, list[list[int]]],
           report: dict[str, Any]) -> dict[str, Any]:
    """The winner among ``eligible``, each row's verdict, and the tie when there is one.
    Measured together: the best, and every candidate whose lead it may not beat beyond the
    noise, are tied. Cached: equal figures are tied. A tie goes to the smaller model (by more
    than SIZE_MARGIN), then to the candidate listed first, among those measured within
    ``min_lead`` of the best; where the best is alone there, to it (the faster as measured)."""
    from optbuild.model import race

    objective = p.objective
    best = OBJECTIVES[objective](r["figures"][objective] for r in eligible)
    fastest = next(r for r in eligible if r["figures"][objective] == best)

    def lead(winner: dict[str, Any], other: dict[str, Any]) -> race.Lead:
        return race.lead(times[winner["index"]], times[other["index"]], objective,
                         (winner["batch"], other["batch"]))

    if times:
        behind = {r["index"]: lead(fastest, r) for r in eligible if r is not fastest}  # each by the fastest
        tied = [r for r in eligible if r is fastest or behind[r["index"]].within(p.min_lead)]
        # as fast as measured: a 1.50x lead whose interval reaches 1.03 on a noisy host is
        # a tie, but the faster is still the better guess; size decides among the equal only
        level = [r for r in tied if r is fastest or behind[r["index"]].ratio <= 1 + p.min_lead]
    else:
        tied = level = [r for r in eligible if r["figures"][objective] == best]
    smallest = min(r["figures"]["size_bytes"] for r in level)
    as_small = [r for r in level if r["figures"]["size_bytes"] <= smallest * SIZE_MARGIN]
    winner = min(as_small, key=lambda r: r["index"])
    report["chosen"] = winner["step"]
    others = [r for r in tied if r is not winner]
    if others:
        rule = ("the faster as measured" if len(level) == 1 else
                "the smaller model" if len(as_small) == 1 else "the one listed first")
        report["tie"] = {"with": [r["step"] for r in others], "broken_by": rule}
    for row in eligible:
        winning = lead(winner, row) if times and row is not winner else None
        row["winner_lead"] = winning.as_json() if winning else None
        if row is winner:
            row["why"] = "chosen" + (f": tied{' within the noise' if times else ''} with {', '.join(report['tie']['with'])}, "
                                     f"broken by {report['tie']['broken_by']}" if others else "")
        elif row in tied:  # judged against the fastest, as the tie was
            if not times:
                row["why"] = "tied with the winner"
            elif row is fastest:
                row["why"] = f"the fastest, tied with the winner within the noise ({lead(row, winner)})"
            else:
                row["why"] = f"tied with the fastest, {fastest['step']}, within the noise ({behind[row['index']]})"
            row["why"] += f"; the tie goes to {report['tie']['broken_by']}"
        else:
            row["why"] = f"{objective} {row['figures'][objective]:g}" + (
                f": the winner is {winning.ratio:.2f}x faster (interval {winning.low:.2f}-{winning.high:.2f}x)"
                if winning else "")
    return winner
