"""Sibling projections merged into one contraction (IOS's merge, "kernel enlarging", for
MatMuls; onnxruntime's attention fusion packs Q, K and V the same way):

    graph, applied = merge_projections(graph)

A projection is ``transpose(reshape(x @ W + b, (..., s, h, d)), perm)``: a MatMul (or a
plain Gemm) of a tensor by constant weights, an optional constant bias along the last axis,
the last axis split into ``h`` heads of ``d``, and a Transpose (attention's head split; the
perm may be any). Projections of one ``x`` with one ``d`` become a single MatMul by their
weights side by side, split into all their heads at once and transposed to ``(..., H, s,
d)``: the DNNFusion planner fuses that head split into the contraction's stores
(``run_rule``). Each projection is then a Slice of its heads (a contiguous range at batch 1)
and what is left of its Transpose, which the contraction reading it takes as an operand. One
kernel reads ``x`` once instead of one kernel per projection; the FLOPs and every output
element's arithmetic are unchanged, so NaN and Inf come out as before.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..ir.node import Constant, Op, Value, constant
from ..ops.elementwise import binary
from ..ops.nn import matmul
from ..ops.shape import reshape, slice_op, transpose
from .model import Graph, fresh_name


@dataclass(frozen=True)
class Projection:
    """One projection's operators and constants, as ``projection`` matched them."""

    x: Value
    matmul: Op
    weights: np.ndarray
    bias: np.ndarray | None  # along the last axis, or None: no Add
    split: Op  # the Reshape into (..., s, heads, depth)
    heads_t: Op  # the Transpose after it, whose value the merge replaces
    heads: int
    depth: int

    def key(self) -> tuple[int, int, str]:
        """What projections merged into one must share."""
        return (id(self.x), self.depth, str(self.matmul.dtype))


def _sole_reader(graph: Graph, v: Value, reader: Op) -> bool:
    return isinstance(v, Op) and not graph.is_output(v) and graph.consumers(v) == (reader,)


def _vector(v: Value, n: int) -> np.ndarray | None:
    """``v`` as a constant vector of ``n`` along the last axis (leading axes of 1), or None."""
    if not isinstance(v, Constant):
        return None
    value = np.asarray(v.value)
    if value.ndim == 0 or any(d != 1 for d in value.shape[:-1]) or value.shape[-1] != n:
        return None
    return value.reshape(-1)


def _weights(mm: Op) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The constant weights (reduction x columns) of a MatMul or a plain Gemm (no transA,
    alpha 1, beta 1), with the Gemm's bias C when it has one; None otherwise."""
    w = mm.inputs[1]
    if not isinstance(w, Constant) or w.rank != 2:
        return None
    weights = np.asarray(w.value)
    if mm.kind == "MatMul":
        return weights, None
    a = mm.attrs
    if a["transA"] or a["alpha"] != 1 or a["beta"] != 1:
        return None
    weights = weights.T if a["transB"] else weights
    if len(mm.inputs) < 3:
        return weights, None
    bias = _vector(mm.inputs[2], mm.shape[-1])
    return None if bias is None else (weights, bias)


def projection(graph: Graph, op: Op) -> Projection | None:
    """``op`` (a Transpose) as the end of a projection of ``graph``, or None. Every operator
    before it must be read by the next one only, so the merge leaves nothing behind. The
    product is a MatMul or a Gemm (``_weights``)."""
    if op.kind != "Transpose" or not isinstance(split := op.inputs[0], Op) or \
            split.kind != "Reshape" or not _sole_reader(graph, split, op):
        return None
    proj, added = split.inputs[0], None
    if isinstance(proj, Op) and proj.kind == "Add" and _sole_reader(graph, proj, split):
        mm = next((v for v in proj.inputs if isinstance(v, Op) and v.kind in _PRODUCTS), None)
        other = proj.inputs[1] if proj.inputs[0] is mm else proj.inputs[0]
        if mm is None or proj.shape != mm.shape or not _sole_reader(graph, mm, proj) or \
                (added := _vector(other, mm.shape[-1])) is None:
            return None
    elif isinstance(proj, Op) and proj.kind in _PRODUCTS and _sole_reader(graph, proj, split):
        mm = proj
    else:
        return None
    x = mm.inputs[0]
    found = _weights(mm)
    if found is None or isinstance(x, Constant) or x.rank < 2 or not mm.dtype.is_float:
        return None
    weights, bias = found
    if added is not None and bias is not None:
        return None  # adding the two biases first could round (or overflow) differently
    bias = added if bias is None else bias
    lead, n = mm.shape[:-1], mm.shape[-1]
    if split.rank != mm.rank + 1 or split.shape[:-2] != lead or \
            split.shape[-2] * split.shape[-1] != n:
        return None
    return Projection(x, mm, weights, bias, split, op, split.shape[-2], split.shape[-1])


