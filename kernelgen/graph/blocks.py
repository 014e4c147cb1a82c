"""Fusion blocks and the planner contract, one signature for every planner:

    blocks = plan(graph)                 # Planner = Callable[[Graph], list[Block]]

A ``Block`` is the operators one kernel computes, in topological order, a note saying why
the planner grouped them, and the edges into or out of it that the planner refused to fuse,
each with the rule that stopped it (``Stop``; the fusion report prints them). The executor
needs only that every operator is in exactly one block and that blocks come in an order where
each reads what earlier blocks (or the graph's inputs and constants) produce; ``check_plan``
says so or names the fault. ``plan_none`` (one block per operator) is the unfused baseline.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import FusionError
from ..fusion import FusedBlock, fuse
from ..ir.node import Op
from .ios import BlockGraph
from .model import Graph


# The operators that lower to a contraction template (a tiled GEMM over their own output).
CONTRACTIONS = frozenset({"Conv", "MatMul", "Gemm"})


@dataclass(frozen=True)
class Stop:
    """An edge a planner left unfused: the producer and consumer operators' names and the rule
    that stopped it, in words."""

    producer: str
    consumer: str
    rule: str


@dataclass(frozen=True, eq=False)
class Block:
    """Operators fused into one kernel (topological order), why they were grouped, and the
    edges touching the block that the planner refused (each unfused edge is recorded by one of
    its two blocks)."""

    ops: tuple[Op, ...]
    note: str = ""
    stops: tuple[Stop, ...] = ()
    # a lone Slice whose output may share its input's memory (the executor makes it a view and
    # compiles nothing where the slice is one contiguous range; IOS's merged convolutions), or
    # a lone Concat assembled in place (``in_place_concats``: each input written into its part)
    view: bool = False

    def __post_init__(self) -> None:
        if not self.ops:
            raise FusionError("a block holds at least one operator")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)


Planner = Callable[[Graph], list[Block]]


_NONE_RULE = "the 'none' planner runs every operator as a kernel of its own"


def plan_none(graph: Graph) -> list[Block]:
    """One block per operator, in the graph's order: every intermediate is materialised."""
    return [Block((op,), "unfused", tuple(Stop(op.name, c.name, _NONE_RULE)
                                          for c in graph.consumers(op)))
            for op in graph.ops]


IN_PLACE = ("is assembled in place: each input's kernel writes its part of the output, so "
            "the Concat copies nothing and launches nothing")


def concat_in_place_shape(graph: Graph, op: Op) -> bool:
    """Whether a Concat's inputs can be parts of its output: the output is an intermediate,
    every axis before the concatenated one has extent 1 (so each part is one contiguous range:
    channels at batch 1), and each input is an operator's output, not a graph output, that
    appears once. The planners ask it to make the Concat a view block, the executor again for
    any view block it is handed."""
    ids = [id(v) for v in op.inputs]
    return (op.kind == "Concat" and not graph.is_output(op)
            and all(op.shape[a] == 1 for a in range(op.attrs["axis"]))
            and len(set(ids)) == len(ids)
            and all(isinstance(v, Op) and not graph.is_output(v) for v in op.inputs))


def in_place_concats(graph: Graph) -> list[Op]:
    """The Concats whose inputs can be written straight into their parts of the output (a
    planner gives each a view block of its own; the executor then makes every input a view of
    the output where the device can address its offset, else it copies): those of
    ``concat_in_place_shape`` none of whose inputs an earlier one took. Inception's modules
    end in such Concats; fused into one kernel with the branches' last operators, they cost
    19 % of Inception v1 on OpenCL."""
    taken: set[int] = set()
    found = []
    for op in graph.ops:
        ids = {id(v) for v in op.inputs}
        if concat_in_place_shape(graph, op) and not taken & ids:
            taken |= ids
            found.append(op)
    return found


def check_plan(graph: Graph, blocks: Sequence[Block]) -> None:
    """Every operator of ``graph`` in exactly one block, none from elsewhere, and each block
    after the blocks it reads from; ``FusionError`` names the operator at fault."""
    index = graph.producer_index()
    owner: dict[int, int] = {}
    for b, block in enumerate(blocks):
        for op in block.ops:
            if id(op) not in index:
                raise FusionError(f"block {b} holds '{op.name}' ({op.kind}), which is not an "
                                  "operator of the graph")
            if id(op) in owner:
                raise FusionError(f"'{op.name}' ({op.kind}) is in blocks {owner[id(op)]} and "
                                  f"{b}")
            owner[id(op)] = b
    missing = [op.name for op in graph.ops if id(op) not in owner]
    if missing:
        raise FusionError(f"the plan leaves out {len(missing)} operator(s): {missing[:5]}")
    for b, block in enumerate(blocks):
        for op in block.ops:
            for v in op.inputs:
                source = owner.get(id(v))
                if source is not None and source > b:
                    raise FusionError(f"block {b} reads '{v.name}', which block {source} "
                                      "computes later")


def block_graph(graph: Graph, blocks: Sequence[Block]) -> BlockGraph:
    """Which block reads which (the scheduler's graph); ``blocks`` as ``check_plan`` wants."""
    owner = {id(op): b for b, block in enumerate(blocks) for op in block.ops}
    preds = []
    for b, block in enumerate(blocks):
        mask = 0
        for op in block.ops:
            for v in op.inputs:
                source = owner.get(id(v))
                if source is not None and source != b:
                    mask |= 1 << source
        preds.append(mask)
    return BlockGraph(len(blocks), tuple(preds))


def order_blocks(graph: Graph, blocks: list[Block]) -> list[Block]:
    """The blocks ordered so that each comes after the blocks it reads (the blocks are convex,
    so the block graph has no cycle)."""
    owner = {id(op): b for b, block in enumerate(blocks) for op in block.ops}
    needs = [{owner[id(v)] for op in block.ops for v in op.inputs
              if id(v) in owner and owner[id(v)] != b} for b, block in enumerate(blocks)]
    done: list[int] = []
    placed: set[int] = set()
    first = [min(graph.producer_index()[id(op)] for op in block.ops) for block in blocks]
    while len(done) < len(blocks):
        ready = [b for b in range(len(blocks)) if b not in placed and needs[b] <= placed]
        if not ready:
            raise FusionError("the fusion blocks depend on each other in a cycle")
        b = min(ready, key=first.__getitem__)
        done.append(b)
        placed.add(b)
    return [blocks[b] for b in done]


def block_outputs(graph: Graph, ops: Sequence[Op]) -> list[Op]:
    """The operators of a block that its kernel must write: graph outputs and values read by
    operators outside the block (what the executor stores)."""
    inside = {id(op) for op in ops}
    return [op for op in ops if graph.is_output(op)
            or any(id(c) not in inside for c in graph.consumers(op))]


def fusible(graph: Graph, ops: Sequence[Op], force: bool = False) -> FusedBlock:
    """``ops`` fused as the executor will fuse them (writing ``block_outputs``); raises
    ``FusionError`` when they cannot form one kernel."""
    return fuse(*ops, outputs=block_outputs(graph, ops), force=force)
