"""Select's parameters (docs/steps.md#select), apart from the step so that its race
(select_race) and its judgement (select_rule) read them without importing the step.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from optbuild.common.recipetable import StepRef
from optbuild.model.inputdecl import InputDecls, StepInputs, inputs_field, narrowed
from optbuild.steps import fields
from optbuild.steps.base import StepParams


class SelectParams(StepParams):
    candidates: list[StepRef] = Field(min_length=1, examples=[["bench[*]"]])
    """The benchmark steps to choose among, in order of preference for ties; 'NAME[*]' stands
    for every instance of a matrix step."""
    objective: Literal["p50_ms", "p90_ms", "throughput_per_s", "size_bytes"] = Field(
        "p50_ms", examples=["throughput_per_s"])
    """What makes a candidate best: the lowest p50 or p90 latency, the highest throughput, or
    the smallest model."""
    max_p50_ms: float | None = Field(None, gt=0, examples=[5.0])
    """Drop candidates whose p50 latency is above this (ms)."""
    min_throughput: float | None = Field(None, gt=0, examples=[200.0])
    """Drop candidates that run fewer inferences per second."""
    min_cosine: float | None = Field(None, ge=-1, le=1, examples=[0.99])
    """Drop candidates whose verify step measured a lower cosine similarity (the worst output,
    or part of one: a detector's class scores, see verify's slices), and those without a verify
    step."""
    max_size_mb: float | None = Field(None, gt=0, examples=[50.0])
    """Drop candidates whose model files are larger (MiB)."""
    measure: Literal["together", "cached"] = Field("together", examples=["cached"])
    """'together': measure the candidates again, together in this step, interleaved in rounds,
    and judge by those figures (a lead within the noise is a tie); the step is then bound to
    this host like a benchmark. 'cached': judge by the figures each benchmark step took when
    it ran (for candidates that cannot all run on one host)."""
    runs: int = Field(50, ge=1, examples=[200])
    """Timed inferences per candidate when measuring together, split over the rounds."""
    rounds: int = Field(10, ge=3, examples=[20])
    """Rounds when measuring together: in each, every candidate runs its share of the runs in
    turn, the order rotating each round; the noise of a lead is judged over them."""
    warmup: int = Field(5, ge=0, examples=[20])
    """Untimed inferences per candidate before the rounds."""
    max_seconds: float = Field(30.0, ge=0, examples=[120.0])
    """When measuring together: where the rounds leave a lead undecided (its interval reaches
    below and above 1 + min_lead: 0.62-1.58x on a loaded host), more rounds are measured, all
    candidates in turn, until every lead is decided or the rounds have taken this many seconds;
    only then is such a lead a tie. The first `rounds` always run in full. 0: no more rounds."""
    min_lead: float = Field(0.03, ge=0, examples=[0.05])
    """A lead by less than this fraction (0.03: 3 %) is a tie even when it is beyond the noise:
    smaller than what a host drifts between builds."""
    seed: int = fields.seed_field(note=" The shapes are those each candidate's benchmark recorded; "
                                       "values as declared, else as the benchmark draws them.")
    inputs: StepInputs = inputs_field(" Only values (range, values) are taken from it: the shapes are "
                                      "the benchmarks'.", example={"tokens": {"range": [0, 30521]}})

    def inputs_read(self) -> InputDecls | None:
        """Values only: the shapes timed are those the benchmarks recorded."""
        return narrowed(self.inputs, ("dtype", "range", "values"))

    @model_validator(mode="after")
    def _rounds_filled(self) -> SelectParams:
        if self.runs < self.rounds:
            raise ValueError(f"runs ({self.runs}) < rounds ({self.rounds}): every round times each candidate "
                             "at least once")
        return self
