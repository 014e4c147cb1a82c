"""Remapped reads: an elementwise kernel that reads an input through a Shuffle or Reorganize map
whose contiguous axis is not the output's. One work-item per point, neighbours along the
output's innermost axis, then reads that input with a stride of a whole row (a fused transpose
of 2048x2048 read ``x[2048 * o1 + o0]``: 13 ms against 0.9 for a copy on PoCL).

The decision is read from the composed index maps, not from operator names: a load whose flat
offset moves by a stride other than 0 or 1 along the innermost domain axis ``a`` and by exactly
1 along another domain axis ``b`` reads along ``b``. A schedule then covers a ``width x width``
tile of (a, b) per work-item: ``width`` vector loads along ``b``, one per position of ``a``, and
for each position of ``b`` the vector along ``a`` composed from one lane of each (a register
transpose), so both the reads and the writes are contiguous. Transposes, NCHW<->NHWC and
reshapes that merge or split axes around a transpose all compose to such maps.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir.expr import Load, walk
from ..ir.loop import LoopKernel


@dataclass(frozen=True)
class TransposedReads:
    """The axes of a register-transposed tile: ``lanes`` the domain position of the output's
    contiguous (innermost) axis, along which vectors are computed and stored; ``rows`` the
    domain position of the axis the remapped ``loads`` read contiguously."""

    lanes: int
    rows: int
    loads: tuple[Load, ...]


def stride(offset: sympy.Expr, sym: sympy.Symbol) -> int | None:
    """The constant stride of ``offset`` along ``sym``, or None when ``offset`` is not linear
    in it (a floor division of the axis, a gathered index)."""
    coeff = offset.coeff(sym)
    if not coeff.is_Integer or sym in sympy.expand(offset - coeff * sym).free_symbols:
        return None
    return int(coeff)


def transposed_reads(kernel: LoopKernel, min_extent: int) -> TransposedReads | None:
    """The remapped reads of an elementwise ``kernel`` and the axis they are contiguous along,
    when a register-transposed tile applies: every store is contiguous along the innermost
    domain axis, some unguarded load reads with a stride other than 0 or 1 along it and with
    stride 1 along one other domain axis (the same for every such load), and both axes span at
    least ``min_extent`` points. Else None. Whether the rest of the expression has a vector
    form is the backend's question."""
    if kernel.grouped or kernel.staged or len(kernel.domain) < 2:
        return None
    a, n_a = kernel.domain[-1]
    if n_a < min_extent or stride(sympy.expand(kernel.store_offset), a) != 1:
        return None
    loads = list(dict.fromkeys(n for root in kernel.roots() for n in walk(root)
                               if isinstance(n, Load)))
    remapped: list[Load] = []
    rows: int | None = None
    for load in loads:
        offset = sympy.expand(load.offset)
        along_lanes = stride(offset, a)
        if along_lanes in (0, 1):
            continue
        if along_lanes is None or load.guard is not sympy.true or load.data:
            return None
        along = [k for k, (s, _) in enumerate(kernel.domain[:-1]) if stride(offset, s) == 1]
        if len(along) != 1 or (rows is not None and along[0] != rows):
            return None
        rows = along[0]
        remapped.append(load)
    if rows is None or kernel.domain[rows][1] < min_extent:
        return None
    return TransposedReads(len(kernel.domain) - 1, rows, tuple(remapped))
