"""Convolution algorithms (MegEngine's CPU inference, seed 004): one fused Conv block, five ways
to run it. Every way keeps the block's prologue (elementwise ops on the input) and epilogue
(bias, BN, activation, residual...) fused.

- ``direct``: one kernel, a sliding window per output element (the generic schedules).
- ``implicit_gemm``: one kernel, the contraction template reading patches through the conv's
  index map in place, with no patch buffer (the default single-kernel form; needs
  ``group == 1``).
- ``im2col``: the patches are gathered, prologue applied, into the GEMM's operand layout,
  then multiplied with the epilogue fused into the store. On every backend this is one
  kernel, as in MegEngine: the contraction packs its patch operand (``PACKING``) a
  cache-sized block at a time, and the tiles consume each block while it is in cache (the
  pack is the im2col). NEON packs a block of ``tn``-wide panels (``PACK_BLOCK_BYTES``) by
  vectors along an output row; OpenCL packs one column tile's panel per work-item, which
  then runs every row tile on it (``pack_in_tile``; with few column tiles a first launch
  packs them all); Triton packs each program's block of output pixels (``pack_rows``), then
  sweeps every block of output channels. Where the patches cannot be the packed operand (a
  stride along the row) it is two kernels: a (C·KH·KW) × (OH·OW) patch matrix per image,
  contiguous along output pixels, then a plain GEMM. (An OpenCL work-group packing its panel
  into local memory, then running the tiles from it, measured 1.7× slower on PoCL than the
  implicit GEMM it was made from: 3.2 against 1.8 ms, 3×3 64→64 at 56×56.)
- ``winograd``: F(2×2, 3×3) for 3×3, stride 1, dilation 1, 2-D. The filter transform
  U = G·g·Gᵀ runs once when the weights are constant; the input transform V = Bᵀ·d·B per
  4×4 tile (prologue fused); 16 independent GEMMs U·V (one batched contraction, 2.25× fewer
  multiplications than direct); the output transform Y = Aᵀ·M·A with the epilogue fused.
  Bᵀ and Aᵀ hold only 0 and ±1, so both transforms are signed sums of taps chosen by index
  arithmetic (four per V element, nine per output), not contractions with a coefficient
  matrix.
- ``winograd_4x4``: F(4×4, 3×3), the same four stages on 6×6 input tiles: 36 GEMMs over
  2.25 input values per output instead of 4 (4× fewer multiplications than direct). Its
  transform entries include 2, 4, 5 and 8, so each row of Bᵀ and Aᵀ is a sum with constant
  coefficients, picked by a select on the row that an unrolled tile specialises away.

Which one runs is measured (``autotune.tune_algorithm``, stored in the Fast-Run database) or,
when nothing was measured for this shape and device, chosen by ``heuristic``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from mapping_types import FloorDiv, FloorMod, fresh_reduce_symbol, out_symbols

from .dtypes import DType
from .errors import UnsupportedError
from .expr import Expr, IndexCond, Read, call, const, reduce, select
from .fuse import FusedOp, fuse
from .graph import Constant, Op, Value, constant, new_name, rewire
from .ops.common import make_op
from .ops.nn import window_index
from .shapes import prod

ALGORITHMS = ("direct", "implicit_gemm", "im2col", "winograd", "winograd_4x4")
# the option with which each backend's contraction packs one operand into panels
PACKING = {"neon": "pack_b", "opencl": "pack_b", "triton": "pack_rows"}
WINOGRAD_TILES = {"winograd": 2, "winograd_4x4": 4}  # output tile side of F(m x m, 3x3)

# Options that keep each backend off the contraction template (a sliding window per output).
DIRECT_OPTIONS: dict[str, dict[str, Any]] = {
    "opencl": {"reduce_strategy": "item"}, "neon": {"schedule": "row"},
    "triton": {"schedule": "row"}}

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


@dataclass(frozen=True)
class ConvBlock:
    """A fused block around exactly one Conv: the ops its input goes through first (prologue)
    and the ops applied to its output (epilogue), each in block order."""

    fused: FusedOp
    conv: Op
    prologue: tuple[Op, ...]
    epilogue: tuple[Op, ...]


def conv_block(fused: FusedOp) -> ConvBlock | None:
    """The block's single Conv with its prologue and epilogue, or None when the block is not
    one convolution with fusable neighbours (two convs, in-block weights, several outputs)."""
    convs = [op for op in fused.ops if op.kind == "Conv"]
    if len(convs) != 1 or len(fused.outputs) != 1:
        return None
    conv = convs[0]
    members = {id(op) for op in fused.ops}
    if any(id(v) in members for v in conv.inputs[1:]):
        return None  # weights or bias computed inside the block
    before = _ancestors(conv.inputs[0], members)
    prologue = tuple(op for op in fused.ops if id(op) in before)
    epilogue = tuple(op for op in fused.ops if op is not conv and id(op) not in before)
    if any(id(conv) in _ancestors(op, members) for op in prologue):
        return None
    return ConvBlock(fused, conv, prologue, epilogue)


def _ancestors(value: Value, members: set[int]) -> set[int]:
    """ids of the block members ``value`` depends on, itself included."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) in members and id(v) not in seen and isinstance(v, Op):
            seen.add(id(v))
            stack.extend(v.inputs)
    return seen


