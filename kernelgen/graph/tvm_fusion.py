"""TVM's fixed-pattern fusion (Relay's ``FuseOps``) as a planner: ``plan_tvm(graph)``.

Each operator gets one of TVM's pattern kinds, read from its inputs' mapping types (TVM
registers them per op; kernelgen derives them from the index maps):

- ``ELEMWISE``: One-to-One;
- ``BROADCAST``: One-to-One and One-to-Many reads (a bias, BatchNormalization's parameters);
- ``INJECTIVE``: any Reorganize or Shuffle read (reshapes, transposes, slices), and Concat
  and Pad;
- ``COMM_REDUCE``: Many-to-Many operators that are not contractions (reductions, pools,
  Softmax, normalisations);
- ``OUT_EWISE_FUSABLE``: contractions (Conv, MatMul, Gemm), whose epilogue can be fused.

Walking the operators in order, a producer's group joins its consumer's when the producer's
value goes only there (TVM asks that the consumer post-dominate the producer; kernelgen's
approximation is the single-consumer chain, so diamonds are not fused) and the kinds allow it:
elementwise, broadcast and injective chains fuse with each other and into a reduction (its
prologue); a group anchored by a contraction or a reduction takes elementwise and broadcast
consumers only (its epilogue); a group never holds two anchors. Unlike DNNFusion, the
mapping-type table's colours play no part: TVM fuses by kind alone.
"""
from __future__ import annotations

import enum

from ..errors import FusionError
from ..ir.node import Op
from ..mapping_types import MappingType
from .blocks import CONTRACTIONS, IN_PLACE, Block, Stop, fusible, in_place_concats, order_blocks
from .model import Graph


class Pattern(enum.Enum):
    ELEMWISE = "elemwise"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    COMM_REDUCE = "comm_reduce"
    OUT_EWISE_FUSABLE = "out_elemwise_fusable"


_ANCHORS = (Pattern.COMM_REDUCE, Pattern.OUT_EWISE_FUSABLE)
# Read One-to-One, but their output is larger than an input, so TVM registers them injective:
# as a contraction's epilogue, the template would tile the larger output (guarded zeros)
_GROWING = frozenset({"Concat", "Pad"})


def pattern(op: Op) -> Pattern:
    """TVM's pattern kind of ``op``, from the least direct of its inputs' mapping types (a Conv
    whose bias is a broadcast still reduces over its data)."""
    types = set(op.input_mapping_types)
    if op.kind in _GROWING:
        return Pattern.INJECTIVE
    if MappingType.MANY_TO_MANY not in types:
        if types <= {MappingType.ONE_TO_ONE}:
            return Pattern.ELEMWISE
        if types <= {MappingType.ONE_TO_ONE, MappingType.ONE_TO_MANY}:
            return Pattern.BROADCAST
        return Pattern.INJECTIVE
    return Pattern.OUT_EWISE_FUSABLE if op.kind in CONTRACTIONS else Pattern.COMM_REDUCE


def plan_tvm(graph: Graph) -> list[Block]:
    """TVM-style blocks for ``graph``, in an executable order; each unfused edge is recorded
    (``Block.stops``) by the producer's block with the rule that refused it."""
    group: dict[int, list[Op]] = {id(op): [op] for op in graph.ops}
    refused: dict[tuple[int, int], str] = {}
    concats = in_place_concats(graph)
    in_place = {id(op) for op in concats}
    for op in graph.ops:
        consumers = graph.consumers(op)
        why = _single_consumer(graph, op, consumers)
        if why is None and (id(op) in in_place or id(consumers[0]) in in_place):
            concat = op if id(op) in in_place else consumers[0]
            why = f"Concat '{concat.name}' {IN_PLACE}"
        if why is not None:
            refused.update({(id(op), id(c)): why for c in consumers})
            continue
        mine, theirs = group[id(op)], group[id(consumers[0])]
        if mine is theirs:
            continue
        why = _refusal(graph, mine, consumers[0], theirs)
        if why is not None:
            refused[(id(op), id(consumers[0]))] = why
            continue
        merged = mine + [o for o in theirs if all(o is not m for m in mine)]
        for member in merged:
            group[id(member)] = merged
    order = graph.producer_index()
    seen: set[int] = set()
    blocks = []
    for op in graph.ops:
        members = group[id(op)]
        if id(members) in seen:
            continue
        seen.add(id(members))
        members = sorted(members, key=lambda o: order[id(o)])
        kinds = "+".join(f"{o.kind}:{pattern(o).value}" for o in members)
        inside = {id(o) for o in members}
        stops = tuple(Stop(o.name, c.name, refused[(id(o), id(c))]) for o in members
                      for c in graph.consumers(o)
                      if id(c) not in inside and (id(o), id(c)) in refused)
        view = any(id(o) in in_place for o in members)  # alone: every edge was refused
        blocks.append(Block(tuple(members), "tvm: Concat in place" if view else f"tvm: {kinds}",
                            stops, view=view))
    return order_blocks(graph, blocks)


def _single_consumer(graph: Graph, op: Op, consumers: tuple[Op, ...]) -> str | None:
    """Why ``op``'s group may not join a consumer's on TVM's post-dominator rule, or None."""
    if graph.is_output(op):
        return (f"'{op.name}' is a graph output, so it is written out whatever its consumers "
                "do (TVM fuses a producer into a consumer that post-dominates it)")
    if len(consumers) != 1:
        return (f"'{op.name}' feeds {len(consumers)} operators; TVM fuses a producer only into "
                "a consumer that post-dominates it (approximated here by a sole consumer)")
    return None


def _refusal(graph: Graph, producers: list[Op], consumer: Op, consumer_group: list[Op]
             ) -> str | None:
    """None when the producer's group may join the consumer's, else TVM's rule against it."""
    anchors = [o for o in (*producers, *consumer_group) if pattern(o) in _ANCHORS]
    if len(anchors) > 1:
        return ("the merged group would hold two anchors ("
                + ", ".join(f"'{o.name}' {pattern(o).value}" for o in anchors[:2])
                + "): TVM fuses at most one reduction or contraction per kernel")
    kind = pattern(consumer)
    anchor = next((o for o in producers if pattern(o) in _ANCHORS), None)
    if anchor is not None and kind not in (Pattern.ELEMWISE, Pattern.BROADCAST):
        return (f"'{anchor.name}' ({pattern(anchor).value}) takes an elementwise or "
                f"broadcast epilogue only, and '{consumer.name}' is {kind.value}")
    if kind is Pattern.OUT_EWISE_FUSABLE:
        return (f"'{consumer.name}' is a contraction ({kind.value}): TVM fuses nothing into "
                "a contraction's inputs")
    try:
        fusible(graph, [*producers, *consumer_group], force=True)
    except FusionError as exc:
        return f"the merged group cannot be one kernel: {exc}"
    return None
