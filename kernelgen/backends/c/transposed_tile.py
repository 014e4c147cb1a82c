"""The register-transposed tile of an elementwise kernel with remapped reads
(``lower/transpose.py``), shared by the C-like backends: a ``width x width`` square of the
output's contiguous axis (the lanes) and of the axis a remapped input is contiguous along (the
rows). Each remapped input is read as ``width`` vectors along the rows, one per lane, and
transposed in registers (``read_transposed``); per row, the stores are computed and written as
vectors along the lanes, so reads and writes are both whole vectors. A tile cut by the end of
either axis runs point by point. The backend binds the tile's corner (``kg_a0``, ``kg_b0``) and
the other axes and says how its tiles are laid out (OpenCL: a work-item each; NEON C: blocks of
them a loop iteration)."""
from __future__ import annotations

import sympy

from ...dtypes import DType
from ...ir.expr import Expr
from ...ir.loop import LoopKernel
from ...lower.transpose import TransposedReads, transposed_reads
from ..printer import Scope
from .emitter import CEmitter
from .vector import VectorPrinter, VectorSyntax, read_transposed
from .vectorizable import vectorizable


def vector_plan(loop: LoopKernel, syntax: VectorSyntax) -> TransposedReads | None:
    """The remapped reads of ``loop`` when it runs as transposed tiles of ``syntax``'s width:
    float32 outputs, both axes a vector long at least, and every store with a vector form
    along the output's contiguous axis once the remapped loads are vectors."""
    if not all(b.dtype is DType.float32 for b in loop.outputs):
        return None
    plan = transposed_reads(loop, syntax.width)
    if plan is None:
        return None
    sym, lanes = loop.domain[plan.lanes][0], frozenset(plan.loads)
    if all(vectorizable(st.value, sym, syntax, lanes=lanes) for st in loop.stores):
        return plan
    return None


def print_tile(em: CEmitter, plan: TransposedReads, syntax: VectorSyntax, body: Scope) -> None:
    """The tile at (``kg_a0``, ``kg_b0``), declared by the caller, printed into ``body``."""
    k, t, w = em.kernel, em.index_t, syntax.width
    (a, n_a), (b, n_b) = k.domain[plan.lanes], k.domain[plan.rows]
    a0, b0 = sympy.Symbol("kg_a0"), sympy.Symbol("kg_b0")
    whole = n_a % w == 0 and n_b % w == 0
    tile = body
    if not whole:
        body.add(f"if (kg_a0 + {w} <= {n_a} && kg_b0 + {w} <= {n_b}) {{")
        tile = body.child()
    # the remapped inputs: a vector along the rows per lane, transposed into the columns
    transposed = {load: read_transposed(em, syntax, tile, load, (a, a0), (b, b0))
                  for load in plan.loads}
    offset = em.index(k.store_offset.xreplace({a: a0}))
    for r in range(w):
        tile.add("{")
        block = tile.child()
        block.add(f"const {t} {em.symbol_names[b]} = kg_b0 + {r};")
        columns: dict[Expr, str] = {load: cols[r] for load, cols in transposed.items()}
        printer = VectorPrinter(em, a, "kg_a0", block, syntax, columns)
        for buf, st in zip(k.outputs, k.stores):
            block.add(syntax.store.format(v=printer.expr(st.value),
                                          ptr=em.arg_names[buf.name], off=offset))
        tile.add("}")
    if whole:
        return
    body.add("} else {  // a tile cut by the end of an axis: point by point")
    edge = body.child()
    outer = em.open_loop(edge, "kg_j", "0", str(w))
    inner = em.open_loop(outer, "kg_i", "0", str(w))
    inner.add(f"const {t} {em.symbol_names[a]} = kg_a0 + kg_i;")
    inner.add(f"const {t} {em.symbol_names[b]} = kg_b0 + kg_j;")
    inner.add(f"if ({em.symbol_names[a]} >= {n_a} || {em.symbol_names[b]} >= {n_b}) "
              f"continue;")
    em.stores(inner)
    em.close_loop(outer)
    em.close_loop(edge)
    body.add("}")
