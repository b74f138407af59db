"""quantize's ``exclude_until``: keep float the nodes where the INT8 model departs from the
float one, starting where it departs (the nodes the step's warnings name, then the way back
from the outputs under the floor), and quantize again, until its outputs reach a floor.

A node whose exclusion does not bring the worst output closer to the floor is passed over
(the model goes back to what it was) and not counted: on a detector whose boxes and scores
share one Concat, the old search walked the backbone from its first Conv in node order, kept 8
nodes float that changed nothing (score cosine 0.00000 throughout) and gave up, while the
step's own warning named the Concat whose exclusion alone fixed it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from optbuild.common.errors import StepError
from optbuild.common.recipetable import RecipeTable

if TYPE_CHECKING:
    from optbuild.model.int8report import LayerError
    from optbuild.steps.base import StepContext

GAIN = 0.01  # a kept exclusion closes at least this share of the gap between the worst output and the floor
SPREAD = 4  # this many departing tensors (and half of those) the worst output depends on: the error is spread


class ExcludeUntil(RecipeTable):
    """A floor on the INT8 model's outputs, met by keeping nodes float one at a time."""

    min_cosine: float = Field(gt=0, le=1, examples=[0.99])
    """The cosine every float output of the INT8 model must reach against the input model's
    (and every part of an output that joins quantities of different scales, as verify judges
    them), over REPORT_SAMPLES (4) seeded samples as `inputs` declares them."""
    max_excluded: int = Field(8, ge=1, examples=[16])
    """At most this many nodes are kept float; the step fails if the floor is still not met.
    Nodes whose exclusion does not help are passed over and not counted."""
    max_seconds: float = Field(300, gt=0, examples=[900])
    """The search's time budget: no new trial (quantize again, compare again) starts after
    this many seconds; the step then fails if the floor is not met."""


@dataclass(frozen=True)
class _Graph:
    """The float model's wiring, by name."""

    outputs: set[str]
    producer: dict[str, str]  # tensor -> the node that makes it
    inputs: dict[str, list[str]]  # node -> the tensors it reads
    readers: dict[str, list[str]]  # tensor -> the nodes that read it

    @classmethod
    def of(cls, model: Any) -> _Graph:
        readers: dict[str, list[str]] = {}
        for n in model.graph.node:
            for i in dict.fromkeys(n.input):
                readers.setdefault(i, []).append(n.name)
        return cls({o.name for o in model.graph.output}, {o: n.name for n in model.graph.node for o in n.output},
                   {n.name: list(n.input) for n in model.graph.node}, readers)


@dataclass(frozen=True)
class _Candidate:
    """Nodes to keep float together, and why they are tried."""

    nodes: list[str]
    why: str  # for the log: "" or " (...)"


