"""The split alternative of a block that holds yellow (or forced red) edges: the same operators
cut at every edge whose table cell is not green, each remaining piece fused on its own. A yellow
cell (DNNFusion Table 3) says fusion pays only where it is measured; this is what it is measured
against (``kernelgen.measure_fusion``), and what runs when the split wins.

Pieces are the connected parts over green edges. A part that ``fuse`` refuses on its own (it
would not be convex without the operators cut away, or its outputs, now including values other
parts read, differ in shape) runs one kernel per operator instead.
"""
from __future__ import annotations

from ..errors import FusionError
from ..ir.node import Op
from ..mapping_types import Colour
from .fuse import FusedBlock, fuse


def split_parts(block: FusedBlock) -> list[FusedBlock]:
    """``block`` cut at its non-green edges, as fused pieces in an order that runs (each piece
    after those it reads). Every operator is in one piece; each piece's outputs are the values
    the block outputs or another piece reads."""
    ops = list(block.ops)  # topological (``fuse`` ordered them)
    index = {op.name: k for k, op in enumerate(ops)}
    parent = list(range(len(ops)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for edge in block.edges:
        if edge.rule.colour is Colour.GREEN:
            parent[root(index[edge.producer])] = root(index[edge.consumer])
    groups: dict[int, list[Op]] = {}
    for k, op in enumerate(ops):
        groups.setdefault(root(k), []).append(op)
    outputs = {o.name for o in block.outputs}
    parts: list[FusedBlock] = []
    for members in groups.values():
        parts += _fused(members, ops, outputs)
    return _in_running_order(parts)


def _in_running_order(parts: list[FusedBlock]) -> list[FusedBlock]:
    """Each piece after the pieces it reads (pieces are convex, so their graph has no cycle),
    otherwise in the order of their first operators."""
    producer = {id(op): k for k, part in enumerate(parts) for op in part.ops}
    needs = [{producer[id(v)] for v in part.inputs if id(v) in producer} for part in parts]
    done: list[int] = []
    while len(done) < len(parts):
        ready = next(k for k in range(len(parts)) if k not in done and needs[k] <= set(done))
        done.append(ready)
    return [parts[k] for k in done]


def _fused(members: list[Op], ops: list[Op], outputs: set[str]) -> list[FusedBlock]:
    """``members`` as one piece, else one piece per operator."""
    inside = {id(op) for op in members}
    read_elsewhere = {id(v) for op in ops if id(op) not in inside for v in op.inputs}
    wanted = [op for op in members if op.name in outputs or id(op) in read_elsewhere]
    try:
        return [fuse(*members, outputs=wanted)]
    except FusionError:
        return [fuse(op) for op in members]


__all__ = ["split_parts"]
