"""Models timed together: several calls raced in one process, interleaved in rounds and
repeated, and whether one's lead over another is beyond the noise.

A latency is a fact about a moment: one model measured 569.8 and 211.7 ms in two builds of a
shared host, and an fp16 chosen as "3.4x faster" from figures taken at different times was
1.02x when timed together (issue 24). Timed in turns, round after round, in the same process,
drift and load hit every model alike, and the rounds show how much a lead varies. ``select``
races its candidates this way; the clock is optbuild.model.timing's, as for every measurement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from optbuild.model.timing import blocks, gc_off

CONFIDENCE = 0.90  # the interval of a lead (two-sided)
_Z = 1.6448536269514722  # the standard normal's quantile at 1 - (1 - CONFIDENCE) / 2


def race(calls: Sequence[Callable[[], object]], runs: int, rounds: int, warmup: int = 0, *,
         on_round: Callable[[int], object] | None = None,
         decided: Callable[[list[list[list[int]]]], bool] | None = None,
         max_seconds: float = 0.0) -> list[list[list[int]]]:
    """Time each of ``calls`` ``runs`` times, in ``rounds`` rounds; per call, per round, the
    times in ns. Every call is first warmed up; in each round every call takes its turn
    (opening with one untimed call: caches and thread pools after the previous one) in an
    order that rotates by one each round, so that no call always follows the same one.
    Then, while ``decided(times)`` says the rounds cannot decide yet and the rounds have taken
    less than ``max_seconds``, more rounds (of the smallest block), asking ``decided`` again
    each time the rounds grew by a quarter (judging all rounds after each would cost more than
    a fast model's rounds): a lead that a loaded host made too noisy to judge gets more rounds
    before it is called a tie. ``on_round(r)`` is told as round ``r`` (from 0) begins, outside
    any timing."""
    for call in calls:
        for _ in range(warmup):
            call()
    sizes = blocks(runs, rounds)
    times: list[list[list[int]]] = [[] for _ in calls]
    began, ask = time.monotonic(), len(sizes)

    def more(r: int) -> bool:
        nonlocal ask
        if r < len(sizes):
            return True
        if decided is None or time.monotonic() - began >= max_seconds:
            return False
        if r < ask:
            return True
        ask = r + max(1, r // 4)
        return not decided(times)

    with gc_off():
        r = 0
        while more(r):
            if on_round is not None:
                on_round(r)
            _round(calls, times, r, sizes[min(r, len(sizes) - 1)])
            r += 1
    return times


def _round(calls: Sequence[Callable[[], object]], times: list[list[list[int]]], r: int, size: int) -> None:
    """Round ``r``: each call in turn, from the ``r``-th, one untimed call then ``size`` timed
    ones, their times appended to ``times`` as that call's new round."""
    clock = time.perf_counter_ns
    for k in range(len(calls)):
        i = (r + k) % len(calls)
        call = calls[i]
        timed: list[int] = []
        times[i].append(timed)
        call()
        for _ in range(size):
            started = clock()
            call()
            timed.append(clock() - started)


def undecided(times: Sequence[list[list[int]]], objective: str, batches: Sequence[int], margin: float) -> list[int]:
    """The calls (indices into ``times``, from one ``race``) whose lead against the fastest the
    rounds cannot decide yet: its interval (see ``lead``) reaches both below and above 1 +
    ``margin``, so that more rounds could make it a win as well as a tie (0.62-1.58x under load
    for a static INT8 that quiet rounds measured 1.5x faster). Empty: every lead is either
    beyond the noise or within ``margin`` throughout."""
    import numpy as np

    if len(times) < 2 or len(times[0]) < 2:
        return []
    spent = [cost(np.concatenate([np.asarray(r, dtype=np.float64) for r in rounds]) / 1e6, objective, batch)
             for rounds, batch in zip(times, batches, strict=True)]
    best = spent.index(min(spent))
    found = []
    for i, rounds in enumerate(times):
        if i != best:
            judged = lead(list(times[best]), list(rounds), objective, (batches[best], batches[i]))
            if judged.low <= 1 + margin < judged.high:
                found.append(i)
    return found


def cost(times_ms: Any, objective: str, batch: int) -> float:
    """What ``objective`` makes of timed runs (ms), lower is better: their p50 or p90, or for
    throughput the mean time per sample."""
    import numpy as np

    if objective == "throughput_per_s":
        return float(np.mean(times_ms)) / batch
    return float(np.percentile(times_ms, 50 if objective == "p50_ms" else 90))


def figures(rounds_ns: list[list[int]], batch: int) -> dict[str, Any]:
    """The figures of one raced call: p10 / p50 / p90 / mean / min / max (ms) over all its
    runs, throughput (batch / mean), and the p50 of each round (how far rounds drift)."""
    import numpy as np

    ms = np.concatenate([np.asarray(r, dtype=np.float64) for r in rounds_ns]) / 1e6
    p10, p50, p90 = (float(v) for v in np.percentile(ms, [10, 50, 90]))
    return {"runs": int(ms.size), "p10_ms": round(p10, 6), "p50_ms": round(p50, 6), "p90_ms": round(p90, 6),
            "mean_ms": round(float(ms.mean()), 6), "min_ms": round(float(ms.min()), 6),
            "max_ms": round(float(ms.max()), 6), "throughput_per_s": round(batch / (float(ms.mean()) / 1000), 3),
            "rounds_p50_ms": [round(float(np.median(r)) / 1e6, 6) for r in rounds_ns]}


@dataclass(frozen=True)
class Lead:
    """How much faster a winner is than another call raced with it: ``ratio`` the other's cost
    over the winner's, over all runs, and [low, high] the interval of that ratio from the
    rounds, each round's ratio taken as one paired measurement (see ``lead``); all three to 4
    decimals, as the report records them."""

    ratio: float
    low: float
    high: float

    def within(self, margin: float) -> bool:
        """Whether this lead could be noise, or is under ``margin`` (0.03: 3 %) anyway."""
        return self.low <= 1 + margin

    def as_json(self) -> dict[str, float]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high}

    def __str__(self) -> str:
        return f"{self.ratio:.2f}x, interval {self.low:.2f}-{self.high:.2f}x"