def applicable(fused: FusedOp) -> dict[str, str | None]:
    """Each algorithm with None when it can run this block, else the reason it cannot."""
    from .loop_ir import contraction

    block = conv_block(fused)
    out: dict[str, str | None] = {"direct": None}
    out["implicit_gemm"] = None if contraction(fused.lower()) is not None else \
        "the block is not one sum of products on disjoint axes (grouped or depthwise conv?)"
    if block is None:
        why = "the block is not exactly one Conv with elementwise neighbours and one output"
        out.update(im2col=why, winograd=why)
        return out
    a = block.conv.attrs
    float32 = block.conv.dtype is DType.float32
    out["im2col"] = None if a["group"] == 1 and float32 else "needs group == 1 and float32"
    square = block.conv.rank == 4 and list(a["kernel_shape"]) == [3, 3]
    unit = list(a["strides"]) == [1, 1] and list(a["dilations"]) == [1, 1]
    for name, m in WINOGRAD_TILES.items():
        out[name] = None if square and unit and a["group"] == 1 and float32 else \
            f"F({m}x{m},3x3) needs a 2-D 3x3 kernel, stride 1, dilation 1, group 1 and float32"
    return out


def heuristic(fused: FusedOp, backend: str) -> str:
    """The algorithm to use when nothing was measured for this block on this device, from
    ``bench/conv.py`` runs (ResNet 3x3 and 1x1 at 56x56). Winograd is the fastest 3x3 on both
    backends: on OpenCL 1.35 ms against im2col's 1.91 once its transforms unroll a tile per
    work-item (before, at 2.5-3.0 ms, it lost to im2col). F(4x4) beat or tied F(2x2) where 4 divides
    the output (3x3: 1.17 against 1.30 ms and 0.88 against 0.86 in two runs; with BN and ReLU 0.97
    against 1.09 and 0.98 against 1.17). On NEON, im2col in cache-sized blocks (one kernel) beat
    F(2x2) where few channels cover a large map (32 and 64 channels at 56x56: 1.17 against 2.22 ms
    and 3.70 against 4.98) and lost from 128 channels (128 at 28x28: 5.49 against 2.37; 512 at
    7x7: 7.14 against 2.87; F(4x4), whose stages do not unroll on NEON, lost to F(2x2)
    everywhere). On OpenCL a pointwise conv reads its input as the GEMM operand directly
    (implicit GEMM; im2col would only copy it); on NEON im2col beat implicit GEMM, whose tiles
    gather the patches again for every row tile. Small convs stay one kernel, where launches
    and the patch matrix's round trip would dominate."""
    ok = [name for name, why in applicable(fused).items() if why is None]
    block = conv_block(fused)
    if block is not None:
        conv = block.conv
        c, m = conv.inputs[0].shape[1], conv.shape[1]
        pixels = prod(conv.shape[2:])
        big = m >= 16 and pixels >= 196
        pointwise = prod(conv.attrs["kernel_shape"]) == 1 and not any(conv.attrs["pads"]) \
            and set(conv.attrs["strides"]) == {1}
        if backend == "opencl" and pointwise and "implicit_gemm" in ok:
            return "implicit_gemm"
        if backend == "neon" and "im2col" in ok and c <= 64 and pixels >= 1024:
            return "im2col"  # few channels over a large map: the transforms cost more
        if "winograd" in ok and c >= 16 and big:
            # F(4x4) needs 4 | OH, OW for its output transform to unroll 4x4 blocks
            whole = all(s % 4 == 0 for s in conv.shape[2:])
            return "winograd_4x4" if backend == "opencl" and whole else "winograd"
        if "im2col" in ok and c * prod(conv.attrs["kernel_shape"]) >= 32 and big:
            return "im2col"
    return "implicit_gemm" if "implicit_gemm" in ok else "direct"


