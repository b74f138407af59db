"""Walks over an ONNX graph and its subgraphs (If branches, Loop and Scan bodies): the
edits the quantize step makes before and after onnxruntime's tools, and what it reads of a
model. onnx is imported inside the functions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def subgraphs(node: Any) -> list[Any]:
    """The graphs held by a node's attributes (If branches, Loop and Scan bodies)."""
    from onnx import AttributeProto

    graphs = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            graphs.append(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            graphs.extend(attr.graphs)
    return graphs


def all_nodes(graph: Any) -> Iterator[Any]:
    """Every node of ``graph`` and, depth first, of its nodes' subgraphs."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def default_opset(model: Any) -> int:
    """The model's opset of the default ONNX domain."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def constants_to_initializers(graph: Any, nested: bool) -> int:
    """Turn Constant nodes holding a tensor (``value``) into initializers of their graph (and,
    with ``nested``, of subgraphs), in node order so the result is byte-deterministic.
    onnxruntime quantizes initializer weights only. A Constant that is its graph's output
    stays a node (an output must be produced). Returns how many were moved."""
    outputs = {o.name for o in graph.output}
    kept, moved = [], 0
    for node in graph.node:
        if (node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1
                and node.attribute[0].name == "value" and node.output[0] not in outputs):
            tensor = graph.initializer.add()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            moved += 1
            continue
        kept.append(node)
        if nested:
            moved += sum(constants_to_initializers(sub, nested) for sub in subgraphs(node))
    if moved:
        del graph.node[:]
        graph.node.extend(kept)
    return moved


def outer_reads(graph: Any) -> set[str]:
    """Names the nodes of ``graph`` (and of its subgraphs) read from enclosing graphs."""
    own = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    own |= {o for n in graph.node for o in n.output}
    reads = {i for n in graph.node for i in n.input if i}
    reads |= {name for n in graph.node for sub in subgraphs(n) for name in outer_reads(sub)}
    return reads - own


def sort_topologically(graph: Any) -> bool:
    """Order the nodes of ``graph`` and its subgraphs so that each follows the producers of
    what it reads, its subgraphs' outer-scope reads included. onnxruntime's subgraph
    quantization appends the quantizer of an outer value after the If that reads it:
    onnxruntime re-sorts on load, onnx.checker and other runtimes refuse. Stable (ties keep
    their order, so a sorted graph is unchanged); returns whether anything moved."""
    import heapq

    moved = False
    for sub in (sub for n in graph.node for sub in subgraphs(n)):
        moved = sort_topologically(sub) or moved  # every subgraph, no short cut
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    reads = [{i for i in n.input if i} | {r for sub in subgraphs(n) for r in outer_reads(sub)} for n in nodes]
    waits = [{producer[r] for r in names if r in producer} - {i} for i, names in enumerate(reads)]
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(waits):
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i, deps in enumerate(waits) if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waits[u].discard(i)
            if not waits[u]:
                heapq.heappush(ready, u)
    if len(order) < len(nodes) or order == sorted(order):  # a cycle is left for the checker to name
        return moved
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)
    return True


def drop_value_info(graph: Any) -> int:
    """Clear ``graph``'s value_info and its subgraphs'; returns how many entries went."""
    dropped = len(graph.value_info)
    del graph.value_info[:]
    return dropped + sum(drop_value_info(sub) for node in graph.node for sub in subgraphs(node))


def rename_uses(graph: Any, old: str, new: str) -> None:
    """Every node input named ``old`` (also inside subgraphs) reads ``new`` instead."""
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for sub in subgraphs(node):
            rename_uses(sub, old, new)
