"""Vector columns of the contraction templates: which trailing output axes a tile walks as
vectors (``vector_plan``), the contraction the 'tiled' and 'window' schedules run
(``opencl_contraction``) and its vector stores (``vector_epilogue``)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy

from ...dtypes import DType
from ...ir.expr import Expr
from ...ir.loop import Buffer, LoopKernel
from ...ir.substitute import flatten_axes, flatten_offset
from ...lower.contraction import Contraction, contraction, operand_has_reduction
from ...shapes import prod
from ..base import Capabilities
from ..c.vector import vectorizable
from .language import vector_syntax

# Vector-column contraction (contraction_vec.cl.tmpl): 8 rows x 2 float16 = 16 of AVX-512's 32
# registers hold the sums. Measured on PoCL, 1024^3 GEMM: 140-220 GFLOP/s against 24 for the
# scalar 8x8 tile, whose arrays PoCL left in memory. Work-groups of a few rows share the right
# operand's panel; 4 measured as good as 1 and better than 64. The columns are two of the
# widest vectors the device builds (``vector_tile``).
VECTOR_TILE = (8, 32)
# On a CPU, where the columns split into tiles of four vectors with at most WIDE_MAX_WASTE of
# them computed in vain (the last tile shifted back over its neighbour), a tile of 4 rows x 4
# vectors: per reduction step 4 vector loads and 4 broadcasts feed 16 FMAs, against 2 and 8
# for 8 x 2, and the right operand's rows are read 256 bytes at a time. Both timed in one
# process on PoCL (bench/conv1x1.py --repeat 200, results of 2026-11-27): the 13 1x1
# convolutions of ResNet-50, MobileNetV2 and ShuffleNet over maps of 28x28 and more ran
# 1.03-1.36x faster; GEMMs 512^3 1.18x and 1024^3 1.30x (160 -> 208 GFLOP/s, a development
# script). Over 14x14 maps (196 columns, 31 % of a 64-wide tiling wasted) 8 x 2 was faster on
# 5 of 7 (up to 1.2x).
WIDE_TILE = (4, 4)  # rows, vectors
WIDE_MAX_WASTE = 1.1
# Both tiles hold 16 vectors of sums: AVX-512's 32 registers have room for them and for the
# step's loads, AVX2's 16 do not (PoCL splits a float16 into two 8-lane registers, so 4 x 64
# floats are 32 registers of sums). With 16 registers the tiles keep 12 sums in vectors as wide
# as a register: 4 rows x 3 vectors (3 loads and a broadcast fill the other 4) and 6 rows x 2
# where 3 vectors would waste columns. Timed round-robin with the AVX-512 tiles on PoCL, AMD
# EPYC (Zen 3, AVX2), bench/conv1x1.py (docs/benchmarks.md): 1x1 convolutions over 56x56 maps
# 1.08-1.77x faster, over 7x7 maps 0.98-1.25x.
NARROW_TILE = (6, 2)  # rows, vectors: the default with 16 registers
NARROW_WIDE_TILE = (4, 3)


@dataclass(frozen=True)
class VectorPlan:
    """Columns of a vector-column contraction tile: ``run`` (domain positions, row-major) is
    the column axes one tile walks as ``tile_n`` consecutive flat positions, ``width`` lanes a
    vector; ``right`` is the right operand over the flat position ``flat`` when it reads the run
    contiguously (vector loads), else None (lanes loaded one by one)."""

    run: tuple[int, ...]
    width: int
    tile_n: int
    flat: sympy.Symbol
    right: Expr | None


def vector_tile(widths: tuple[int, ...]) -> tuple[int, int]:
    """The vector template's default tile: ``VECTOR_TILE``'s rows by two of the widest vectors
    the device builds."""
    return VECTOR_TILE[0], 2 * widths[0] if widths else VECTOR_TILE[1]


@dataclass(frozen=True)
class RegisterTiles:
    """A device's default register tiles for the vector template, as (rows, vectors), and the
    vector widths its columns may use (widest first)."""

    widths: tuple[int, ...]
    default: tuple[int, int]
    wide: tuple[int, int]  # where its column tiles waste at most ``WIDE_MAX_WASTE``

    def default_tile(self) -> tuple[int, int]:
        """``default`` as (rows, columns)."""
        return self.default[0], self.default[1] * self.widths[0]


def few_registers(caps: Capabilities) -> bool:
    """Whether ``caps`` is a CPU with 16 SIMD registers (AVX2, SSE), whose tiles are narrow."""
    return 0 < caps.vector_registers < 32


def register_tiles(caps: Capabilities) -> RegisterTiles:
    """``NARROW_TILE`` and ``NARROW_WIDE_TILE`` in register-wide vectors on a CPU with 16 SIMD
    registers (AVX2, SSE), else the tiles measured on AVX-512 in the widest vectors."""
    widths = caps.vector_widths
    if few_registers(caps):
        narrow = tuple(w for w in widths if w <= caps.register_lanes) or widths[-1:]
        return RegisterTiles(narrow, NARROW_TILE, NARROW_WIDE_TILE)
    return RegisterTiles(widths, (VECTOR_TILE[0], 2), WIDE_TILE)


def wide_plan(k: LoopKernel, c: Contraction, plan: VectorPlan, tiles: RegisterTiles
              ) -> VectorPlan | None:
    """``tiles.wide``'s columns in place of the default ``plan`` (its tile takes its rows)
    where the right operand loads as vectors and that many vectors tile its run with little
    waste, else None (a row-less contraction's tile has one row: nothing to trade)."""
    if not c.rows:
        return None
    n_run = prod(k.domain[i][1] for i in plan.run)
    rows, vectors = tiles.wide
    tile_n = vectors * plan.width
    if plan.right is None or n_run < tile_n or \
            -(-n_run // tile_n) * tile_n > WIDE_MAX_WASTE * n_run:
        return None
    wide = vector_plan(k, c, (rows, tile_n), False, tiles.widths)
    return wide if wide is not None and wide.right is not None else None


@lru_cache(maxsize=256)  # asked by the tuner's search space and by choose, per emit
def opencl_contraction(kernel: LoopKernel, widths: tuple[int, ...], stride2: bool = False
                       ) -> Contraction | None:
    """The contraction the 'tiled' schedule runs: ``lower.contraction``'s, or a rowless one
    (depthwise conv) when its columns load as vectors of ``widths`` (every second one too,
    with ``stride2``: the 'window' schedule's); the row-less form with lanes loaded one by one
    would lose to the 'item' and 'row' schedules."""
    found = contraction(kernel)
    if found is not None or not widths or \
            not all(b.dtype is DType.float32 for b in kernel.outputs):
        return found
    rowless = contraction(kernel, rowless=True)
    if rowless is None or operand_has_reduction(rowless.right):
        return None
    plan = vector_plan(kernel, rowless, vector_tile(widths), False, widths, stride2=stride2)
    return rowless if plan is not None and plan.right is not None else None


def vector_epilogue(k: LoopKernel, c: Contraction, plan: VectorPlan, masks: bool = False
                    ) -> list[tuple[Buffer, sympy.Expr, Expr]] | None:
    """(output, flat store offset, flat value) for each output when all store ``width``
    lanes contiguously and have a vector form, else None. With ``masks``, a condition on
    the column (a padded AveragePool's count of valid taps) becomes a lane mask."""
    run = [k.domain[i] for i in plan.run]
    offset = flatten_offset(k.store_offset, run, plan.flat)
    if offset is None or offset.coeff(plan.flat) != 1:
        return None
    syntax, keep = vector_syntax(plan.width), frozenset({c.reduce})
    out = []
    for buf, st in zip(k.outputs, k.stores):
        value = flatten_axes(st.value, run, plan.flat, keep)
        if value is None or not vectorizable(value, plan.flat, syntax, guarded=masks, lanes=keep):
            return None
        out.append((buf, offset, value))
    return out


def vector_plan(k: LoopKernel, c: Contraction, tile: tuple[int, ...], full_columns: bool,
                widths: tuple[int, ...], producer: bool = False, stride2: bool = False
                ) -> VectorPlan | None:
    """The widest contiguous run of trailing column axes the right operand reads, and the
    vector width (one of ``widths``, the device's) and tile that fit it; None when no run has
    as many columns as the narrowest width (scalar template).
    ``full_columns`` (AGO) needs one tile spanning every column; ``producer`` lets the right
    operand hold a reduction (AGO's producer as the vector operand); ``stride2`` lets it read
    every second column (the 'window' schedule's strided convs)."""
    flat = sympy.Symbol("kg_col")
    if not widths:
        return None
    syntax = vector_syntax(widths[0], stride2)
    cols = list(c.cols)
    # default: lanes loaded one by one over every column
    choice: tuple[tuple[int, ...], Expr | None] = (tuple(cols), None)
    for start in range(len(cols) if not full_columns else 1):
        run = tuple(cols[start:])
        merged = flatten_axes(c.right, [k.domain[i] for i in run], flat)
        if merged is not None and vectorizable(merged, flat, syntax, guarded=True,
                                               reductions=producer):
            choice = (run, merged)
            break
    run, right = choice
    n_run = prod(k.domain[i][1] for i in run)
    if full_columns:
        width = next((w for w in widths if n_run % w == 0), 0)
        return VectorPlan(run, width, n_run, flat, right) if width else None
    want = max(tile[1], 1)
    fitting = [w for w in widths if w <= min(want, n_run)]
    if not fitting:
        return None
    width = next((w for w in fitting if want % w == 0), fitting[0])
    return VectorPlan(run, width, min(want - want % width, n_run - n_run % width), flat, right)
