"""quantize's ``exclude_until``: keep float, one at a time, the node where the INT8 model first
departs from the float one, and quantize again, until its outputs reach a floor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from optbuild.common.errors import StepError
from optbuild.common.recipetable import RecipeTable

if TYPE_CHECKING:
    from optbuild.model.int8report import LayerError
    from optbuild.steps.base import StepContext


class ExcludeUntil(RecipeTable):
    """A floor on the INT8 model's outputs, met by keeping nodes float one at a time."""

    min_cosine: float = Field(gt=0, le=1, examples=[0.99])
    """The cosine every float output of the INT8 model must reach against the input model's
    (and every part of an output that joins quantities of different scales, as verify judges
    them), over REPORT_SAMPLES (4) seeded samples as `inputs` declares them."""
    max_excluded: int = Field(8, ge=1, examples=[16])
    """At most this many nodes are tried (kept float); the step fails if the floor is still not met."""


def exclude_until(ctx: StepContext, goal: ExcludeUntil, nodes_to_exclude: list[str], source: Path, model: Any,
                  out: Path, quantize: Callable[[list[str]], None],
                  samples: list[dict[str, Any]]) -> tuple[list[LayerError], dict[str, Any]]:
    """Keep float, one at a time, the node where the INT8 model at ``out`` first departs from
    ``source`` on ``samples``, until its outputs reach ``goal.min_cosine`` (see the parameter),
    ``nodes_to_exclude`` kept float throughout. Returns the last per-layer errors and the
    search, for quant_report.json."""
    from optbuild.model import int8report

    outputs = {o.name for o in model.graph.output}
    names = {n.name for n in model.graph.node}
    tensor_node = {o: n.name for n in model.graph.node for o in n.output}
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in dict.fromkeys(n.input):
            readers.setdefault(i, []).append(n.name)
    by_hand = list(nodes_to_exclude)
    excluded: list[str] = []
    tried: list[str] = []

    def measure() -> tuple[list[LayerError], LayerError]:
        errors = int8report.layer_errors(source, out, samples)
        judged = [e for e in errors if e.tensor in outputs]
        if not judged:
            raise StepError("exclude_until: the model has no float output to compare with the input "
                            "model's; remove exclude_until from this step")
        return errors, min(judged, key=lambda e: e.worst)

    errors, worst = measure()
    rounds = [_round(excluded, worst)]
    full = ""  # why the search stopped short of max_excluded, when a tensor's readers would pass it
    while worst.worst < goal.min_cosine and len(tried) < goal.max_excluded:
        nodes, tensor = _next_exclusion(errors, goal.min_cosine, _quantized_nodes(names, out),
                                        _requantized(out), readers, {*by_hand, *tried})
        if not nodes:
            break
        if len(tried) + len(nodes) > goal.max_excluded:
            full = (f"{len(tried)} nodes tried, and keeping {tensor!r} float takes the {len(nodes)} that "
                    f"read it ({', '.join(nodes)}), past exclude_until.max_excluded = {goal.max_excluded}")
            break
        tried.extend(nodes)
        previous = out.read_bytes()
        quantize([*by_hand, *excluded, *nodes])
        listed = ", ".join(map(repr, nodes))
        why = "" if tensor_node.get(tensor) == nodes[0] else f" (the nodes that read {tensor!r}: it stayed quantized for them)"
        if out.read_bytes() == previous:
            ctx.log(f"exclude_until: keeping {listed} float{why} changes nothing; passed over")
            continue
        excluded.extend(nodes)
        errors, worst = measure()
        rounds.append(_round(excluded, worst))
        ctx.log(f"exclude_until: kept {listed} float{why}: worst output {rounds[-1]['output']} cosine "
                f"{worst.worst:.5f}")
    met = worst.worst >= goal.min_cosine
    search = {"min_cosine": goal.min_cosine, "max_excluded": goal.max_excluded, "met": met,
              "excluded": excluded, "tried": tried, "rounds": rounds}
    ctx.metrics.update(auto_excluded=excluded, auto_exclude_cosine_before=rounds[0]["cosine"],
                       auto_exclude_cosine_after=rounds[-1]["cosine"])
    before, after = rounds[0], rounds[-1]
    if not met:
        steps = "\n".join(f"  {r['excluded'] or 'none'}: {r['output']} cosine {r['cosine']:.5f}" for r in rounds)
        why = full or (f"{len(tried)} nodes tried, exclude_until.max_excluded = {goal.max_excluded}"
                       if len(tried) >= goal.max_excluded else
                       "no other quantized node departs under the floor")
        raise StepError(
            f"exclude_until: the INT8 model's worst output stays under min_cosine = {goal.min_cosine} "
            f"({why}); nodes tried: {tried or 'none'}. Nodes kept float -> worst output:\n{steps}\n"
            f"The worst tensors now:\n{int8report.table(errors)}\n"
            f"Raise exclude_until.max_excluded, lower exclude_until.min_cosine, quantize fewer op types "
            f"(op_types_to_quantize), or try per_channel = true or another calibration method")
    if excluded:
        ctx.log(f"exclude_until: kept {len(excluded)} node(s) float to reach min_cosine {goal.min_cosine}: "
                f"{', '.join(excluded)}; worst output {before['output']} cosine {before['cosine']:.5f} -> "
                f"{after['output']} {after['cosine']:.5f} (nodes_to_exclude = {[*by_hand, *excluded]!r} "
                f"gives this model without the search)")
    else:
        ctx.log(f"exclude_until: worst output {before['output']} cosine {before['cosine']:.5f} meets "
                f"min_cosine {goal.min_cosine}; no node excluded")
    return errors, search



def _round(excluded: list[str], worst: LayerError) -> dict[str, Any]:
    """One step of exclude_until's search, for quant_report.json and the log."""
    return {"excluded": list(excluded), "output": worst.part if worst.part_cosine == worst.worst else worst.tensor,
            "cosine": worst.worst}


def _next_exclusion(errors: list[LayerError], floor: float, quantized: set[str], requantized: set[str],
                    readers: dict[str, list[str]], skip: set[str]) -> tuple[list[str], str | None]:
    """exclude_until's next nodes to keep float, and the tensor they are for: at the first
    tensor (node order) under ``floor``, the node that makes it if quantized (its inputs or
    weights quantized: ``quantized``) and not yet tried (``skip``); else, when the tensor is
    itself still quantized (``requantized``: a QuantizeLinear reads it), all the quantized
    nodes that read it, together: onnxruntime puts a QuantizeLinear / DequantizeLinear pair on
    a tensor that any quantized reader takes, so keeping its maker float alone leaves it
    quantized (a ViT's class token, of a smaller scale than the patch tokens beside it, was
    lost that way whatever node was kept float). ([], None) when no tensor under the floor
    has such nodes left."""
    for e in errors:
        if e.worst >= floor:
            continue
        if e.node in quantized and e.node not in skip:
            return [e.node], e.tensor
        if e.tensor in requantized:
            nodes = [n for n in readers.get(e.tensor, []) if n in quantized and n not in skip]
            if nodes:
                return nodes, e.tensor
    return [], None


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
