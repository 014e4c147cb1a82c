"""Sums computed as dot products along their reduction, one per lane of ``VectorPrinter``'s
vector: the score row of Q Kᵀ with the Transpose of K fused, whose keys (the lanes) are read
strided but contiguously along the depth (the reduction). A query's row and a key's row are
read as whole vectors along the depth, each lane's products summed in a vector of its own,
and a tree of pair sums folds those vectors into one lane each of the score vector
(``VectorSyntax.pair_sum``). Where a sum is no such dot product (``vector.dot_product_ok``),
the keys are read as tiles transposed in registers instead (``VectorPrinter._transposed_loop``),
which costs a lane move per multiply-add."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import sympy

from ...ir.expr import Expr, IndexCond, Load, Reduce, transform
from ..printer import Emitter, Scope
from .vector_syntax import VectorSyntax


class LanePrinter(Protocol):
    """What the dot products need of ``vector.VectorPrinter`` (which imports this module)."""

    em: Emitter
    v: VectorSyntax
    sym: sympy.Symbol
    base_expr: sympy.Expr
    scope: Scope

    def along(self, sym: sympy.Symbol, base: str, scope: Scope) -> LanePrinter: ...

    def accumulate(self, nodes: list[Reduce], accs: list[str]) -> None: ...


def at_lane(body: Expr, sym: sympy.Symbol, value: sympy.Expr) -> Expr:
    """``body`` with the index symbol ``sym`` replaced by ``value`` in its loads' offsets and
    its index conditions (unguarded loads, no gathered indices: ``vector.dot_product_ok``)."""
    def visit(node: Expr, recurse: Callable[[Expr], Expr]) -> Expr | None:
        if isinstance(node, Load):
            return Load(node.dtype, node.buffer, sympy.expand(node.offset.xreplace({sym: value})),
                        node.guard, node.data)
        if isinstance(node, IndexCond):
            return IndexCond(node.dtype, node.cond.xreplace({sym: value}), node.data)
        return None
    return transform(body, visit)


def dot_loop(printer: LanePrinter, nodes: list[Reduce], accs: list[str]) -> None:
    """The sums ``nodes`` (a score row's queries, each ``vector.dot_product_ok``) into the vectors
    ``accs`` (declared), each lane a dot product, printed by ``printer`` (its symbol the
    lanes). The queries go in pairs, each pair's lanes in two blocks of ``width / 2``, so a
    block keeps ``width`` vector sums (8 registers in ``float8``: a CPU with 16 keeps its
    loads beside them); an odd count of queries goes one by one over all the lanes. Against
    the transposed tiles, 1.09-1.13x on fused attention (PoCL, AVX2; docs/benchmarks.md,
    "Attention's scores as dot products")."""
    em, v, w = printer.em, printer.v, printer.v.width
    ((r, n),) = nodes[0].axes
    pair = 2 if len(nodes) % 2 == 0 else 1
    per = w // pair  # lanes a block covers
    zero = v.broadcast.format(em.reduce_init(nodes[0]))
    for first in range(0, len(nodes), pair):
        group = nodes[first:first + pair]
        halves: list[list[str]] = [[] for _ in group]
        for block in range(pair):
            lanes = range(block * per, (block + 1) * per)
            bodies = [replace(node, body=at_lane(node.body, printer.sym, printer.base_expr + c))
                      for node in group for c in lanes]
            sums = [em.fresh("vdot") for _ in bodies]
            for name in sums:
                printer.scope.add(f"{v.vtype} {name} = {zero};")
            chunk = em.fresh("rc")
            printer.scope.add(f"for ({em.index_t} {chunk} = 0; {chunk} < {n}; "
                              f"{chunk} += {w}) {{")
            printer.along(r, chunk, printer.scope.child()).accumulate(bodies, sums)
            printer.scope.add("}")
            for i, half in enumerate(halves):
                half.append(_lane_sums(printer, sums[i * per:(i + 1) * per], pair))
        for acc, half in zip(accs[first:first + pair], halves):
            printer.scope.add(f"{acc} = {v.join.format(*half) if pair == 2 else half[0]};")


def _lane_sums(printer: LanePrinter, sums: list[str], pair: int) -> str:
    """The lane sums of the vectors ``sums``, in order, by a tree of pair sums: a vector
    (``pair`` 1) or, where each vector is ``pair`` times as wide as their count, a half
    vector. Declares it and returns its name."""
    em, v, scope = printer.em, printer.v, printer.scope
    while len(sums) > 1:
        folded = []
        for a, b in zip(sums[0::2], sums[1::2]):
            folded.append(em.fresh("vpair"))
            scope.add(f"const {v.vtype} {folded[-1]} = {v.pair_sum.format(a, b)};")
        sums = folded
    if pair == 1:
        return sums[0]
    half = em.fresh("vhalf")
    scope.add(f"const {v.half_type} {half} = {v.half_sum.format(sums[0])};")
    return half