def choose(fused: FusedOp, backend: str, tuned: bool | None = None) -> str:
    """The measured best algorithm from the Fast-Run database (measured now when ``tuned`` is
    True and nothing is stored), else ``heuristic``'s pick."""
    if tuned is False:
        return heuristic(fused, backend)
    from autotune import stored_algorithm, tune_algorithm

    if tuned:
        return str(tune_algorithm(fused, backend).best.as_options()["algorithm"])
    return stored_algorithm(fused, backend) or heuristic(fused, backend)


def build(fused: FusedOp, algorithm: str, backend: str, tuned: bool | None = None,
          **options: Any) -> Any:
    """``fused`` run with ``algorithm`` on ``backend``: a Kernel for the one-kernel algorithms
    (im2col among them where its pack gathers the patches), a ``Program`` for the others.
    ``tuned`` and ``options`` (tiles) go to every stage."""
    from .program import Program

    reasons = applicable(fused)
    why = reasons.get(algorithm, f"unknown algorithm (known: {', '.join(ALGORITHMS)})")
    if why is not None:
        raise UnsupportedError(backend, f"convolution algorithm '{algorithm}'",
                               f"block '{fused.name}': {why}")
    if algorithm == "direct":
        if reasons["implicit_gemm"] is not None:  # the emitters' own choice is direct
            return fused.emit_kernel(backend, tuned, **options)
        return fused.emit_kernel(backend, tuned=False, **{**DIRECT_OPTIONS[backend], **options})
    if algorithm == "implicit_gemm":
        # a packed operand would be im2col's patches: read them in place (a block of two
        # convs, AGO's, packs its producer's values on NEON instead)
        extra = {PACKING[backend]: False} if conv_block(fused) else {}
        return fused.emit_kernel(backend, tuned, **{**options, **extra})
    block = conv_block(fused)
    assert block is not None
    if algorithm == "im2col":
        kernel = fused.emit_kernel(backend, tuned, **{**options, PACKING[backend]: True})
        packed = kernel.metadata.get("packed_operand_reads")
        if packed and block.conv.inputs[1].name not in packed:
            return kernel  # the pack gathers the patches: im2col fused into the pack
    stages = _im2col_stages(block) if algorithm == "im2col" else \
        _winograd_stages(block, backend, WINOGRAD_TILES[algorithm])
    folded: dict[str, np.ndarray] = {}
    kernels = []
    external = {id(v) for v in fused.inputs}
    for stage in stages:
        if isinstance(stage, Constant):  # computed when the program was built
            folded[stage.name] = stage.value
            continue
        kernels.append(stage.emit_kernel(backend, tuned, **options))
        folded.update((v.name, v.value) for v in stage.inputs  # the transforms' matrices
                      if isinstance(v, Constant) and id(v) not in external)
    return Program(f"{fused.name}_{algorithm}", backend, fused.inputs, kernels, folded,
                   {"algorithm": algorithm})


