"""Splitting an operator chain into fusion blocks by the colour of its edges.

The graph-level planner (DNNFusion's seed-and-grow, TVM's dominator rules) comes with the ONNX
compiler; this is the piece the CLI and benchmarks need now: cut a topologically ordered chain
at every edge whose colour is not allowed, so yellow edges can be measured both ways.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..fusion import fuse
from ..ir.node import Op
from ..mapping_types import Colour


def split_blocks(ops: Sequence[Op], allow: Sequence[Colour] = (Colour.GREEN,)) -> list[list[Op]]:
    """Maximal runs of ``ops`` (in order) whose internal edges all have an allowed colour."""
    blocks: list[list[Op]] = []
    for op in ops:
        if blocks and _joins(blocks[-1], op, allow):
            blocks[-1].append(op)
        else:
            blocks.append([op])
    return blocks


def _joins(block: list[Op], op: Op, allow: Sequence[Colour]) -> bool:
    if not any(any(v is member for member in block) for v in op.inputs):
        return False
    try:
        fused = fuse(*block, op, force=True)
    except Exception:  # noqa: BLE001 - a block that cannot form one kernel simply is not joined
        return False
    return all(e.rule.colour in allow for e in fused.edges)