def exclude_until(ctx: StepContext, goal: ExcludeUntil, nodes_to_exclude: list[str], source: Path, model: Any,
                  out: Path, quantize: Callable[[list[str]], None], samples: list[dict[str, Any]],
                  suspects: list[list[str]]) -> tuple[list[LayerError], dict[str, Any]]:
    """Keep float the nodes where the INT8 model at ``out`` departs from ``source`` on
    ``samples``, until its outputs reach ``goal.min_cosine`` (see the parameter),
    ``nodes_to_exclude`` kept float throughout; ``suspects``: groups of nodes the step's
    warnings name, tried first. Returns the last per-layer errors and the search, for
    quant_report.json."""
    from optbuild.model import int8report

    graph = _Graph.of(model)
    names = {n.name for n in model.graph.node}
    by_hand = list(nodes_to_exclude)
    excluded: list[str] = []
    tried: list[frozenset[str]] = []  # the groups quantized again, or left out for max_excluded
    trials: list[list[str]] = []  # the groups quantized again, in order
    passed: list[list[str]] = []
    too_big = ""  # the last group left out for max_excluded

    def measure() -> tuple[list[LayerError], LayerError]:
        errors = int8report.layer_errors(source, out, samples)
        judged = [e for e in errors if e.tensor in graph.outputs]
        if not judged:
            raise StepError("exclude_until: the model has no float output to compare with the input "
                            "model's; remove exclude_until from this step")
        return errors, min(judged, key=lambda e: e.worst)

    start = time.monotonic()
    errors, worst = measure()
    rounds = [_round(excluded, worst)]
    stop = "no other quantized node on the way to the worst output departs under the floor"
    while worst.worst < goal.min_cosine:
        spent = time.monotonic() - start
        if len(excluded) >= goal.max_excluded or spent >= goal.max_seconds:
            stop = (f"{len(excluded)} nodes kept float, exclude_until.max_excluded = {goal.max_excluded}"
                    if len(excluded) >= goal.max_excluded else
                    f"exclude_until.max_seconds = {goal.max_seconds:g} spent: {spent:.1f} s, {len(trials)} trials")
            break
        candidates = _candidates(errors, goal.min_cosine, graph, suspects, _quantized_nodes(names, out),
                                 _requantized(out), {*by_hand, *excluded}, {n for p in passed for n in p})
        candidate, left_out = _first_fitting(candidates, tried, goal.max_excluded - len(excluded))
        if left_out is not None:
            too_big = (f"; keeping {', '.join(left_out.nodes)} float together{left_out.why} would pass "
                       f"exclude_until.max_excluded = {goal.max_excluded}")
        if candidate is None:
            break
        trials.append(candidate.nodes)
        previous = out.read_bytes()
        quantize([*by_hand, *excluded, *candidate.nodes])
        listed = ", ".join(map(repr, candidate.nodes))
        if out.read_bytes() == previous:
            passed.append(candidate.nodes)
            ctx.log(f"exclude_until: keeping {listed} float{candidate.why} changes nothing in the model; passed over")
            continue
        new_errors, new_worst = measure()
        gap = goal.min_cosine - worst.worst
        gain = new_worst.worst - worst.worst
        if new_worst.worst < goal.min_cosine and gain < GAIN * gap:
            out.write_bytes(previous)
            passed.append(candidate.nodes)
            ctx.log(f"exclude_until: keeping {listed} float{candidate.why}: worst output "
                    f"{_round([], new_worst)['output']} cosine {new_worst.worst:.5f}, no better; passed over")
            continue
        excluded.extend(candidate.nodes)
        errors, worst = new_errors, new_worst
        rounds.append(_round(excluded, worst))
        ctx.log(f"exclude_until: kept {listed} float{candidate.why}: worst output {rounds[-1]['output']} cosine "
                f"{worst.worst:.5f}")
    met = worst.worst >= goal.min_cosine
    seconds = time.monotonic() - start
    search = {"min_cosine": goal.min_cosine, "max_excluded": goal.max_excluded, "max_seconds": goal.max_seconds,
              "met": met, "excluded": excluded, "tried": list(dict.fromkeys(n for t in trials for n in t)),
              "passed_over": passed, "rounds": rounds}
    ctx.metrics.update(auto_excluded=excluded, auto_exclude_cosine_before=rounds[0]["cosine"],
                       auto_exclude_cosine_after=rounds[-1]["cosine"], auto_exclude_seconds=round(seconds, 3))
    if not met:
        raise StepError(_failure(goal, errors, worst, graph, rounds, passed, stop, too_big))
    before, after = rounds[0], rounds[-1]
    if excluded:
        ctx.log(f"exclude_until: kept {len(excluded)} node(s) float to reach min_cosine {goal.min_cosine}: "
                f"{', '.join(excluded)}; worst output {before['output']} cosine {before['cosine']:.5f} -> "
                f"{after['output']} {after['cosine']:.5f} (nodes_to_exclude = {[*by_hand, *excluded]!r} "
                f"gives this model without the search)")
    else:
        ctx.log(f"exclude_until: worst output {before['output']} cosine {before['cosine']:.5f} meets "
                f"min_cosine {goal.min_cosine}; no node excluded")
    return errors, search


def _failure(goal: ExcludeUntil, errors: list[LayerError], worst: LayerError, graph: _Graph,
             rounds: list[dict[str, Any]], passed: list[list[str]], stop: str, too_big: str) -> str:
    """The error of a search that did not reach the floor: what it kept and passed over, the
    worst tensors, and what to change. Where most tensors the worst output depends on depart
    (SPREAD or more; a mobile net's error builds up so) and no group of nodes was left out for
    max_excluded (``too_big``), no node holds the error: settings other than exclusions are what
    works."""
    from collections import Counter

    from optbuild.model import int8report

    steps = "\n".join(f"  {r['excluded'] or 'none'}: {r['output']} cosine {r['cosine']:.5f}" for r in rounds)
    kept = rounds[-1]["excluded"] or "none"
    skipped = f"; passed over (no gain on the outputs): {passed}" if passed else ""
    head = (f"exclude_until: the INT8 model's worst output stays under min_cosine = {goal.min_cosine} "
            f"({stop}{too_big}); nodes kept float: {kept}{skipped}. Nodes kept float -> worst output:\n{steps}\n"
            f"The worst tensors now:\n{int8report.table(errors)}\n")
    measured = {e.tensor: e for e in errors}
    way = [t for t in _way_back([worst.tensor], graph, lambda t: True) if t in measured]
    departing = [measured[t] for t in way if measured[t].worst < goal.min_cosine]
    if not too_big and len(departing) >= SPREAD and 2 * len(departing) >= len(way):
        ops = ", ".join(f"{op} {n}" for op, n in Counter(e.op for e in departing).most_common())
        return head + (
            f"The error is spread over the network, not held by a few nodes: {len(departing)} of the "
            f"{len(way)} tensors compared that {worst.tensor!r} depends on are under min_cosine (made by {ops}): "
            f"the error builds up over the whole network, each layer losing a little (as in a mobile net's "
            f"depthwise convolutions), so keeping nodes float one at a time will not reach the floor. What "
            f"works there: per_channel = true; more calibration data, or method = \"entropy\" or \"percentile\" on "
            f"the calibrate step; quantize fewer op types (op_types_to_quantize without the ones above); "
            f"mode = \"dynamic\" (weights only) or mode = \"fp16\" on this step")
    return head + ("Raise exclude_until.max_excluded or max_seconds, lower exclude_until.min_cosine, quantize "
                   "fewer op types (op_types_to_quantize), or try per_channel = true or another calibration method")