# --- graph surgery --------------------------------------------------------------------------

def _tail(block: ConvBlock, core: Op) -> FusedOp:
    """The stage computing ``core`` (standing in for the conv) with the epilogue fused, plus
    any prologue op the epilogue reads directly (a residual of the conv's own input)."""
    epilogue = rewire(block.epilogue, [(block.conv, core)])
    members = {id(op) for op in block.prologue}
    reread = [op for op in block.prologue if any(
        id(op) in _ancestors(v, members) for e in epilogue for v in e.inputs)]
    return fuse(core, *epilogue, *reread, force=True)


def _spatial_reads(conv: Op, out_axes: list[sympy.Expr], kernel_axes: list[sympy.Expr]
                   ) -> tuple[list[sympy.Expr], sympy.Basic]:
    """``window_index`` with ``conv``'s own strides, dilations and begin pads."""
    a = conv.attrs
    begin = a["pads"][:len(a["kernel_shape"])]
    return window_index(out_axes, kernel_axes, a["strides"], a["dilations"], begin,
                        conv.inputs[0].shape[2:])


# --- im2col + GEMM ----------------------------------------------------------------------------

def _im2col_stages(block: ConvBlock) -> list[FusedOp]:
    conv = block.conv
    x, w = conv.inputs[0], conv.inputs[1]
    kernel = list(conv.attrs["kernel_shape"])
    nd = len(kernel)
    n, c = x.shape[:2]
    out = list(conv.shape[2:])
    # cols[n, c, k..., o...]: memory order (n, C*K, OH*OW), the GEMM's right operand
    o = out_symbols(2 + 2 * nd)
    idx, inside = _spatial_reads(conv, list(o[2 + nd:]), list(o[2:2 + nd]))
    cols = make_op("Im2Col", [x], (n, c, *kernel, *out), x.dtype,
                   Read(x.dtype, 0, (o[0], o[1], *idx), inside), {"of": conv.name})
    # out[n, m, o...] = sum_{c, k...} w[m, c, k...] * cols[n, c, k..., o...]
    q = out_symbols(conv.rank)
    rc = fresh_reduce_symbol("c")
    rk = [fresh_reduce_symbol("kk") for _ in kernel]
    body: Expr = reduce("sum", call("mul", Read(w.dtype, 1, (q[1], rc, *rk)),
                                    Read(x.dtype, 0, (q[0], rc, *rk, *q[2:]))),
                        ((rc, c), *zip(rk, kernel)))
    inputs = [cols, w]
    if len(conv.inputs) > 2:
        body = call("add", body, Read(conv.dtype, 2, (q[1],)))
        inputs.append(conv.inputs[2])
    gemm = make_op("Conv", inputs, conv.shape, conv.dtype, body,
                   {**conv.attrs, "algorithm": "im2col"}, name=conv.name)
    return [fuse(*block.prologue, cols, force=True), _tail(block, gemm)]


# --- Winograd F(2x2, 3x3) and F(4x4, 3x3) -----------------------------------------------------

