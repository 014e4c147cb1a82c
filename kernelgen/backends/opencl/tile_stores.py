"""The 'tiled' schedule's stores (contraction_vec.cl.tmpl's and contraction_tile_pack.cl.tmpl's
``store`` hole): each row of a register tile through the epilogue into the outputs, in vectors
where the outputs are contiguous along the column run, the last column tile shifted back over
its neighbour storing only the lanes it owns."""
from __future__ import annotations

import sympy

from ...ir.expr import Axis, Expr
from ...ir.loop import Buffer
from ...shapes import prod
from ..c.emitter import CEmitter
from ..c.vector import VectorPrinter
from ..printer import Scope, interleave
from .columns import vector_epilogue
from .language import vector_syntax
from .schedule import TilePlan


def print_stores(em: CEmitter, tile: TilePlan, scope: Scope) -> None:
    """Row ``kg_i``'s epilogue and stores: vectors when every output is contiguous along
    the run and the epilogue has a vector form, else lane by lane from ``kg_own`` on. Only
    the last tile of a run that is no multiple of the tile shifts back; its epilogue is
    vectors too, and each vector stores the lanes from ``kg_own`` on
    (``_vector_stores``). With MobileNetV2's stem (3 channels, 27 reduction points, 56
    columns as a tile of 32 and one shifted 8 back) the shifted tiles' epilogue lane by
    lane, 15 operations and a ``rsqrt`` a lane, had cost more than their sums; in vectors
    whole models ran 1.05-1.11x faster (bench/results/shifted-tiles-2026-12-01.json)."""
    k, c, plan = em.kernel, tile.contraction, tile.columns
    assert plan is not None
    tn = plan.tile_n
    run = [k.domain[i] for i in plan.run]
    n_run = prod(n for _, n in run)
    # every vector starts at a multiple of the width unless the last tile shifts by less
    vectors = vector_epilogue(k, c, plan, aligned=n_run % plan.width == 0)
    if vectors is None:
        _lane_stores(em, tile, run, scope)
        return
    for (_, _, value), st in zip(vectors, k.stores):
        em.carry_origins(st.value, value)  # the math library's comments
    shift = -(-n_run // tn) * tn - n_run  # lanes the last tile shares with the one before
    if not shift:  # every tile is whole
        _vector_stores(em, tile, vectors, 0, n_run, scope)
        return
    scope.add("if (kg_c0 == kg_own) {  // a whole tile: one vector store a column block")
    _vector_stores(em, tile, vectors, 0, n_run, scope.child())
    scope.add(f"}} else {{  // the last tile, shifted {shift} back: its columns from "
              f"kg_own on")
    _vector_stores(em, tile, vectors, shift, n_run, scope.child())
    scope.add("}")


def _vector_stores(em: CEmitter, tile: TilePlan,
                   vectors: list[tuple[Buffer, sympy.Expr, Expr]], shift: int, n_run: int,
                   scope: Scope) -> None:
    """Each column vector's epilogue printed on its own, then listed statement by statement
    in turn (``interleave``): GELU after 128x256x1024, 4 x 24 tiles, 0.74 ms against
    0.83-0.93 with one vector's erf after the other's (ReLU: 0.60). The first ``shift``
    lanes of the tile are not stored (the tile before stores them)."""
    t, c, plan = em.index_t, tile.contraction, tile.columns
    assert plan is not None
    w, tn = plan.width, plan.tile_n
    syntax = vector_syntax(w)
    blocks = []
    for j in range(tn // w):
        first = max(shift - j * w, 0)  # the vector's first lane to store
        if first >= w:
            continue
        lane = Scope([], scope.depth, parent=scope)
        col = f"kg_col{j}"
        em.ranges[sympy.Symbol(col)] = n_run  # a split run's floors print as shifts
        lane.add(f"const {t} {col} = kg_c0{f' + {j * w}' if j else ''};")
        printer = VectorPrinter(em, plan.flat, col, lane, syntax,
                                 lanes={c.reduce: f"kg_acc[kg_i][{j}]"})
        for buf, offset, value in vectors:
            text = printer.expr(value)
            ptr = em.arg_names[buf.name]
            if not first:
                off = em.index(offset.xreplace({plan.flat: sympy.Symbol(col)}))
                lane.add(syntax.store.format(v=text, ptr=ptr, off=off))
                continue
            part = text
            if not text.isidentifier():
                part = em.fresh("kg_part")
                lane.add(f"const {syntax.vtype} {part} = {text};")
            for at, n in _lane_pieces(first, w):
                off = em.index(offset.xreplace({plan.flat: sympy.Symbol(col) + at}))
                lanes = part + ".s" + "".join(f"{i:x}" for i in range(at, at + n))
                lane.add(f"vstore{n}({lanes}, 0, {ptr} + {off});" if n > 1 else
                         f"{ptr}[{off}] = {lanes};")
        blocks.append(lane.lines)
    scope.lines.extend(interleave(blocks))


def _lane_stores(em: CEmitter, tile: TilePlan, run: list[Axis], scope: Scope) -> None:
    """The tile's sums stored lane by lane from ``kg_own`` on, the epilogue a lane at a
    time: for outputs not contiguous along the run or an epilogue with no vector form."""
    t, c, plan = em.index_t, tile.contraction, tile.columns
    assert plan is not None
    w, tn = plan.width, plan.tile_n
    scope.add(f"float kg_sums[{tn}];")
    scope.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
    scope.child().add(f"vstore{w}(kg_acc[kg_i][kg_v], kg_v, kg_sums);")
    scope.add(f"_Pragma(\"unroll\") for (int kg_j = 0; kg_j < {tn}; ++kg_j) {{")
    lane = scope.child()
    lane.add(f"const {t} kg_col = kg_c0 + kg_j;")
    lane.add("if (kg_col < kg_own) continue;")
    em.decompose("kg_col", run, lane)
    lane.names[c.reduce] = "kg_sums[kg_j]"
    em.stores(lane)
    scope.add("}")


def _lane_pieces(first: int, width: int) -> list[tuple[int, int]]:
    """Lanes ``first`` to ``width - 1`` of a vector as (first lane, lanes) pieces of 8, 4, 2 and
    1 lanes, widest first: the ``vstoreN`` calls that store them."""
    pieces, at = [], first
    for n in (8, 4, 2, 1):
        if width - at >= n:
            pieces.append((at, n))
            at += n
    return pieces
