"""A lead between two raced calls: each round is one paired measurement, and a lead counts
only where the rounds agree on it (issue 24: a bootstrap over 5 rounds called a 1.24x lead on
a loaded host "beyond the noise"; on a quiet host it was 0.99x)."""

from __future__ import annotations

import pytest

from optbuild.model.race import lead, race


def rounds(per_round_ms: list[float], runs: int = 4) -> list[list[int]]:
    """Times in ns, ``runs`` per round, each round at its given latency (ms)."""
    return [[int(ms * 1e6)] * runs for ms in per_round_ms]


def test_a_lead_the_rounds_agree_on_is_beyond_the_noise():
    got = lead(rounds([10.0, 10.2, 9.9, 10.1, 10.0]), rounds([13.0, 13.1, 12.9, 13.3, 12.8]), "p50_ms")
    assert got.ratio == pytest.approx(1.3, abs=0.01)
    assert 1.25 < got.low < got.ratio < got.high < 1.35
    assert not got.within(0.03)


def test_a_lead_one_round_contradicts_is_within_the_noise():
    """Four rounds say 1.3x and one says 0.8x (the host got busy in it): the median of all runs
    still says 1.3x, but the rounds disagree, so it is a tie."""
    got = lead(rounds([10.0, 10.0, 10.0, 10.0, 16.0]), rounds([13.0, 13.0, 13.0, 13.0, 12.8]), "p50_ms")
    assert got.ratio == pytest.approx(1.3, abs=0.01)
    assert got.low < 1.0 and got.within(0.03)


def test_a_small_steady_lead_is_under_the_margin():
    got = lead(rounds([10.0] * 6), rounds([10.2, 10.2, 10.2, 10.2, 10.2, 10.21]), "p50_ms")
    assert 1.0 < got.low <= got.high < 1.03
    assert got.within(0.03) and not got.within(0.0)


def test_throughput_compares_time_per_sample():
    """Batch 8 at 40 ms against batch 1 at 10 ms: 5 ms per sample against 10, a 2x lead."""
    got = lead(rounds([40.0, 40.1, 39.9]), rounds([10.0, 10.0, 10.1]), "throughput_per_s", batches=(8, 1))
    assert got.ratio == pytest.approx(2.0, abs=0.01) and got.low > 1.9


def test_one_round_judges_nothing():
    with pytest.raises(ValueError, match="two rounds or more"):
        lead(rounds([10.0]), rounds([20.0]), "p50_ms")


def test_each_round_is_announced_before_its_calls_run():
    """``on_round`` (what select shows as "measuring round 2 of 3") comes before the round's
    first call, never inside one: two calls, 2 timed runs a round, each opened by one untimed."""
    calls: list[str] = []
    said: list[tuple[int, int]] = []
    race([lambda: calls.append("a"), lambda: calls.append("b")], runs=6, rounds=3,
         on_round=lambda r: said.append((r, len(calls))))
    assert said == [(0, 0), (1, 6), (2, 12)] and len(calls) == 18
