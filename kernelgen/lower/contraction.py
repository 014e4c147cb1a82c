"""Recognising a contraction in a loop kernel: one hoisted ``sum(P * Q)`` whose operands depend
on disjoint output axes (MatMul, Gemm, a group-1 conv as an implicit GEMM, AGO's fused pairs),
which every backend runs from its tiled contraction template."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..ir.expr import Call, Expr, Load, Reduce, free_index_symbols, walk
from ..ir.loop import LoopKernel
from ..shapes import prod


@dataclass(frozen=True)
class Contraction:
    """A kernel whose only hoisted reduction is ``sum(P * Q)`` with P and Q depending on disjoint
    domain axes (rows and columns): MatMul, Gemm, group-1 convolution as an implicit GEMM, with
    any elementwise prologue inside P/Q and any epilogue around the sum. Axes both operands
    depend on are batch axes (batched MatMul, Winograd's 16 transform positions): each batch
    point is an independent contraction. An operand may itself be a reduction (AGO's intensive
    fusion: Conv -> 1x1 Conv, MatMul -> MatMul): each tile then computes the producer values it
    needs, once per column tile."""

    reduce: Reduce
    left: Expr
    right: Expr
    rows: tuple[int, ...]  # domain positions only the left operand depends on (and unused ones)
    cols: tuple[int, ...]  # positions only the right operand depends on
    batch: tuple[int, ...] = ()  # positions both depend on

    def swapped(self) -> Contraction:
        """The same sum with the operands exchanged (rows become columns): the sum of
        products is symmetric, so a template may vectorise whichever operand reads a run."""
        return Contraction(self.reduce, self.right, self.left, self.cols, self.rows, self.batch)


def contraction(kernel: LoopKernel, rowless: bool = False) -> Contraction | None:
    """Recognise the contraction pattern, or None. With ``rowless``, also a sum whose one
    operand depends only on axes the other depends on too (a depthwise conv: ``w[c, k]`` times
    ``x[c, pixel + k]``), as a contraction with no rows: every output axis is a batch or column
    axis. Only a backend that vectorises the columns gains from that form."""
    if len(kernel.hoisted) != 1 or len(kernel.group) != len(kernel.domain):
        return None
    r = kernel.hoisted[0]
    if r.kind != "sum" or r.dtype is not DType.float32 or not isinstance(r.body, Call) \
            or r.body.fn != "mul":
        return None
    left, right = r.body.args
    own = {s for s, _ in r.axes}
    fl, fr = free_index_symbols(left) - own, free_index_symbols(right) - own
    if rowless and fr and fr < fl:  # the right operand has no columns of its own: swap
        left, right, fl, fr = right, left, fr, fl
    syms = [s for s, _ in kernel.domain]
    if not fr - fl or (fl & fr) - set(syms):
        return None
    batch = tuple(k for k, s in enumerate(syms) if s in fl & fr)
    cols = tuple(k for k, s in enumerate(syms) if s in fr - fl)
    rows = tuple(k for k in range(len(syms)) if k not in cols and k not in batch)
    return Contraction(r, left, right, rows, cols, batch)


def operand_has_reduction(side: Expr) -> bool:
    """True when a contraction operand is itself a reduction (a fused producer)."""
    return any(isinstance(n, Reduce) for n in walk(side))


def operand_buffers(*sides: Expr) -> list[str]:
    """The buffers the contraction operands ``sides`` load, sorted."""
    return sorted({n.buffer for side in sides for n in walk(side) if isinstance(n, Load)})


def producer_redundancy(kernel: LoopKernel, tile_n: int) -> float:
    """How often each element of a producer fused into a contraction's left operand is computed
    with column tiles of ``tile_n``: once per column tile (AGO's redundancy; 1.0 when one tile
    spans every column, or when the operand holds no producer reduction)."""
    c = contraction(kernel)
    if c is None or not operand_has_reduction(c.left):
        return 1.0
    n_cols = prod(kernel.domain[i][1] for i in c.cols)
    return float(-(-n_cols // tile_n))
