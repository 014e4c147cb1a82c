"""Winograd F(2x2, 3x3) and F(4x4, 3x3) as four stages of graph surgery (Lavin & Gray):
the filter transform U = G g Gᵀ, the input transform V = Bᵀ d B per input tile (the block's
prologue fused in), side² batched GEMMs M = U V, and the output transform Y = Aᵀ M A with the
epilogue fused in. Bᵀ and Aᵀ of F(2x2) hold only 0 and ±1, so those transforms are signed sums
of taps picked by index arithmetic (four per V element, nine per output), with no coefficient
matrix; F(4x4)'s rows are constant-coefficient sums picked by a select on the row, which an
unrolled tile specialises away. Pure: the driver (``compile``) builds kernels of the stages."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import sympy

from ..dtypes import DType
from ..fusion import FusedBlock, fuse
from ..ir.expr import Expr, IndexCond, Read, call, const, reduce, select
from ..ir.node import Constant, Op, Value, constant, new_name
from ..mapping_types import FloorDiv, FloorMod, fresh_reduce_symbol, out_symbols
from ..ops.common import make_op
from .conv_algorithms import WINOGRAD_TILES, ConvBlock, spatial_reads, tail

# F(2x2, 3x3) transforms (Lavin & Gray): Y = A^T [(G g G^T) * (B^T d B)] A, with
# A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]. B^T and A^T are applied as signed index arithmetic
# (_bt_row, the output transform); B^T is kept as the table that arithmetic is checked against.
WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float32)
WINOGRAD_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float32)
# F(4x4, 3x3) at the points 0, 1, -1, 2, -2 (Lavin & Gray): 2.25 input values per output
# instead of 4, and 4x fewer multiplications than direct instead of 2.25x, for entries other
# than 0 and +-1 (applied as constant-coefficient sums, ``_matrix_row``)
WINOGRAD4_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float32)
WINOGRAD4_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
                        np.float32)
WINOGRAD4_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                         [0, 1, -1, 8, -8, 1]], np.float32)



Fold = Callable[[FusedBlock], np.ndarray]  # runs a stage whose inputs are all constants


def winograd_stages(block: ConvBlock, tile: int, fold: Fold) -> list[FusedBlock | Constant]:
    """The filter, input, batched-GEMM and output stages of F(tile x tile, 3x3). The filter
    transform of constant weights runs now (``fold``) and is a constant of the program."""
    u = _filter(block, tile)
    u_stage = fuse(u)
    filter_stage: FusedBlock | Constant = u_stage
    if isinstance(block.conv.inputs[1], Constant):
        filter_stage = constant(u.name, fold(u_stage))
    v = _input(block, tile)
    u_value: Value = filter_stage if isinstance(filter_stage, Constant) else u
    mm = _gemm(block, tile, u_value, v)
    return [filter_stage, fuse(*block.prologue, v, force=True), fuse(mm),
            tail(block, _output(block, tile, mm))]


def _filter(block: ConvBlock, tile: int) -> Op:
    """U[a, b, m, c] = sum_ij G[a, i] G[b, j] w[m, c, i, j]."""
    conv, f32 = block.conv, DType.float32
    w, m, c = conv.inputs[1], conv.shape[1], conv.inputs[0].shape[1]
    g = constant(new_name("winograd_g"), WINOGRAD_G if tile == 2 else WINOGRAD4_G)
    a_, b_, m_, c_ = out_symbols(4)
    i, j = fresh_reduce_symbol("i"), fresh_reduce_symbol("j")
    coef = call("mul", Read(f32, 0, (a_, i)), Read(f32, 0, (b_, j)))
    return make_op("WinogradFilter", [g, w], (tile + 2, tile + 2, m, c), f32,
                   reduce("sum", call("mul", coef, Read(f32, 1, (m_, c_, i, j))),
                          ((i, 3), (j, 3))), {"of": conv.name})


def _input(block: ConvBlock, tile: int) -> Op:
    """V[a, b, c, n, th, tw] = sum_ij BT[a, i] BT[b, j] x[n, c, tile th + i - p, tile tw + j - p].
    BT is folded into the expression: for F(2x2) each row holds two +-1 entries, so V is four
    signed taps picked by index arithmetic (no coefficient loads, no multiplications); for
    F(4x4) a row is a select over the six rows of constant-coefficient sums, which a tile
    unrolled per work-item specialises away. The inner sum over j is shared by every a."""
    conv, f32 = block.conv, DType.float32
    x = conv.inputs[0]
    n, c = x.shape[:2]
    th, tw = (-(-s // tile) for s in conv.shape[2:])
    a_, b_, c_, n_, t_h, t_w = out_symbols(6)

    def tap(i: sympy.Expr, j: sympy.Expr) -> Expr:
        idx, inside = spatial_reads(conv, [tile * t_h, tile * t_w], [i, j])
        return Read(f32, 0, (n_, c_, *idx), inside)

    def bt_row(a: sympy.Expr, term: Callable[[sympy.Expr], Expr]) -> Expr:
        if tile == 2:
            return _signed_sum([(term(col), neg) for col, neg in _bt_row(a)])
        return _matrix_row(a, WINOGRAD4_BT, term)

    return make_op("WinogradInput", [x], (tile + 2, tile + 2, c, n, th, tw), f32,
                   bt_row(a_, lambda i: bt_row(b_, lambda j: tap(i, j))), {"of": conv.name})


def _gemm(block: ConvBlock, tile: int, u: Value, v: Op) -> Op:
    """M[a, b, m, n, th, tw] = sum_c U[a, b, m, c] V[a, b, c, n, th, tw]: side² batched
    GEMMs."""
    conv, f32 = block.conv, DType.float32
    n, c = conv.inputs[0].shape[:2]
    m = conv.shape[1]
    th, tw = (-(-s // tile) for s in conv.shape[2:])
    a_, b_, m_, n_, t_h, t_w = out_symbols(6)
    rc = fresh_reduce_symbol("c")
    return make_op("WinogradGemm", [u, v], (tile + 2, tile + 2, m, n, th, tw), f32,
                   reduce("sum", call("mul", Read(f32, 0, (a_, b_, m_, rc)),
                                      Read(f32, 1, (a_, b_, rc, n_, t_h, t_w))), ((rc, c),)),
                   {"of": conv.name})


def _output(block: ConvBlock, tile: int, mm: Op) -> Op:
    """Y[n, m, y, x] = sum_ab AT[y % t, a] AT[x % t, b] M[a, b, m, n, y // t, x // t] (+ bias),
    standing in for the conv. F(2x2): row r of AT is +1 at a = r and (-1)^r at a = r + 1,
    r + 2: nine signed loads, AT folded. F(4x4): a select over AT's rows of
    constant-coefficient sums, as for BT."""
    conv, f32 = block.conv, DType.float32
    q = out_symbols(4)
    ry, rx = FloorMod(q[2], tile), FloorMod(q[3], tile)

    def m_at(a: sympy.Expr, b: sympy.Expr) -> Expr:
        return Read(f32, 0, (a, b, q[1], q[0], FloorDiv(q[2], tile), FloorDiv(q[3], tile)))

    def at_row(r: sympy.Expr, term: Callable[[sympy.Expr], Expr]) -> Expr:
        if tile == 2:
            odd = sympy.Eq(r, 1)
            return _signed_sum([(term(r), sympy.false), (term(r + 1), odd),
                                (term(r + 2), odd)])
        return _matrix_row(r, WINOGRAD4_AT, term)

    body: Expr = at_row(ry, lambda a: at_row(rx, lambda b: m_at(a, b)))
    inputs: list[Value] = [mm]
    if len(conv.inputs) > 2:
        body = call("add", body, Read(f32, 1, (q[1],)))
        inputs.append(conv.inputs[2])
    algorithm = next(name for name, t in WINOGRAD_TILES.items() if t == tile)
    return make_op("Conv", inputs, conv.shape, f32, body,
                   {**conv.attrs, "algorithm": algorithm}, name=conv.name)


def _matrix_row(index: sympy.Expr, matrix: np.ndarray,
                term: Callable[[sympy.Expr], Expr]) -> Expr:
    """Row ``index`` of a small constant ``matrix`` times the column vector ``term(0..k-1)``:
    a select over the rows, each row a sum of its nonzero entries' terms with the entries as
    constants (+-1 as an add or a subtraction). Once ``index`` is a constant (an unrolled
    copy), ``ir.substitute.specialise`` leaves only that row's sum."""
    out: Expr | None = None
    for r in reversed(range(matrix.shape[0])):
        row = _weighted_sum([(term(sympy.Integer(col)), float(v))
                             for col, v in enumerate(matrix[r]) if v])
        out = row if out is None else \
            select(IndexCond(DType.bool, sympy.Eq(index, r)), row, out)
    assert out is not None
    return out


def _weighted_sum(terms: list[tuple[Expr, float]]) -> Expr:
    """sum(weight * value) with weights +-1 as adds and subtractions, others as multiplies."""
    out: Expr | None = None
    for value, weight in terms:
        magnitude = value if abs(weight) == 1 else \
            call("mul", const(abs(weight), DType.float32), value)
        if out is None:
            out = magnitude if weight > 0 else call("neg", magnitude)
        else:
            out = call("add" if weight > 0 else "sub", out, magnitude)
    assert out is not None
    return out


def _bt_row(a: sympy.Expr) -> tuple[tuple[sympy.Expr, sympy.Basic], ...]:
    """Row ``a`` of Bᵀ (F(2x2,3x3)) as its two nonzero columns, each with the condition under
    which its entry is -1: rows [1 0 -1 0], [0 1 1 0], [0 -1 1 0], [0 1 0 -1]."""
    return ((FloorDiv(a + 2, 3), sympy.Eq(a, 2)),
            (2 + FloorDiv(a, 3), sympy.Eq(FloorMod(a, 3), 0)))


def _signed_sum(terms: list[tuple[Expr, sympy.Basic]]) -> Expr:
    """The sum of ``terms``, each negated where its index condition holds (a select on an index
    condition, uniform across a tile's lanes, instead of a multiplication by +-1)."""
    out: Expr | None = None
    for value, negative in terms:
        if out is None:
            out = value if negative is sympy.false else \
                select(IndexCond(DType.bool, negative), call("neg", value), value)
        elif negative is sympy.false:
            out = call("add", out, value)
        else:
            out = select(IndexCond(DType.bool, negative), call("sub", out, value),
                         call("add", out, value))
    assert out is not None
    return out
