"""OpenCL schedules: which one runs a kernel, with which tiles, packing, work-group and unrolling,
chosen here (``choose``) and printed by ``emit.py``. The constants carry the measurements that
set them.

- ``elementwise``: one work-item per domain point on a 1-3-D NDRange; the innermost domain axis
  is dimension 0 so neighbouring work-items touch neighbouring elements (PoCL vectorises across
  them), and merged axes keep integer division out of the index. Where neighbouring points
  share loads, each work-item computes several (``unroll``, ``lower/unroll.py``). Where an
  input is read along another axis than the output's contiguous one (a fused transpose,
  ``lower/transpose.py``), each work-item covers a ``tile`` of width x width points, transposed
  in registers, so that reads and writes are both whole vectors (``transposed.py``). Where the
  output's rows interleave copies of the inputs' (Winograd's output transform, upsampling), on
  a CPU, each copy is a vector, interleaved in registers into the stores (``interleaved.py``).
  Otherwise, on a CPU whose compiler vectorises poorly across work-items (as its probe measured,
  ``probe.elementwise_gain``) or with ``vectors``, each work-item stores runs of a vector of
  points (``element_vectors.py``).
- ``group``: one work-group per group point; hoisted reductions are computed cooperatively
  (strided partial results, then a tree in ``__local`` memory), then the same work-items write the
  group's elements: single-kernel softmax, layer-norm-like blocks, reductions over long axes.
- ``item``: one work-item per group point, reducing serially; for short reductions over many
  groups, where SIMD lanes across groups beat a tree.
- ``row``: one work-item per group point with explicit ``float8`` loops along a contiguous
  reduced axis. A CPU device runs a work-group on one core anyway, so this beats ``group`` there
  (2.4 ms vs 13 ms for a 1024x4096 softmax on PoCL); chosen when the capabilities say so.
  A staged score row reading its keys along the summed depth (Q Kᵀ with the Transpose of K
  fused) reads them from a transposed panel in local memory that each work-item fills once for
  many queries (``panel.py``).
- ``tiled``: a contraction (GEMM, implicit-GEMM conv, Winograd's batched GEMM, AGO's fused
  pairs) as register tiles of rows x float16 column vectors (contraction*.cl.tmpl), its right
  operand read in place or packed into panels first (``pack``; ``pack_in_tile``: by each column
  tile's own work-item); read in place, in work-groups of row tiles or, where the left operand
  is the large one, of one row tile's column tiles (``group_columns``). Over a small map a 1x1
  conv's lanes run along its output channels instead of its pixels (``swap_operands``).
- ``window``: a sliding-window contraction with no rows (a depthwise or grouped conv): each
  work-item owns a few output rows (``window_rows``) and the whole row as vectors, reading each
  input row once for all of them (window.cl.tmpl).
- ``columns``: on a CPU, 'item' kernels whose output elements each reduce on their own (LRN):
  a chunk of the last axis a work-item, each element's reduction a lane of a vector
  accumulator (``element_columns.py``; ``c.vectorizable.columns_plan``, as NEON's 'columns').
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import sympy

from ...dtypes import DType
from ...ir.expr import Expr, extent, free_index_symbols
from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.contraction import (Contraction, operand_buffers, operand_has_reduction,
                                  producer_redundancy)
from ...lower.staging import shared_terms_only, unstage
from ...lower.transpose import TransposedReads
from ...shapes import prod
from ..base import (PRIVATE, Capabilities, Schedule, check_derived, check_options,
                    option_names)
from ..c.contraction import FLAT_K, flat_reduction
from ..c.vectorizable import vector_reduction_ok
from . import element_vectors, interleaved, staged, transposed
from .columns import (RegisterTiles, VectorPlan, column_plan, opencl_contraction,
                      register_tiles, swapped_plan, swaps_by_default, vector_plan, wide_plan)
from .element_columns import COLUMNS_LOCAL, columns_or_refuse, opencl_columns
from .element_vectors import ElementVectors
from .language import VECTOR
from .panel import KeyPanel
from .window import WINDOW_LOCAL, WINDOW_MAX_RUN, WindowPlan, is_pooling, opencl_window
from .window import scheduled as window_scheduled

KINDS = ("elementwise", "group", "item", "row", "tiled", "window", "columns")
STAGED_KINDS = ("item", "row")  # a staged row is an array of one work-item
# PoCL runs a work-group as one thread's loop over work-items; groups of 256 vectorise well and
# tiny groups (16) run 2-3x slower (docs/toolchain.md, OpenCL). At most the device's limit.
DEFAULT_LOCAL = 256
# Measured on PoCL (python -m kernelgen and bench/): 65536 rows of 64 run 1.3x faster with one
# work-item per row; 1024 rows of 4096 run 2.3x faster with one work-group per row.
GROUP_REDUCE_MIN = 512  # reductions at least this long use the cooperative 'group' schedule
ITEM_UNROLL_MAX = 32  # 'item' reductions up to this many points unroll completely
GROUP_FEW = 64  # with fewer groups than this, 'item' would leave most SIMD lanes idle
# ... unless the reductions are shorter than this: a group would give each work-item one or two
# terms, and PoCL 3.1's work-group compiler ran for over half an hour on such a kernel (a
# softmax/pad/reduce-max/softmax chain over 3x3x2, tests/backend/test_opencl_schedules.py)
GROUP_FEW_REDUCE_MIN = 16
AGO_MAX_COLUMNS = 64  # widest register tile a fused-producer contraction takes by default
# The vector operand's producer channels computed together, at most (the largest divisor of
# the reduction's extent up to this): conv3x3+ReLU -> 1x1, 32 channels at 56x56, hand-edited
# from the generated kernel and timed side by side: 1 channel 1.27-1.37 ms, 2: 0.74-0.87,
# 4: 0.45-0.57, 8: 0.42-0.62, 16: 0.47-0.48. A prime count takes a group that does not divide
# it, the last step shifted back (11 channels: 0.255 ms in groups of 6 against 0.591 one by
# one; 13: 0.274 in groups of 7 against 0.711; generated kernels, timed alternately).
AGO_PRODUCER_GROUP = 8
# most consumer rows one tile spans when the producer is the vector operand: one sum vector a
# row, so 32 rows fill AVX-512's registers. With more rows (a 1x1 conv's 144 output channels),
# the default register tile's rows a tile, and each column tile's work-item computes its
# producer columns once into a panel that its row tiles then sweep (``pack_in_tile``).
AGO_MAX_ROWS = 32
# The vector template unrolls its reduction completely only while the unrolled body has at
# most this many vector FMAs (tile rows x vectors x reduction points). A window's taps gain from
# it (constant offsets and guards: depthwise 3x3 and 5x5, 1 row x 2 vectors, 2.2-2.5x faster
# unrolled); a register tile of 8 rows x 2 vectors over 16-32 channels lost 1.5-2.3x, PoCL
# hoisting the unrolled loads past the 32 vector registers (2240 spills in a 256x32x1024 GEMM,
# none rolled); up to 128 FMAs was even. Both forms timed in one process on PoCL; the 1x1
# convolutions in bench/conv1x1.py ("reduction unrolled": 1.7-2.1x slower on 16-32 channels).
UNROLL_K_MAX_FMAS = 64
SCALAR_TILE = (4, 4)  # the scalar template's (outputs other than float32)
SCALAR_MAX_LOCAL = 64
VECTOR_LOCAL = 4
UNROLLED_LANES = 16  # work-group width multiple for work-items that compute several points
PACK_LOCAL = 16  # the packing launch's work-group
# The right operand packed in panels by a first kernel (pack_panels.cl.tmpl), hand-edited from the
# generated 2048^3 GEMM and timed side by side: 326-333 GFLOP/s against 176-181 reading its rows
# (packing the left operand too: no faster). 1024^3: 197 against 179. Generated, 6x64 tiles,
# packed against in place: 1024x512x1024 3.77 against 6.01 ms, 512x1024x512 1.90 / 2.97,
# 64x1024x1024 0.69 / 0.91; 768^3 2.95 / 2.74 and 512^3 0.95-1.00 / 0.87-1.06 (about even).
PACK_MIN_ROW_TILES = 4  # row tiles that read each panel, at least, for the pass to pay
PACK_MIN_BYTES = 1 << 20
# ... but a right operand contiguous along no output column (Q Kᵀ: K's rows run along the
# reduction; a Gemm's transB) is otherwise gathered a lane at a time by every row tile: packed
# whenever two row tiles read it, or once when it is constant. bench/nt_products.py on PoCL
# (AMD EPYC), packed against gathered, two runs: attention scores 1.09-1.66x faster (1.06-1.21x
# the time with Kᵀ given contiguous), Gemm transB by constant weights 1.37-2.26x.
# Each column tile's work-item packing its own panel, then sweeping every row tile over it while
# it is in cache (contraction_tile_pack.cl.tmpl, one launch), against a first kernel packing
# every panel: im2col of a 3x3 64->64 conv at 56x56 (8x32 tiles, 74 KiB panels), generated and
# hand-merged, alternating in one process, three runs: 1.11/1.11/1.10 ms against 1.27/1.18/1.17;
# GEMM 2048^3 (6x64, 512 KiB panels) 345 against 339 GFLOP/s, 1024^3 and 512^3 within the noise.
# It needs enough column tiles to keep every core busy, and panels that fit a core's L2.
PACK_TILE_MIN_ITEMS = 16
PACK_TILE_MAX_BYTES = 1 << 20
PACK_TILE_LOCAL = 2
# A right operand of constants only (a MatMul's weights) is packed by the first kernel at the
# first launch and not again while later launches pass the same buffers (``Launch.pack_once``):
# MatMul + bias + ReLU on BERT's and prime shapes 1.10-1.35x faster than packing at every
# launch, in the tile or in a first kernel (AMD EPYC, PoCL; bench/packed_weights.py); so any
# size is packed: below PACK_MIN_BYTES 0.98-1.14x faster than in place (its --in-place, 2 runs)
PACK_CONSTANTS_ONCE = True
# A work-group of column tiles (``group_columns``), measured on PoCL (AMD EPYC, AVX2, 512 KiB of
# L2 a core), 1x1 convs + ReLU with 6x16 tiles in 4-item groups, against groups of row tiles in
# the same process: with weights of 1-4 MiB over 7x7 and 14x14 maps (512->2048, 2048->512,
# 320->1280, 256->1024) 1.07-1.66x faster in pairs round-robin, 0.99-1.12x among five
# variants (bench/conv1x1.py); under 1 MiB (464->464, 160->960 at 7x7) within 2 %; 1024->256
# at 14x14, whose operands are about equal, 1.1-1.5x slower (docs/benchmarks.md).
GROUP_COLUMNS_MIN_RATIO = 4  # the left operand this many times the right one, at least
GROUP_COLUMNS_MIN_BYTES = 1 << 20  # and this large (beyond a core's L2)


@dataclass(frozen=True)
class TilePlan:
    """A 'tiled' kernel's contraction as its template runs it: ``contraction`` with the vector
    operand on the right (maybe swapped), the column plan (None: the scalar template), the
    vector template's operands reading the reduction through the flat ``kg_k`` where they can
    (the scalar template's holes derive their own), the producer channels one reduction step
    computes (AGO; 1 otherwise), and whether the reduction loop unrolls completely (a short one
    over plain operands)."""

    contraction: Contraction
    columns: VectorPlan | None
    left: Expr = field(compare=False)
    right: Expr | None = field(compare=False)
    producer_group: int = 1
    unroll_k: bool = False


@dataclass(frozen=True)
class OpenCLSchedule(Schedule):
    pack_in_tile: bool | None = None  # each column tile's work-item packs its own panel
    # 'tiled' in place: a work-group holds column tiles of one row tile (they share its rows of
    # the left operand) instead of row tiles of one column tile (sharing a right panel)
    group_columns: bool | None = None
    # 'tiled': the lanes along the left operand's axes instead (a 1x1 conv's output channels, not
    # its pixels), that operand packed into panels (once, when it is constants)
    swap_operands: bool | None = None
    unroll: tuple[int, ...] | None = None  # 'elementwise': domain points a work-item computes
    interleave: bool | None = None  # 'elementwise': copies as vectors, woven into the stores
    vectors: bool | None = None  # 'elementwise': a vector of points a work-item (on a CPU)
    window_rows: int | None = None  # 'window': rows of the outer axis a work-item owns
    # 'row' with a staged score row: its keys read from a transposed panel in local memory
    # (``panel.py``), each work-item computing ``panel_rows`` queries
    panel: bool | None = None
    panel_rows: int | None = None
    plan: TilePlan | WindowPlan | TransposedReads | interleaved.Interleaved | ElementVectors | \
        KeyPanel | None = field(default=None, repr=False, compare=False, metadata=PRIVATE)
    # serial reduction loops up to this many points unroll completely ('item')
    unroll_loops: int = field(default=0, metadata=PRIVATE)
    # 'tiled': the constants (weights) a packed operand reads, when it reads nothing else: its
    # first kernel packs it once, not at every launch; empty otherwise
    pack_once: tuple[str, ...] = field(default=(), metadata=PRIVATE)

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        k = self.loop
        if k.staged:  # each staged producer row once per group point (lower/staging.py)
            out.update(staged_rows=[st.buffer.name for st in k.staged], producer_redundancy=1.0)
        if isinstance(self.plan, TransposedReads):  # read along rows, transposed in registers
            out["transposed_reads"] = sorted({load.buffer for load in self.plan.loads})
        if isinstance(self.plan, interleaved.Interleaved):  # copies woven into vector stores
            out["interleaved_stores"] = self.plan.factor
        if isinstance(self.plan, KeyPanel):  # keys transposed once per work-item
            out["key_panel_reads"] = self.plan.load.buffer
        if isinstance(self.plan, ElementVectors):  # a vector of points a work-item
            out["vector_points"] = self.plan.width
        if isinstance(self.plan, TilePlan):
            c, tile_n = self.plan.contraction, self.tile[1] if self.tile else 1
            if self.pack is not None:  # the vector template: the operand it packs, or not
                out["right_operand_reads"] = operand_buffers(c.right)
                if self.pack:
                    out["packed_operand_reads"] = out["right_operand_reads"]
                    out["packed_once"] = bool(self.pack_once)
            if self.plan.columns is not None and operand_has_reduction(c.right):
                out["producer_redundancy"] = 1.0 if self.pack_in_tile else \
                    float(-(-_rows(k, c) // self.tile[0]))
            else:
                out["producer_redundancy"] = producer_redundancy(k, tile_n)
        return out


OPTIONS = option_names(OpenCLSchedule)
DERIVED = ("index_type", "vector_width")


def choose(loop: LoopKernel, options: Mapping[str, Any], caps: Capabilities) -> OpenCLSchedule:
    """The schedule of ``loop``: the options given, checked, and defaults for the rest."""
    check_options("OpenCL", options, OPTIONS, OpenCLSchedule)
    caps.check(loop)
    local = options.get("local_size")
    if local is not None and not (isinstance(local, int) and 1 <= local <= (
            caps.max_work_group or local)):
        raise ValueError(f"kernel '{loop.name}': local_size must be an int from 1 to "
                         f"{caps.max_work_group} (the device's work-group limit), got {local!r}")
    tile = options.get("tile")
    if tile is not None and (len(tile) != 2 or min(tile) < 1):
        raise ValueError(f"kernel '{loop.name}': tile must be (rows, columns), both positive, "
                         f"got {tile!r}")
    # a staged shared term (a softmax's exp row) pays on a CPU's 'row' schedule only
    if shared_terms_only(loop) and not (options.get("schedule") in (None, "row") and
                                        caps.simd_within_work_item and
                                        row_vectorizable(loop, caps)):
        loop = unstage(loop)
    kind = _kind(loop, options.get("schedule"), tile is not None, caps)
    base = OpenCLSchedule(kind, "long" if loop.needs_long_index else "int", loop,
                          local_size=local or default_local(caps))
    _check_applies(loop, kind, options)
    if kind == "elementwise":
        given, weave = options.get("unroll"), options.get("interleave")
        square, plan = transposed.choose(loop, caps, tile, given)
        woven = interleaved.choose(loop, caps, weave, given, tile) \
            if weave or not (square and plan) else None
        if woven is not None:
            sched = replace(base, unroll=woven.factors, vector_width=woven.width, plan=woven,
                            interleave=True, local_size=local or interleaved.LOCAL)
        elif square and plan:
            sched = replace(base, tile=square, vector_width=square[0], plan=plan)
        else:
            sched = replace(base, tile=square, unroll=_unroll(loop, given))
        sched = element_vectors.scheduled(sched, caps, options.get("vectors"))
    elif kind == "window":
        sched = window_scheduled(base, options.get("window_rows"),
                                 local or min(WINDOW_LOCAL, default_local(caps)), caps)
    elif kind in STAGED_KINDS:
        sched = replace(base, **staged.decisions(loop, kind, options, caps))
    elif kind == "tiled":
        sched = _tiled(base, tile, local, options.get("pack"), options.get("pack_in_tile"),
                       caps, options.get("group_columns"), options.get("swap_operands"))
    elif kind == "group":
        sched = replace(base, local_size=group_local(loop, base.local_size, caps))
    elif kind == "columns":
        printed, width = columns_or_refuse(loop, caps)
        sched = replace(base, loop=printed, vector_width=width, local_size=local or COLUMNS_LOCAL)
    else:
        sched = base
    if kind == "item":
        # a short 'item' reduction unrolled is straight-line code PoCL vectorises across
        # work-items (depthwise 3x3, 128x56x56: 0.4-0.6 ms against 4-6 ms with a barrier per tap)
        sched = replace(sched, unroll_loops=ITEM_UNROLL_MAX)
    check_derived(sched, options, DERIVED)
    return sched


def _kind(loop: LoopKernel, requested: str | None, tile_explicit: bool,
          caps: Capabilities) -> str:
    """The schedule ``requested``, checked, or the default for ``loop``."""
    if not loop.grouped:
        if requested not in (None, "elementwise"):
            raise ValueError(f"kernel '{loop.name}' reduces nothing: it runs the "
                             f"'elementwise' schedule, not {requested!r}")
        return "elementwise"
    if requested is not None:
        if requested not in KINDS[1:]:
            raise ValueError(f"schedule must be one of {KINDS[1:]}, got {requested!r}")
        if loop.staged and requested not in STAGED_KINDS:
            raise ValueError(f"kernel '{loop.name}' stages a producer row per group point, "
                             f"which runs on the {STAGED_KINDS} schedules, not {requested!r}")
        if requested == "row" and not row_vectorizable(loop, caps):
            raise ValueError("schedule 'row' needs every hoisted reduction to run over one "
                             "contiguous float32 axis, and a device that builds float vectors")
        if requested == "tiled" and opencl_contraction(loop, caps.vector_widths) is None:
            raise ValueError("schedule 'tiled' needs a contraction: one sum of a product of "
                             "operands on disjoint output axes")
        if requested == "window" and opencl_window(loop, caps.vector_widths) is None:
            raise ValueError(f"schedule 'window' needs a short sum of products whose one "
                             f"operand has no axis of its own (a depthwise conv), or a pooling "
                             f"window, reading a run of at most {WINDOW_MAX_RUN} output columns "
                             f"as vectors; kernel '{loop.name}' has none")
        if requested == "columns":
            columns_or_refuse(loop, caps)
        return requested
    if loop.staged:  # a work-item holds the row: one per group point
        return "row" if caps.simd_within_work_item and row_vectorizable(loop, caps) else "item"
    window = opencl_window(loop, caps.vector_widths)
    # a pooling window only where a work-item is a SIMD thread: a GPU's 'item' already gives
    # each output its own thread (not measured there)
    if window is not None and not tile_explicit and \
            (caps.simd_within_work_item or not is_pooling(window.contraction)):
        return "window"
    if opencl_contraction(loop, caps.vector_widths) is not None:
        return "tiled"
    if caps.simd_within_work_item and row_vectorizable(loop, caps):
        return "row"
    longest = max(extent(r) for r in loop.hoisted)
    few_groups = prod(loop.domain[g][1] for g in loop.group) < GROUP_FEW
    if longest >= GROUP_REDUCE_MIN or (few_groups and longest >= GROUP_FEW_REDUCE_MIN):
        return "group"
    # on a CPU, explicit vectors across the elements' own reductions ('item' leaves them to
    # PoCL's lanes, which load tap by tap under guards)
    return "columns" if caps.simd_within_work_item and opencl_columns(loop, caps) else "item"


def row_vectorizable(loop: LoopKernel, caps: Capabilities) -> bool:
    """Whether every hoisted reduction runs as explicit vectors ('row') on the device."""
    return bool(caps.vector_widths) and all(vector_reduction_ok(r, VECTOR) for r in loop.hoisted)


def default_local(caps: Capabilities) -> int:
    """The work-group size a schedule aims at: ``DEFAULT_LOCAL``, within the device's limit."""
    return min(DEFAULT_LOCAL, caps.max_work_group or DEFAULT_LOCAL)


def group_local(loop: LoopKernel, local: int, caps: Capabilities) -> int:
    """A 'group' kernel's work-group: ``local`` items, fewer when its reduction scratch (one
    value per item and hoisted reduction type, ``emit._group``) would not fit the device's
    local memory."""
    if caps.local_memory is None:
        return local
    per_item = sum({r.dtype: r.dtype.compute.itemsize for r in loop.hoisted}.values()) or 4
    fits = max(1, caps.local_memory // per_item)
    return max(1, min(local, fits))


def _check_applies(loop: LoopKernel, kind: str, options: Mapping[str, Any]) -> None:
    """Options of a schedule other than ``kind`` are refused, naming the schedule they need."""
    unroll_given = options.get("unroll")
    if unroll_given is not None and tuple(unroll_given) != unroll.none(loop) and \
            kind != "elementwise":
        raise ValueError(f"unroll applies to the 'elementwise' schedule; kernel "
                         f"'{loop.name}' runs '{kind}'")
    for name, needs in (("interleave", "elementwise"), ("vectors", "elementwise"),
                        ("window_rows", "window"), ("panel", "row"), ("panel_rows", "row"),
                        ("row_vectors", "row"),
                        ("group_columns", "tiled"), ("swap_operands", "tiled")):
        if options.get(name) is not None and kind != needs:
            raise ValueError(f"{name} applies to the '{needs}' schedule; kernel "
                             f"'{loop.name}' runs '{kind}'")
    if options.get("group_rows") not in (None, 1) and kind not in STAGED_KINDS:
        raise ValueError(f"group_rows applies to the {STAGED_KINDS} schedules; kernel "
                         f"'{loop.name}' runs '{kind}'")


def _unroll(loop: LoopKernel, requested: Any) -> tuple[int, ...]:
    """Several domain points per work-item where they share loads (``lower/unroll.py``)."""
    if requested is None:
        return unroll.plan(loop)
    unroll.check(loop, tuple(requested))
    return tuple(requested)


# --- 'tiled' ----------------------------------------------------------------------------------

def _tiled(base: OpenCLSchedule, requested: tuple[int, ...] | None, local: int | None,
           pack: bool | None, pack_in_tile: bool | None, caps: Capabilities,
           group_columns: bool | None = None, swap: bool | None = None) -> OpenCLSchedule:
    """The contraction's template, operand order, tile, packing and work-group."""
    k = base.loop
    widths = caps.vector_widths
    c = opencl_contraction(k, widths)
    assert c is not None
    # sums in vectors (float32 outputs, on a device that builds float vectors)
    vector_columns = bool(widths) and all(b.dtype is DType.float32 for b in k.outputs)
    explicit = requested is not None
    registers = register_tiles(caps) if vector_columns else None
    tile = tuple(requested) if requested is not None else \
        registers.default_tile() if registers is not None else SCALAR_TILE
    # AGO: with a producer reduction inside the left operand and no explicit tile, one column
    # tile covers every column so no producer element is computed twice
    full_columns = not explicit and operand_has_reduction(c.left) and \
        prod(k.domain[i][1] for i in c.cols) <= AGO_MAX_COLUMNS
    rows: int | None = None
    plan = None
    if swap and registers is None:
        raise ValueError(f"kernel '{k.name}': swap_operands applies to the vector template "
                         f"(float32 outputs on a device that builds float vectors)")
    swapped = False
    if registers is not None:
        c, plan, rows, swapped = _vector_columns(k, c, tile, explicit, full_columns, pack,
                                                 swap, registers, caps)
    if plan is None:  # the scalar template
        if group_columns is not None:
            raise ValueError(f"kernel '{k.name}': group_columns applies to the vector "
                             f"template (float32 outputs on a device that builds float "
                             f"vectors); this kernel runs the scalar one")
        tm = min(tile[0], _rows(k, c))
        tn = _cols(k, c) if full_columns else min(tile[1], _cols(k, c))
        # the template's holes read the operands themselves (``contraction_holes``)
        return replace(base, tile=(tm, tn),
                       local_size=min(local or default_local(caps), SCALAR_MAX_LOCAL),
                       plan=TilePlan(c, None, c.left, c.right))
    tm = min(rows or tile[0], _rows(k, c))
    tiles_r = -(-_rows(k, c) // tm)
    panel = prod(n for _, n in c.reduce.axes) * plan.tile_n
    n_run = prod(k.domain[i][1] for i in plan.run)
    panels = -(-n_run // plan.tile_n) * prod(k.domain[i][1] for i in c.cols if i not in plan.run) \
        * prod(k.domain[i][1] for i in c.batch)
    if operand_has_reduction(c.right) and pack_in_tile is None and (
            pack or (pack is None and tiles_r > 1)):  # AGO: each column tile's producer once
        pack = pack_in_tile = True
    if pack_in_tile and pack is None:  # pack_in_tile says how; pack=False wins over it
        pack = True
    # constant panels (weights) are packed at the first launch only: not in the tile (each launch)
    reads = operand_buffers(c.right)
    constant = PACK_CONSTANTS_ONCE and set(reads) <= k.constants
    # exchanged operands read the constant one from panels packed once, whatever ``pack`` says
    packed = (swapped and constant) or _packs_right(k, c, pack, tiles_r, panel * panels,
                                                    gathered=plan.right is None,
                                                    constant=constant)
    in_tile = packed and (pack_in_tile if pack_in_tile is not None else not constant and
                          panels >= PACK_TILE_MIN_ITEMS and 4 * panel <= PACK_TILE_MAX_BYTES)
    if packed and not in_tile and operand_has_reduction(c.right):
        raise ValueError(f"kernel '{k.name}': a fused producer (AGO) is packed only by each "
                         f"column tile's work-item (pack_in_tile); a packing kernel would write "
                         f"it whole, as the blocks apart do")
    left = flat_reduction(c, c.left, _ranges(k))
    right = None if plan.right is None else flat_reduction(c, plan.right, _ranges(k))
    if group_columns and packed:
        raise ValueError(f"kernel '{k.name}': group_columns applies to a contraction reading "
                         f"its right operand in place; this one packs it (pack=False to read "
                         f"it in place)")
    if group_columns is None and not packed and caps.simd_within_work_item:
        group_columns = _groups_columns(k, c, tiles_r, panels)
    return replace(base, tile=(tm, plan.tile_n), pack=packed,
                   pack_in_tile=in_tile if packed else None,
                   pack_once=tuple(reads) if packed and constant and not in_tile else (),
                   vector_width=plan.width,
                   group_columns=group_columns if not packed else None,
                   swap_operands=True if swapped else swap,
                   local_size=local or (PACK_TILE_LOCAL if in_tile else VECTOR_LOCAL),
                   plan=TilePlan(c, plan, left, right, _producer_group(c, left, right),
                                 unroll_k=_unrolls(c, tm, plan)))


def _vector_columns(k: LoopKernel, c: Contraction, tile: tuple[int, ...], explicit: bool,
                    full_columns: bool, pack: bool | None, swap: bool | None,
                    registers: RegisterTiles, caps: Capabilities
                    ) -> tuple[Contraction, VectorPlan | None, int | None, bool]:
    """The vector template's operand order, column plan and rows a tile (None: the tile's),
    and whether the operands were exchanged (``swap_operands``, by default where
    ``swaps_by_default``)."""
    # AGO's producer-as-vector tiles keep the widest vectors (measured on AVX-512 only)
    ago = _ago_vector_plan(k, c, tile, explicit, registers.widths)
    if ago is not None:
        if swap:
            raise ValueError(f"kernel '{k.name}': swap_operands applies to a contraction of "
                             f"plain operands; this one computes a fused producer (AGO)")
        return (*ago, False)
    plan = column_plan(k, c, tile, full_columns, registers.widths, caps)
    if (plan is None or plan.right is None) and not operand_has_reduction(c.left):
        # the sum is symmetric: vectorise the left operand's run if it has one
        # (a 1x1 conv reads pixels contiguously but output channels strided)
        swapped = c.swapped()
        other = column_plan(k, swapped, tile, False, registers.widths, caps)
        if other is not None and other.right is not None:
            plan, c = other, swapped
    if swap is None:
        swap = not explicit and pack is not True and swaps_by_default(k, c, plan, caps)
    if swap:
        exchanged = swapped_plan(k, c, (tile[0], tile[1]) if explicit else None, registers)
        if exchanged is None:
            raise ValueError(f"kernel '{k.name}': swap_operands needs a left operand with axes "
                             f"of its own, as many points as a vector at least")
        return (*exchanged, True)
    wide = None if explicit or full_columns or plan is None or \
        not caps.simd_within_work_item else wide_plan(k, c, plan, registers)
    if wide is not None:
        return c, wide, registers.wide_rows(_rows(k, c)), False
    return c, plan, None, False


def _groups_columns(k: LoopKernel, c: Contraction, tiles_r: int, tiles_c: int) -> bool:
    """Whether a work-group holds column tiles of one row tile by default on a CPU (one core
    runs a work-group's items one after another): where the left operand is
    ``GROUP_COLUMNS_MIN_RATIO`` times the right one or more and ``GROUP_COLUMNS_MIN_BYTES`` at
    least (a 1x1 conv's weights over a small map), each row tile's rows of it are then read
    from memory once for all its column tiles, not once per column tile. Not measured on a
    GPU, which keeps row tiles."""
    k_extent = prod(n for _, n in c.reduce.axes)
    left, right = _rows(k, c) * k_extent, _cols(k, c) * k_extent
    return tiles_r > 1 and tiles_c > 1 and left >= GROUP_COLUMNS_MIN_RATIO * right and \
        4 * left >= GROUP_COLUMNS_MIN_BYTES


def _unrolls(c: Contraction, tile_rows: int, columns: VectorPlan) -> bool:
    """Whether the vector template's reduction loop unrolls completely: a short one over plain
    operands whose unrolled body stays within ``UNROLL_K_MAX_FMAS``."""
    points = extent(c.reduce)
    fmas = tile_rows * -(-columns.tile_n // columns.width) * points
    return points <= ITEM_UNROLL_MAX and fmas <= UNROLL_K_MAX_FMAS and \
        not operand_has_reduction(c.right)


def _rows(k: LoopKernel, c: Contraction) -> int:
    return prod(k.domain[i][1] for i in c.rows)


def _cols(k: LoopKernel, c: Contraction) -> int:
    return prod(k.domain[i][1] for i in c.cols)


def _ranges(k: LoopKernel) -> dict[sympy.Symbol, int]:
    """The ranges a printer of ``k`` starts from: every bound symbol and the domain."""
    return {**k.ranges, **dict(k.domain)}


def _ago_vector_plan(k: LoopKernel, c: Contraction, tile: tuple[int, ...], explicit: bool,
                     widths: tuple[int, ...]) -> tuple[Contraction, VectorPlan, int] | None:
    """AGO with the producer as the vector operand: when the producer (a reduction in the
    left operand, e.g. conv3x3 + ReLU before a 1x1 conv) reads a run of its pixels
    contiguously, swap the operands so each work-item computes the producer for ``width``
    pixels at once, in one vector accumulator, and feeds every consumer row (output channel)
    of its tile. The producer is then computed once per row tile; by default one tile spans all
    rows up to ``AGO_MAX_ROWS``, so once in all, and beyond them the default tile's rows sweep
    a panel into which each column tile computed its producer once (``_tiled``). Returns the
    swapped contraction, its column plan and the rows per tile."""
    if not operand_has_reduction(c.left) or operand_has_reduction(c.right):
        return None
    swapped = c.swapped()
    n_rows = _rows(k, swapped)
    if explicit or n_rows > AGO_MAX_ROWS:  # more rows: row tiles over a panel (``_tiled``)
        rows_cols = (tile[0], tile[1])
    else:
        rows_cols = (n_rows, widths[0])  # one vector of columns: the sums stay few
    plan = vector_plan(k, swapped, rows_cols, False, widths, producer=True)
    if plan is None or plan.right is None:
        return None
    return swapped, plan, min(rows_cols[0], n_rows)


def _packs_right(k: LoopKernel, c: Contraction, pack: bool | None, tiles_r: int,
                 packed: int, *, gathered: bool, constant: bool) -> bool:
    """Whether the right operand is laid out in panels first (``pack``; by default when it is
    ``constant``, packed once; when ``PACK_MIN_ROW_TILES`` row tiles or more read one of at
    least ``PACK_MIN_BYTES``; and when two row tiles or more read one ``gathered`` lane by
    lane, contiguous along no output column: the NT product Q Kᵀ). An AGO block's only where
    asked (``_tiled`` asks where its producer is the vector operand over several row tiles),
    never with the producer in the broadcast operand."""
    ago = operand_has_reduction(c.left) or operand_has_reduction(c.right)
    if pack and operand_has_reduction(c.left):
        raise ValueError(f"kernel '{k.name}': pack needs a contraction of plain operands; "
                         f"this one computes a fused producer (AGO) in its broadcast operand, "
                         f"which a pack would materialise")
    if pack is not None or ago:
        return bool(pack)
    if constant or (gathered and tiles_r >= 2):
        return True
    return tiles_r >= PACK_MIN_ROW_TILES and 4 * packed >= PACK_MIN_BYTES


def _producer_group(c: Contraction, left: Expr, right: Expr | None) -> int:
    """Positions of the reduction one step of the vector template computes: for an AGO
    producer as the vector operand, its channels, the largest divisor of their count up to
    ``AGO_PRODUCER_GROUP`` (their sums then share every load of the input window), when both
    operands (``flat_reduction``'s forms) read the reduction through the flat ``kg_k`` alone;
    else 1. Where the largest such divisor is below half the group (a prime count of channels
    above the group), a group from half to all of ``AGO_PRODUCER_GROUP`` that does not divide
    the count: its last step starts at ``kg_k0``, shifted back to stay whole, and weighs the
    positions it repeats by zero."""
    if right is None or not operand_has_reduction(right):
        return 1
    axes = {s for s, _ in c.reduce.axes}
    if FLAT_K not in free_index_symbols(right) or axes & free_index_symbols(left):
        return 1
    k_extent = prod(n for _, n in c.reduce.axes)
    divisor = max(g for g in range(1, AGO_PRODUCER_GROUP + 1) if k_extent % g == 0)
    if divisor >= AGO_PRODUCER_GROUP // 2 or k_extent <= AGO_PRODUCER_GROUP:
        return divisor
    # no divisor that shares loads well (11 or 13 channels): the group whose steps cover
    # the fewest positions, the last step shifted back over channels already summed
    return min(range(AGO_PRODUCER_GROUP, AGO_PRODUCER_GROUP // 2 - 1, -1),
               key=lambda g: -(-k_extent // g) * g)
