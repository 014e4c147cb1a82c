"""Convolution algorithms (MegEngine's CPU inference, docs/algorithms.md): one fused Conv block,
five ways to run it. Every way keeps the block's prologue (elementwise ops on the input) and
epilogue (bias, BN, activation, residual...) fused.

- ``direct``: one kernel, a sliding window per output element (the generic schedules).
- ``implicit_gemm``: one kernel, the contraction template reading patches through the conv's
  index map in place, with no patch buffer (the default single-kernel form; needs
  ``group == 1``).
- ``im2col``: the patches are gathered, prologue applied, into the GEMM's operand layout,
  then multiplied with the epilogue fused into the store. On every backend this is one
  kernel, as in MegEngine: the contraction packs its patch operand (option ``pack``) a
  cache-sized block at a time, and the tiles consume each block while it is in cache (the
  pack is the im2col). NEON packs a block of ``tn``-wide panels (``PACK_BLOCK_BYTES``) by
  vectors along an output row; OpenCL packs one column tile's panel per work-item, which
  then runs every row tile on it (``pack_in_tile``; with few column tiles a first launch
  packs them all); Triton packs each program's block of output pixels (``pack``), then
  sweeps every block of output channels. Where the patches cannot be the packed operand (a
  stride along the row, except on an OpenCL CPU a stride of 2 over output rows that take
  16-lane vectors: ``columns.column_plan``) it is two kernels: a (C·KH·KW) × (OH·OW) patch matrix
  per image, contiguous along output pixels, then a plain GEMM. (An OpenCL work-group
  packing its panel into local memory, then running the tiles from it, measured 1.7× slower
  on PoCL than the implicit GEMM it was made from: 3.2 against 1.8 ms, 3×3 64→64 at 56×56.)
- ``winograd``: F(2×2, 3×3) for 3×3, stride 1, dilation 1, 2-D. The filter transform
  U = G·g·Gᵀ runs once when the weights are constant; the input transform V = Bᵀ·d·B per
  4×4 tile (prologue fused); 16 independent GEMMs U·V (one batched contraction, 2.25× fewer
  multiplications than direct); the output transform Y = Aᵀ·M·A with the epilogue fused.
  Bᵀ and Aᵀ hold only 0 and ±1, so both transforms are signed sums of taps chosen by index
  arithmetic (four per V element, nine per output), not contractions with a coefficient
  matrix (``winograd.py``).
- ``winograd_4x4``: F(4×4, 3×3), the same four stages on 6×6 input tiles: 36 GEMMs over
  2.25 input values per output instead of 4 (4× fewer multiplications than direct). Its
  transform entries include 2, 4, 5 and 8, so each row of Bᵀ and Aᵀ is a sum with constant
  coefficients, picked by a select on the row that an unrolled tile specialises away.

Which one runs is measured (``kernelgen.tune.tune_algorithm``, stored in the Fast-Run database)
or, when nothing was measured for this shape and device, chosen by ``heuristic``. This module
only rewrites a block into stages; ``kernelgen.compile`` builds their kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..backends import Capabilities
from ..dtypes import DType
from ..fusion import FusedBlock, fuse
from ..ir.expr import Expr, Read, call, reduce
from ..ir.node import Op, Value, rewire
from ..lower import lower
from ..lower.contraction import contraction
from ..mapping_types import fresh_reduce_symbol, out_symbols
from ..ops.common import make_op
from ..ops.nn import window_index
from ..shapes import prod

ALGORITHMS = ("direct", "implicit_gemm", "im2col", "winograd", "winograd_4x4")
WINOGRAD_TILES = {"winograd": 2, "winograd_4x4": 4}  # output tile side of F(m x m, 3x3)
# below this many multiply-adds a convolution is launch-bound: split into stages it only gains
# launches (3x3 16->16 at 5x5, 58k: Winograd 0.048 ms against the implicit GEMM's 0.034)
SPLIT_MIN_MACS = 1 << 20


@dataclass(frozen=True)
class ConvBlock:
    """A fused block around exactly one Conv: the ops its input goes through first (prologue)
    and the ops applied to its output (epilogue), each in block order."""

    fused: FusedBlock
    conv: Op
    prologue: tuple[Op, ...]
    epilogue: tuple[Op, ...]


def conv_block(fused: FusedBlock) -> ConvBlock | None:
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


def applicable(fused: FusedBlock) -> dict[str, str | None]:
    """Each algorithm with None when it can run this block, else the reason it cannot."""
    block = conv_block(fused)
    out: dict[str, str | None] = {"direct": None}
    out["implicit_gemm"] = None if contraction(lower(fused)) is not None else \
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


def heuristic(fused: FusedBlock, caps: Capabilities) -> str:
    """The algorithm to use when nothing was measured for this block on this device, from
    ``bench/conv.py`` runs (ResNet 3x3 and 1x1 at 56x56) and ``bench/conv_algorithms.py``'s
    sweep of the convolutions of ResNet-50, Inception v1 and SqueezeNet (docs/benchmarks.md,
    "Which algorithm when nothing is tuned").

    - A pointwise conv on OpenCL reads its input as the GEMM operand directly (implicit GEMM;
      im2col would only copy it).
    - Few input channels favour im2col at every map size: Winograd's 16 GEMMs then reduce over
      C alone, im2col's over 9C. Up to 64 channels on NEON (32 at 27x27: 0.96 against F(2x2)'s
      1.03 ms; 64 at 56x56: 3.70 against 4.98), up to 32 on OpenCL (16 at 55x55: 0.56 against
      1.74), where from 64 channels Winograd won but for one shape (64->192 at 55x55); the
      3-channel stem of SqueezeNet, 3x3 stride 2, 1.82 against the implicit GEMM's 2.25.
    - Otherwise Winograd is the fastest 3x3: on OpenCL 1.35 ms against im2col's 1.91 once its
      transforms unroll a tile per work-item; F(4x4) beat or tied F(2x2) where 4 divides the
      output (3x3: 1.17 against 1.30 ms and 0.88 against 0.86 in two runs; with BN and ReLU
      0.97 against 1.09 and 0.98 against 1.17). On NEON F(2x2) won from 128 channels (128 at
      28x28: 2.37 against im2col's 5.49; 512 at 7x7: 2.87 against 7.14); F(4x4), whose stages
      do not unroll on NEON, lost to F(2x2) everywhere.
    - On an OpenCL CPU, where im2col's columns run over the whole output map (a wrapped run,
      ``columns.vector_plan``), a map whose F(2x2) output tiles compute 25 % or more of the
      outputs in vain (``caps.winograd_max_waste``: odd sides up to 7) runs im2col: at 7x7
      1.07-1.8x faster than F(2x2) on five shapes of 64-512 channels (512 -> 512 0.921
      against 1.032 ms, 128 -> 128 0.083 against 0.136, device time), while at 13x13 (16 %
      wasted) F(2x2) stayed 0.98-1.16x ahead and at 6x6 (none) 1.5x.
    - Every other convolution of a real model ran 2-5x slower as an implicit GEMM on OpenCL and
      5-20x on NEON, whose tiles gather the patches again for every row tile, small maps
      included (3x3 512->512 at 7x7: 6.69 ms against Winograd's 1.48 on OpenCL; 5x5 32->128 at
      13x13: 0.62 against im2col's 0.32). So on CPUs (``caps.split_small_convs``) only a
      convolution too small for a split to pay (under ``SPLIT_MIN_MACS`` multiply-adds:
      launch-bound) stays one implicit GEMM.

    Which backend prefers what is data in its capabilities (``pointwise_conv_in_place``,
    ``im2col_max_channels``, ``winograd_4x4``, ``split_small_convs``,
    ``winograd_max_waste``)."""
    ok = [name for name, why in applicable(fused).items() if why is None]
    block = conv_block(fused)
    if block is not None:
        conv = block.conv
        c, m = conv.inputs[0].shape[1], conv.shape[1]
        pixels = prod(conv.shape[2:])
        taps = prod(conv.attrs["kernel_shape"])
        big = m >= 16 and pixels >= 196
        worth = big or (caps.split_small_convs and c * m * pixels * taps >= SPLIT_MIN_MACS)
        pointwise = taps == 1 and not any(conv.attrs["pads"]) \
            and set(conv.attrs["strides"]) == {1}
        if caps.pointwise_conv_in_place and pointwise and "implicit_gemm" in ok:
            return "implicit_gemm"
        if "im2col" in ok and c <= caps.im2col_max_channels and worth:
            return "im2col"  # few channels: Winograd's 16 GEMMs reduce over C alone
        if "winograd" in ok and c >= 16 and m >= 16 and worth and not (
                caps.winograd_max_waste and "im2col" in ok and
                _tiles_waste(conv.shape[2:]) >= caps.winograd_max_waste):
            # F(4x4) needs 4 | OH, OW for its output transform to unroll 4x4 blocks
            whole = all(s % 4 == 0 for s in conv.shape[2:])
            return "winograd_4x4" if caps.winograd_4x4 and whole and big else "winograd"
        if "im2col" in ok and c * taps >= 32 and worth:
            return "im2col"
    return "implicit_gemm" if "implicit_gemm" in ok else "direct"


def _tiles_waste(spatial: tuple[int, ...]) -> float:
    """The outputs F(2x2)'s tiles compute over those of the map ``spatial``."""
    return prod(-(-s // 2) * 2 for s in spatial) / prod(spatial)


def tail(block: ConvBlock, core: Op) -> FusedBlock:
    """The stage computing ``core`` (standing in for the conv) with the epilogue fused, plus
    any prologue op the epilogue reads directly (a residual of the conv's own input)."""
    epilogue = rewire(block.epilogue, [(block.conv, core)])
    members = {id(op) for op in block.prologue}
    reread = [op for op in block.prologue if any(
        id(op) in _ancestors(v, members) for e in epilogue for v in e.inputs)]
    return fuse(core, *epilogue, *reread, force=True)


def spatial_reads(conv: Op, out_axes: list[sympy.Expr], kernel_axes: list[sympy.Expr]
                   ) -> tuple[list[sympy.Expr], sympy.Basic]:
    """``window_index`` with ``conv``'s own strides, dilations and begin pads."""
    a = conv.attrs
    begin = a["pads"][:len(a["kernel_shape"])]
    return window_index(out_axes, kernel_axes, a["strides"], a["dilations"], begin,
                        conv.inputs[0].shape[2:])


def im2col_stages(block: ConvBlock) -> list[FusedBlock]:
    """The patch matrix (prologue applied) and a GEMM with the epilogue fused in."""
    conv = block.conv
    x, w = conv.inputs[0], conv.inputs[1]
    kernel = list(conv.attrs["kernel_shape"])
    nd = len(kernel)
    n, c = x.shape[:2]
    out = list(conv.shape[2:])
    # cols[n, c, k..., o...]: memory order (n, C*K, OH*OW), the GEMM's right operand
    o = out_symbols(2 + 2 * nd)
    idx, inside = spatial_reads(conv, list(o[2 + nd:]), list(o[2:2 + nd]))
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
    return [fuse(*block.prologue, cols, force=True), tail(block, gemm)]