_PRODUCTS = ("MatMul", "Gemm")


def merged_heads(projections: Sequence[Projection], x: Value, names: set[str]
                 ) -> list[Value]:
    """The merged projection of ``x`` and, per projection, the value equal to its Transpose:
    a Slice of the merged heads, then the rest of its permutation (if not the identity)."""
    first = projections[0]
    dtype = first.matmul.dtype.numpy
    label = "+".join(p.matmul.name for p in projections)
    w = constant(fresh_name(f"{label}/weights", names),
                 np.concatenate([p.weights for p in projections], axis=1).astype(dtype))
    mm = matmul(x, w)
    new: list[Op] = [mm]
    y = mm
    if any(p.bias is not None for p in projections):
        b = np.concatenate([p.bias if p.bias is not None else np.zeros(p.heads * p.depth)
                            for p in projections]).astype(dtype)
        y = binary("Add", mm, constant(fresh_name(f"{label}/bias", names), b))
        new.append(y)
    rank = first.split.rank  # (..., s, heads, depth): s at rank - 3
    s_axis, h_axis = rank - 3, rank - 2
    total = sum(p.heads for p in projections)
    split = reshape(y, [*first.split.shape[:-2], total, first.depth])
    order = [*range(s_axis), h_axis, s_axis, rank - 1]
    heads = transpose(split, order)
    new += [split, heads]
    where = order.index  # a split axis -> its axis in ``heads``
    out: list[Value] = []
    at = 0
    for p in projections:
        value: Op = slice_op(heads, [at], [at + p.heads], [s_axis])
        new.append(value)
        rest = [where(a) for a in p.heads_t.attrs["perm"]]
        if rest != list(range(rank)):
            value = transpose(value, rest)
            new.append(value)
        out.append(value)
        at += p.heads
    for op in new:
        op.name = fresh_name(f"{label}/{op.kind.lower()}", names)
    return out


def merge_projections(graph: Graph) -> tuple[Graph, list[tuple[str, int]]]:
    """``graph`` with its sibling projections merged (module docstring), and per merge the
    names of the MatMuls it joined and the FLOPs they cost (the merged one costs the same)."""
    groups: dict[tuple[int, int, str], list[Projection]] = {}
    for op in graph.ops:
        p = projection(graph, op)
        if p is not None:
            groups.setdefault(p.key(), []).append(p)
    merges = [g for g in groups.values() if len(g) > 1]
    if not merges:
        return graph, []
    first = {id(g[0].heads_t): g for g in merges}
    names = {v.name for v in (*graph.ops, *graph.inputs, *graph.constants)}
    swap: dict[int, Value] = {}
    for op in graph.ops:
        if id(op) in swap:  # a later projection of a merge done already
            continue
        inputs = tuple(swap.get(id(v), v) for v in op.inputs)
        swap[id(op)] = op if inputs == op.inputs else replace(op, inputs=inputs)
        if id(op) in first:
            group = first[id(op)]
            for p, value in zip(group, merged_heads(group, swap.get(id(group[0].x),
                                                                      group[0].x), names)):
                swap[id(p.heads_t)] = value
    outputs = {key: swap.get(id(v), v) for key, v in graph.outputs.items()}
    done = [("+".join(p.matmul.name for p in g),
             sum(2 * p.matmul.numel * p.weights.shape[0] for p in g)) for g in merges]
    return Graph.build(graph.inputs, outputs, graph.name), done
