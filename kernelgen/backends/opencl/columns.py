"""Vector columns of the contraction templates: which trailing output axes a tile walks as
vectors (``vector_plan``), the contraction the 'tiled' and 'window' schedules run
(``opencl_contraction``) and its vector stores (``vector_epilogue``)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import sympy

from ...dtypes import DType
from ...ir.expr import Expr, extent
from ...ir.loop import Buffer, LoopKernel
from ...ir.substitute import flatten_axes, flatten_offset, flatten_offset_aligned
from ...lower.contraction import (Contraction, contraction, operand_buffers,
                                  operand_has_reduction)
from ...shapes import prod
from ..base import Capabilities
from ..c.vectorizable import vectorizable
from .language import vector_syntax

# Vector-column contraction (contraction_vec.cl.tmpl): 8 rows x 2 float16 = 16 of AVX-512's 32
# registers hold the sums. Measured on PoCL, 1024^3 GEMM: 140-220 GFLOP/s against 24 for the
# scalar 8x8 tile, whose arrays PoCL left in memory. Work-groups of a few rows share the right
# operand's panel; 4 measured as good as 1 and better than 64. The columns are two of the
# widest vectors the device builds (``vector_tile``).
VECTOR_TILE = (8, 32)
# On a CPU, where the columns split into tiles of four vectors with at most WIDE_MAX_WASTE of
# them computed in vain (the last tile shifted back over its neighbour), a tile of 6 rows x 4
# vectors: per reduction step 4 vector loads and 6 broadcasts feed 24 FMAs (24 registers of
# sums, 29 of AVX-512's 32 with the loads), against 2 and 8 for 16 FMAs in 8 x 2, and the right
# operand's rows are read 256 bytes at a time. 4 x 4 (16 FMAs a step) had been measured 1.03-
# 1.36x faster than 8 x 2 on the 1x1 convolutions of ResNet-50, MobileNetV2 and ShuffleNet over
# maps of 28x28 and more (bench/conv1x1.py, 2026-11-27); 6 x 4 ran 1.03-1.19x faster than 4 x 4
# on 16 of the 17 blocks that take it (0.97x on 16->96 at 112x112; geometric mean 1.08x;
# device times, Intel Xeon, PoCL, bench/wide_tiles.py, docs/benchmarks.md "Six-row wide
# tiles"). Where 6-row tiles would waste more than WIDE_MAX_WASTE of the rows (32 output
# channels: 36 computed), the wide tile keeps 4 rows.
# Over 14x14 maps (196 columns, 31 % of a 64-wide tiling wasted) 8 x 2 was faster on 5 of 7.
WIDE_TILE = (6, 4)  # rows, vectors
WIDE_FEW_ROWS = 4  # the wide tile's rows where WIDE_TILE's would waste rows
WIDE_MAX_WASTE = 1.1
# The tiles hold 16 and 24 vectors of sums: AVX-512's 32 registers have room for them and for
# the step's loads, AVX2's 16 do not (PoCL splits a float16 into two 8-lane registers, so 4 x 64
# floats are 32 registers of sums). With 16 registers the tiles keep 12 sums in vectors as wide
# as a register: 4 rows x 3 vectors (3 loads and a broadcast fill the other 4) and 6 rows x 2
# where 3 vectors would waste columns. Timed round-robin with the AVX-512 tiles on PoCL, AMD
# EPYC (Zen 3, AVX2), bench/conv1x1.py (docs/benchmarks.md): 1x1 convolutions over 56x56 maps
# 1.08-1.77x faster, over 7x7 maps 0.98-1.25x.
NARROW_TILE = (6, 2)  # rows, vectors: the default with 16 registers
NARROW_WIDE_TILE = (4, 3)
# Operands exchanged (``swap_operands``): a 1x1 convolution over a small map has few pixels an
# output channel (49 at 7x7, 169 at 13x13, 196 at 14x14), which 32-wide pixel tiles cover with
# 14-31 % of the columns computed in vain. With the lanes along the output channels instead
# (the weights, constants, packed into panels once) and the pixels as rows, a row count that
# divides the pixels wastes none; but the output is contiguous along the pixels, so the
# exchanged tile's epilogue runs lane by lane. It pays where the FMAs saved an output point
# outweigh that (``SWAP_MIN_SAVED`` reduction points), or where the weights are large enough
# (``SWAP_MIN_LEFT_BYTES``) that the pixel tiles' strided weight rows stall. Round-robin on
# PoCL (AMD EPYC, AVX-512), bench/conv1x1.py --orders-only, three runs, exchanged against pixel
# vectors: ResNet-50's four 1x1 convs over 14x14 and 7x7 maps (1-4 MiB of weights) 1.16-1.89x,
# SqueezeNet's 512->1000 at 13x13 1.19-1.21x, the five others the rule takes 0.96-1.18x; below
# the thresholds the ratios scattered around 1 (384->64 at 14x14: 0.88-1.15x), and ShuffleNet
# v1's grouped 136->136 convs at 7x7 with a residual add ran 0.74-0.88x (docs/benchmarks.md).
SWAP_MIN_WASTE = WIDE_MAX_WASTE  # the pixel tiles' columns computed over those stored, above
SWAP_MIN_REDUCTION = 128  # reduction points, at least
SWAP_MIN_SAVED = 64  # (pixel tiles' waste - exchanged tiles' waste) x reduction points
SWAP_MIN_LEFT_BYTES = 1 << 20
SWAP_ROWS = range(6, 15)  # 2 vectors of sums a row: 28 of AVX-512's 32 registers at most
# A stride-2 run of the right operand (``column_plan``), measured round-robin against the patch
# matrix and its GEMM on PoCL (AMD EPYC, AVX-512, bench/strided_convs.py, three runs of 300
# rounds): with output rows of 28 and more, whose runs take 16 lanes, the 7x7 stem of ResNet-50
# 1.16-1.17x, ShuffleNet's 3x3 stem 1.25-1.32x, MobileNetV2's 1.01-1.16x, ResNet-50's 3x3 and
# 1x1 over 56x56 1.25-1.26x and 1.08-1.11x, SqueezeNet's stem 0.97-0.99x; rows of 14 and 7,
# whose runs take 8 and 4 lanes, ran 0.3-0.8x as fast in a first run. Not measured with
# 8-lane registers (AVX2).
STRIDE2_MIN_LANES = 16
# Where a padded conv's patches wrap from one output row into the next (``vector_plan``'s
# ``wrap``): off only to time the row-by-row runs against them (bench/wrapped_runs.py)
WRAP_RUNS = True
# ... whose wide tiles, over a small map, would leave the patches too few column tiles to pack
# each in its own work-item (schedule.PACK_TILE_MIN_ITEMS): a first kernel then packs them, which
# lost to the default tile packing in its tiles (device time, PoCL, Xeon AVX-512): 16 -> 32 5x5
# at 28x28, 13 tiles of 64, 0.156 ms against 0.117; 32 -> 128 3x3 at 27x27 0.222 against 0.181
WRAPPED_WIDE_MIN_TILES = 16


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
    wrapped: bool = False  # ``right``'s guards test each lane's row and column (``wrap``)


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
    wide_few_rows: int  # the wide tile's rows where ``wide``'s would waste rows

    def default_tile(self) -> tuple[int, int]:
        """``default`` as (rows, columns)."""
        return self.default[0], self.default[1] * self.widths[0]

    def wide_rows(self, n_rows: int) -> int:
        """The wide tile's rows over ``n_rows`` rows: ``wide``'s where its row tiles (the
        last shifted back) compute at most ``WIDE_MAX_WASTE`` of the rows, else
        ``wide_few_rows`` (fewer than ``n_rows`` then: a tile of all the rows wastes none)."""
        rows = min(self.wide[0], n_rows)
        wasteful = -(-n_rows // rows) * rows > WIDE_MAX_WASTE * n_rows
        return self.wide_few_rows if wasteful else rows


def few_registers(caps: Capabilities) -> bool:
    """Whether ``caps`` is a CPU with 16 SIMD registers (AVX2, SSE), whose tiles are narrow."""
    return 0 < caps.vector_registers < 32


def register_tiles(caps: Capabilities) -> RegisterTiles:
    """``NARROW_TILE`` and ``NARROW_WIDE_TILE`` in register-wide vectors on a CPU with 16 SIMD
    registers (AVX2, SSE), else the tiles measured on AVX-512 in the widest vectors."""
    widths = caps.vector_widths
    if few_registers(caps):
        narrow = tuple(w for w in widths if w <= caps.register_lanes) or widths[-1:]
        return RegisterTiles(narrow, NARROW_TILE, NARROW_WIDE_TILE, NARROW_WIDE_TILE[0])
    return RegisterTiles(widths, (VECTOR_TILE[0], 2), WIDE_TILE, WIDE_FEW_ROWS)


def wide_plan(k: LoopKernel, c: Contraction, plan: VectorPlan, tiles: RegisterTiles
              ) -> VectorPlan | None:
    """``tiles.wide``'s columns in place of the default ``plan`` (the caller takes the rows,
    ``tiles.wide_rows``) where the right operand loads as vectors and that many vectors tile
    its run with little waste, else None (a row-less contraction's tile has one row: nothing
    to trade)."""
    if not c.rows:
        return None
    n_run = prod(k.domain[i][1] for i in plan.run)
    rows, vectors = tiles.wide  # vector_plan reads the columns only
    tile_n = vectors * plan.width
    if plan.right is None or n_run < tile_n or \
            -(-n_run // tile_n) * tile_n > WIDE_MAX_WASTE * n_run:
        return None
    if plan.wrapped and -(-n_run // tile_n) * prod(k.domain[i][1] for i in c.batch) < \
            WRAPPED_WIDE_MIN_TILES:
        return None
    wide = vector_plan(k, c, (rows, tile_n), False, tiles.widths, wrap=True)
    return wide if wide is not None and wide.right is not None else None


def swapped_plan(k: LoopKernel, c: Contraction, tile: tuple[int, int] | None,
                 tiles: RegisterTiles) -> tuple[Contraction, VectorPlan, int] | None:
    """The operands of ``c`` exchanged: the left operand's axes as vector columns (its values
    gathered lane by lane, or packed into panels), ``tile`` (rows, columns) or the device's
    default columns with as many rows (``SWAP_ROWS``) as waste the fewest, nearest the
    default's; with the contraction, its column plan and the rows a tile. None where the left
    operand has no axes of its own or is a fused producer (AGO)."""
    if not c.rows or operand_has_reduction(c.left) or operand_has_reduction(c.right):
        return None
    swapped = c.swapped()
    want = tile or tiles.default_tile()
    plan = vector_plan(k, swapped, want, False, tiles.widths)
    if plan is None:
        return None
    n_rows = prod(k.domain[i][1] for i in swapped.rows)
    rows = tile[0] if tile else min(
        SWAP_ROWS, key=lambda r: (-(-n_rows // r) * r, abs(r - tiles.default[0])))
    return swapped, plan, min(rows, n_rows)


def swaps_by_default(k: LoopKernel, c: Contraction, plan: VectorPlan | None,
                     caps: Capabilities) -> bool:
    """Whether the default exchanges the operands on a CPU with 32 SIMD registers (where it
    was measured): where ``plan``'s vectors read the right operand in place but waste columns
    (``SWAP_MIN_WASTE``), the left operand is constants only (its panels are then packed
    once), and the exchanged tiles compute fewer points, by ``SWAP_MIN_SAVED`` reduction
    points an output point or over a left operand of ``SWAP_MIN_LEFT_BYTES``."""
    tiles = register_tiles(caps)
    if plan is None or plan.right is None or not c.rows or few_registers(caps) or \
            not caps.simd_within_work_item or extent(c.reduce) < SWAP_MIN_REDUCTION or \
            not set(operand_buffers(c.left)) <= k.constants:
        return False
    columns_waste = _waste(k, plan.run, plan.tile_n)
    if columns_waste <= SWAP_MIN_WASTE:
        return False
    other = swapped_plan(k, c, None, tiles)
    if other is None:
        return False
    swapped, columns, rows = other
    before = _waste(k, c.rows, tiles.default[0]) * columns_waste
    after = _waste(k, swapped.rows, rows) * _waste(k, columns.run, columns.tile_n)
    left_bytes = 4 * extent(c.reduce) * prod(k.domain[i][1] for i in c.rows + c.batch)
    return after < before and ((before - after) * extent(c.reduce) >= SWAP_MIN_SAVED or
                               left_bytes >= SWAP_MIN_LEFT_BYTES)


def _waste(k: LoopKernel, axes: tuple[int, ...], tile: int) -> float:
    """Points tiles of ``tile`` compute along ``axes`` over the points there are."""
    n = prod(k.domain[i][1] for i in axes)
    return -(-n // tile) * tile / n


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


def vector_epilogue(k: LoopKernel, c: Contraction, plan: VectorPlan, masks: bool = False,
                    aligned: bool = False) -> list[tuple[Buffer, sympy.Expr, Expr]] | None:
    """(output, flat store offset, flat value) for each output when all store ``width``
    lanes contiguously and have a vector form, else None. With ``masks``, a condition on
    the column (a padded AveragePool's count of valid taps) becomes a lane mask. With
    ``aligned`` (every vector starts at a multiple of the width), the run need only be
    contiguous a vector at a time (``flatten_offset_aligned``): a projection whose output is
    split into heads and transposed, ``(s, h, d)`` stored at ``(h, s, d)``."""
    run = [k.domain[i] for i in plan.run]
    offset = flatten_offset(k.store_offset, run, plan.flat)
    if offset is None or offset.coeff(plan.flat) != 1:
        offset = flatten_offset_aligned(k.store_offset, run, plan.flat, plan.width) \
            if aligned else None
    if offset is None:
        return None
    syntax, keep = vector_syntax(plan.width), frozenset({c.reduce})
    out = []
    for buf, st in zip(k.outputs, k.stores):
        value = flatten_axes(st.value, run, plan.flat, keep)
        if value is None or not vectorizable(value, plan.flat, syntax, guarded=masks, lanes=keep):
            return None
        out.append((buf, offset, value))
    return out


def column_plan(k: LoopKernel, c: Contraction, tile: tuple[int, ...], full_columns: bool,
                widths: tuple[int, ...], caps: Capabilities) -> VectorPlan | None:
    """``vector_plan``'s contiguous run; where the right operand has none, on a CPU, a run it
    reads every second float of (a stride-2 conv's patches, ``kg_vload_even``) if that run
    takes vectors of ``STRIDE2_MIN_LANES``. Such a conv then packs its patches in its tiles,
    or reads them in place, instead of writing a patch matrix for a second kernel."""
    plan = vector_plan(k, c, tile, full_columns, widths, wrap=True)
    if plan is None or plan.right is not None or full_columns or \
            not caps.simd_within_work_item:
        return plan
    strided = vector_plan(k, c, tile, False, widths, stride2=True)
    if strided is None or strided.right is None or strided.width < STRIDE2_MIN_LANES:
        return plan
    return strided


def vector_plan(k: LoopKernel, c: Contraction, tile: tuple[int, ...], full_columns: bool,
                widths: tuple[int, ...], producer: bool = False, stride2: bool = False,
                wrap: bool = False) -> VectorPlan | None:
    """The widest contiguous run of trailing column axes the right operand reads, and the
    vector width (one of ``widths``, the device's) and tile that fit it; None when no run has
    as many columns as the narrowest width (scalar template).
    ``full_columns`` (AGO) needs one tile spanning every column; ``producer`` lets the right
    operand hold a reduction (AGO's producer as the vector operand); ``stride2`` lets it read
    every second column (the 'window' schedule's strided convs). With ``wrap``, a longer run
    whose reads are contiguous but guarded per axis (a padded conv's patches over the whole
    output map, each lane testing its own row and column: ``flatten_axes``'s ``wrap``)
    replaces the run found so where its tiles compute fewer column vectors (``_vectors``)."""
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
    plan = _fitted(k, run, right, flat, tile, full_columns, widths)
    if not (wrap and WRAP_RUNS) or full_columns:
        return plan
    # the runs longer than the one found, longest first (none found: two axes at least)
    for start in range(len(cols) - len(run) if right is not None else len(cols) - 1):
        longer = tuple(cols[start:])  # (image, rows, columns) is not contiguous: (rows, cols)
        merged = flatten_axes(c.right, [k.domain[i] for i in longer], flat, wrap=True)
        if merged is None or not vectorizable(merged, flat, syntax, guarded=True,
                                              reductions=producer, wrapped=True):
            continue
        wrapped = _fitted(k, longer, merged, flat, tile, False, widths)
        if wrapped is not None and (plan is None or plan.right is None or
                                    _vectors(k, c, wrapped) < _vectors(k, c, plan)):
            return replace(wrapped, wrapped=True)
        break
    return plan


def _fitted(k: LoopKernel, run: tuple[int, ...], right: Expr | None, flat: sympy.Symbol,
            tile: tuple[int, ...], full_columns: bool, widths: tuple[int, ...]
            ) -> VectorPlan | None:
    """``vector_plan``'s width and tile for the run ``run``."""
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


def _vectors(k: LoopKernel, c: Contraction, plan: VectorPlan) -> int:
    """The column vectors ``plan``'s tiles compute a row, the last tile of each run shifted
    back included (its overlap computed twice): 16 -> 64 at 55x55 in tiles of two 16-lane
    vectors computes 4 an output row along the row, 190 over the merged map's 3025 columns;
    14x14, 8 lanes along a row (2 a row) or 16 over the map, 28 against 14."""
    n_run = prod(k.domain[i][1] for i in plan.run)
    runs = prod(k.domain[i][1] for i in c.cols if i not in plan.run)
    return runs * -(-n_run // plan.tile_n) * plan.tile_n // plan.width