def lead(winner: list[list[int]], other: list[list[int]], objective: str, batches: tuple[int, int] = (1, 1)) -> Lead:
    """The lead of ``winner`` over ``other`` (their times per round from one ``race``) by
    ``objective``; ``batches`` their batch sizes (for throughput).

    The interval is Student's t over the logs of the per-round ratios: the two ran back to
    back in each round, so a round's ratio is one paired measurement, and a handful of rounds
    is too few for a bootstrap, which drew an interval far too narrow from 5 of them (a 1.24x
    lead "beyond the noise" on a loaded host measured 0.99x on a quiet one, issue 24)."""
    import numpy as np

    def ms(rounds: list[list[int]]) -> list[Any]:
        return [np.asarray(r, dtype=np.float64) / 1e6 for r in rounds]

    if len(winner) < 2:
        raise ValueError("a lead is judged over two rounds or more: one has no spread to judge by")
    wins, others = ms(winner), ms(other)
    overall = cost(np.concatenate(others), objective, batches[1]) / cost(np.concatenate(wins), objective, batches[0])
    logs = np.log([cost(o, objective, batches[1]) / cost(w, objective, batches[0]) for w, o in zip(wins, others)])
    half = _t_quantile(len(logs) - 1) * float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
    center = float(np.mean(logs))
    low, high = min(math.exp(center - half), overall), max(math.exp(center + half), overall)
    # rounded once, here: the report's figures and its sentences must say the same (4.8049
    # recorded, 4.805 printed as "4.81", was a lead that disagreed with itself)
    return Lead(round(overall, 4), round(low, 4), round(high, 4))


def _t_quantile(df: int) -> float:
    """Student's t quantile at 1 - (1 - CONFIDENCE) / 2 with ``df`` degrees of freedom, by the
    Cornish-Fisher expansion around the normal's (within 1.2 % of the exact value from df = 2:
    2.885 for 2.920, 2.130 for 2.132 at df = 4); numpy has no t distribution, and scipy is
    not a dependency for one number."""
    z = _Z
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))