def _winograd_stages(block: ConvBlock, backend: str, tile: int) -> list[FusedOp | Constant]:
    """The filter, input, batched-GEMM and output stages of F(tile x tile, 3x3)."""
    conv = block.conv
    x, w = conv.inputs[0], conv.inputs[1]
    n, c = x.shape[:2]
    m = conv.shape[1]
    side = tile + 2  # input tile side: the transform positions a, b
    th, tw = (-(-s // tile) for s in conv.shape[2:])
    f32 = DType.float32
    stages: list[FusedOp | Constant] = []

    # U[a, b, m, c] = sum_ij G[a, i] G[b, j] w[m, c, i, j]; once, when w is a constant
    g = constant(new_name("winograd_g"), WINOGRAD_G if tile == 2 else WINOGRAD4_G)
    a_, b_, m_, c_ = out_symbols(4)
    i, j = fresh_reduce_symbol("i"), fresh_reduce_symbol("j")
    coef = call("mul", Read(f32, 0, (a_, i)), Read(f32, 0, (b_, j)))
    u_op = make_op("WinogradFilter", [g, w], (side, side, m, c), f32,
                   reduce("sum", call("mul", coef, Read(f32, 1, (m_, c_, i, j))),
                          ((i, 3), (j, 3))), {"of": conv.name})
    u_stage = fuse(u_op)
    u: Value = u_op
    if isinstance(w, Constant):
        kernel = u_stage.emit_kernel(backend, tuned=False)
        u = constant(u_op.name, kernel(*(v.value for v in u_stage.inputs
                                         if isinstance(v, Constant))))
        stages.append(u)
    else:
        stages.append(u_stage)

    # V[a, b, c, n, th, tw] = sum_ij BT[a, i] BT[b, j] x[n, c, tile th + i - p, tile tw + j - p].
    # BT is folded into the expression: for F(2x2) each row holds two +-1 entries, so V is four
    # signed taps picked by index arithmetic (no coefficient loads, no multiplications); for
    # F(4x4) a row is a select over the six rows of constant-coefficient sums, which a tile
    # unrolled per work-item specialises away. The inner sum over j is shared by every a.
    a_, b_, c_, n_, t_h, t_w = out_symbols(6)

    def tap(i: sympy.Expr, j: sympy.Expr) -> Expr:
        idx, inside = _spatial_reads(conv, [tile * t_h, tile * t_w], [i, j])
        return Read(f32, 0, (n_, c_, *idx), inside)

    def bt_row(a: sympy.Expr, term: Callable[[sympy.Expr], Expr]) -> Expr:
        if tile == 2:
            return _signed_sum([(term(col), neg) for col, neg in _bt_row(a)])
        return _matrix_row(a, WINOGRAD4_BT, term)

    v_op = make_op("WinogradInput", [x], (side, side, c, n, th, tw), f32,
                   bt_row(a_, lambda i: bt_row(b_, lambda j: tap(i, j))), {"of": conv.name})
    stages.append(fuse(*block.prologue, v_op, force=True))

    # M[a, b, m, n, th, tw] = sum_c U[a, b, m, c] V[a, b, c, n, th, tw]: side^2 batched GEMMs
    a_, b_, m_, n_, t_h, t_w = out_symbols(6)
    rc = fresh_reduce_symbol("c")
    mm = make_op("WinogradGemm", [u, v_op], (side, side, m, n, th, tw), f32,
                 reduce("sum", call("mul", Read(f32, 0, (a_, b_, m_, rc)),
                                    Read(f32, 1, (a_, b_, rc, n_, t_h, t_w))), ((rc, c),)),
                 {"of": conv.name})
    stages.append(fuse(mm))

    # Y[n, m, y, x] = sum_ab AT[y % t, a] AT[x % t, b] M[a, b, m, n, y // t, x // t] (+ bias).
    # F(2x2): row r of AT is +1 at a = r and (-1)^r at a = r + 1, r + 2: nine signed loads, AT
    # folded. F(4x4): a select over AT's rows of constant-coefficient sums, as for BT.
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
    y = make_op("Conv", inputs, conv.shape, f32, body, {**conv.attrs, "algorithm": algorithm},
                name=conv.name)
    stages.append(_tail(block, y))
    return stages


def _matrix_row(index: sympy.Expr, matrix: np.ndarray,
                term: Callable[[sympy.Expr], Expr]) -> Expr:
    """Row ``index`` of a small constant ``matrix`` times the column vector ``term(0..k-1)``:
    a select over the rows, each row a sum of its nonzero entries' terms with the entries as
    constants (+-1 as an add or a subtraction). Once ``index`` is a constant (an unrolled
    copy), ``loop_ir.specialise`` leaves only that row's sum."""
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