def _first_fitting(candidates: Iterator[_Candidate], tried: list[frozenset[str]],
                   room: int) -> tuple[_Candidate | None, _Candidate | None]:
    """The first of ``candidates`` not ``tried`` of at most ``room`` nodes, and the last one
    left out for being larger (both marked tried: a group is kept float whole, or not at all)."""
    left_out = None
    for c in candidates:
        if frozenset(c.nodes) in tried:
            continue
        tried.append(frozenset(c.nodes))
        if len(c.nodes) <= room:
            return c, left_out
        left_out = c
    return None, left_out


def _round(excluded: list[str], worst: LayerError) -> dict[str, Any]:
    """One step of exclude_until's search, for quant_report.json and the log."""
    return {"excluded": list(excluded), "output": worst.part if worst.part_cosine == worst.worst else worst.tensor,
            "cosine": worst.worst}


def _way_back(starts: list[str], graph: _Graph, follow: Callable[[str], bool]) -> list[str]:
    """The tensors from ``starts`` back through the nodes that make them, nearest first
    (breadth first), following only inputs that ``follow`` (and made by a node)."""
    way, queue = list(dict.fromkeys(starts)), list(dict.fromkeys(starts))
    while queue:
        node = graph.producer.get(queue.pop(0))
        for tensor in graph.inputs.get(node, []) if node else []:
            if tensor in graph.producer and tensor not in way and follow(tensor):
                way.append(tensor)
                queue.append(tensor)
    return way


def _candidates(errors: list[LayerError], floor: float, graph: _Graph, suspects: list[list[str]],
                quantized: set[str], requantized: set[str], kept: set[str], passed: set[str]) -> Iterator[_Candidate]:
    """exclude_until's next nodes to keep float, best bet first. The way back from the
    outputs under ``floor`` (worst first) through the tensors that depart (or are not
    compared): the step's ``suspects`` on it (a Concat its warning names); then, nearest the
    outputs first, for each tensor on it and then for each other departing tensor the outputs
    depend on (a part that departs can hide in a whole that does not: a class token in its
    sequence), the tensor's node if quantized (``quantized``) and not ``kept`` float
    already; when the tensor is itself still quantized (``requantized``: a QuantizeLinear reads
    it), all the quantized nodes that read it, together with its node if that was ``passed``
    over: onnxruntime puts a QuantizeLinear / DequantizeLinear pair on a tensor that any
    quantized reader takes, so keeping its maker float alone leaves it quantized (a ViT's class
    token, of a smaller scale than the patch tokens beside it, was lost that way whatever single
    node was kept float)."""
    compared = {e.tensor: e for e in errors}
    failing = sorted((e for e in errors if e.tensor in graph.outputs and e.worst < floor), key=lambda e: e.worst)
    starts = [e.tensor for e in failing]
    way = _way_back(starts, graph, lambda t: t not in compared or compared[t].worst < floor)
    makers = {graph.producer[t] for t in way}

    def free(nodes: list[str]) -> list[str]:
        return [n for n in dict.fromkeys(nodes) if n in quantized and n not in kept]

    for group in suspects:
        if makers & set(group) and (nodes := free(group)):
            yield _Candidate(nodes, " (named by the warning above)")
    beyond = [t for t in _way_back(starts, graph, lambda t: True) if t in compared and compared[t].worst < floor]
    for tensor in dict.fromkeys([*way, *beyond]):
        node = graph.producer[tensor]
        if node in quantized and node not in kept:
            yield _Candidate([node], "")
        if tensor in requantized:
            readers = free(graph.readers.get(tensor, []))
            together = free([node]) if node in passed else []
            if readers and readers != [node]:
                yield _Candidate([*together, *readers],
                                 f" (with the nodes that read {tensor!r}: it stays quantized for them)")


def _requantized(path: Path) -> set[str]:
    """The tensors of the INT8 model at ``path`` that a QuantizeLinear reads (in QDQ format:
    the tensors its readers take quantized)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return {n.input[0] for n in graph.node if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear")}


def _quantized_nodes(names: set[str], path: Path) -> set[str]:
    """Which of the float model's nodes ``names`` the INT8 model at ``path`` quantized, as far as its
    graph tells: nodes it replaced (their names are gone: dynamic and QOperator rename them),
    and nodes that read a DequantizeLinear or feed a QuantizeLinear (QDQ). Keeping any other
    node float changes nothing."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    quantizing = {n.input[0] for n in graph.node if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear")}
    present = {n.name for n in graph.node}
    touched = {n.name for n in graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
               and (dequantized & set(n.input) or quantizing & set(n.output))}
    return (names - present) | (names & touched)
