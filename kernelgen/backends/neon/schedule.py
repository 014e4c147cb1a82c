"""NEON schedules, chosen here (``choose``) and printed by ``emit.py``:

- ``tiled``: a contraction as ``float32x4_t`` register tiles with ``vfmaq_n_f32``
  (contraction.c.tmpl); from ``PACK_B_MIN_BYTES`` of right operand it is packed into ``tn``-wide
  panels a cache-sized block at a time (``pack``, ``pack_block_kib``: contraction_packed.c.tmpl),
  each block consumed by L2-sized blocks of row tiles before the next is packed. The packed
  operand is the one that loads as vectors along its columns: a conv's patches rather than its
  weights, so the pack is the im2col.
- ``columns``: reductions computed per element (a depthwise conv's window) as one vector
  accumulator per run of four output columns, loads through padding as vectors
  (``columns_plan``).
- ``row``: one group point at a time, its reductions scalar or vectorised along their own axis;
  a staged kernel takes several group points (queries) per iteration (``group_rows``).
- ``elementwise``: the outer axes in parallel, the innermost as vectors with a scalar tail.

Threads: OpenMP ``parallel for`` over the parallel axes (the group axes of a reduction, the outer
axes of an elementwise kernel, or chunks of a 1-D one). OpenMP because it is in every GCC,
including the static AArch64 cross toolchain the qemu check uses, and its static schedule costs
one barrier per kernel; a hand-rolled pool would add code and no speed at this grain.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...ir.expr import free_index_symbols
from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.contraction import Contraction, contraction, operand_buffers, operand_has_reduction
from ...lower.transpose import TransposedReads
from ...shapes import prod
from ..base import (PRIVATE, Capabilities, Config, Schedule, check_derived, check_options,
                    option_names)
from ..c.contraction import FLAT_K, flat_reduction
from ..c.vectorizable import columns_plan as vector_columns_plan, vectorizable
from . import transposed
from .language import VECTOR

KINDS = ("elementwise", "tiled", "columns", "row")
# Below this many output elements a kernel runs on one thread (OpenMP start-up costs more),
# unless it computes this many operations (a reduction per element): a depthwise 3x3/2 conv of
# ReLU6 to 576x7x7 (28224 elements, 1.0 M operations) ran 0.18 ms on 2 threads, 0.34 on one
PARALLEL_MIN_ELEMENTS = 1 << 15
PARALLEL_MIN_OPERATIONS = 1 << 18
CHUNK = 1 << 14  # elements per parallel chunk of a 1-D elementwise kernel
DEFAULT_TILE = (4, 8)
AGO_MAX_COLUMNS = 64  # an AGO producer's consumer takes one column tile up to this many
# Pack the right operand of a contraction into per-tile panels above this size. Measured with
# the row-blocked tile order (GFLOP/s, 4x16 tiles, unpacked -> packed): 256^3 59 -> 101,
# 512^3 40 -> 99, 1024^3 31 -> 103. Packed 2048^3 went 64 -> 86-104 with the row blocks.
PACK_B_MIN_BYTES = 256 << 10
# ... and below that wherever two row tiles or more read a right operand that loads as no
# vector along its columns (Q Kᵀ with K's Transpose fused: a lane at a time), as on OpenCL.
# SIMDe on x86, 4x128x64: 0.111 ms packed against 0.134 gathered (0.096 with Kᵀ contiguous).
# The packed template sweeps the column panels with blocks of row tiles whose left-operand rows
# fit in this much cache (half a typical L2), so neither operand streams from memory per tile.
ROW_BLOCK_BYTES = 512 << 10
# ... and packs the panels in blocks of this many bytes, each consumed by the tiles while it is
# in cache (MegEngine's cache-sized im2col blocks) instead of the whole operand before any tile.
PACK_BLOCK_BYTES = 512 << 10
# At most this many channels of a packed AGO producer are computed together
# (``contraction_holes``'s ``k_group``). Conv3x3+ReLU -> 1x1, 32 channels at 56x56, ms, fused
# against the two kernels: 1 channel 4.1 / 1.4, 4: 2.1 / 1.3, 8: 1.31-1.35 / 1.34-1.37,
# 16: 1.23-1.26 / 1.35-1.40, 32: 2.35 / 1.34 (more accumulators than registers).
PRODUCER_GROUP = 16


@dataclass(frozen=True)
class NeonSchedule(Schedule):
    pack_block_kib: int | None = None  # packed: KiB of panels packed, then consumed, at a time
    # private plans: the contraction with its packed (vector) operand on the right, the
    # producer channels a pack step computes, panels a block packs, row tiles a block sweeps
    contraction: Contraction | None = field(default=None, repr=False, compare=False,
                                            metadata=PRIVATE)
    k_group: int = field(default=1, metadata=PRIVATE)
    pack_panels: int = field(default=0, metadata=PRIVATE)
    row_block: int = field(default=0, metadata=PRIVATE)
    threads: bool = field(default=False, metadata=PRIVATE)  # OpenMP over the parallel axes
    # 'elementwise' with remapped reads: 4 x 4 register-transposed tiles (``transposed.py``)
    transposed: TransposedReads | None = field(default=None, repr=False, compare=False,
                                               metadata=PRIVATE)
    chunk: int = field(default=CHUNK, metadata=PRIVATE)  # a 1-D kernel's elements a chunk

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        k, c = self.loop, self.contraction
        if k.staged:  # each staged producer row once per group point (lower/staging.py)
            out.update(staged_rows=[st.buffer.name for st in k.staged], producer_redundancy=1.0)
        if self.transposed is not None:  # read along rows, transposed in registers
            out["transposed_reads"] = sorted({load.buffer for load in self.transposed.loads})
        if c is not None and self.tile is not None:
            # the buffers the right operand (the one packed, if any) reads
            out.update(producer_redundancy=_recomputed(k, c, self.tile, bool(self.pack)),
                       right_operand_reads=operand_buffers(c.right))
            if self.pack:
                out.update(packed_operand_reads=out["right_operand_reads"],
                           pack_panels=self.pack_panels)
        return out


OPTIONS = option_names(NeonSchedule)
DERIVED = ("index_type", "vector_width")


def choose(loop: LoopKernel, options: Mapping[str, Any], caps: Capabilities) -> NeonSchedule:
    """The schedule of ``loop``: the options given, checked, and defaults for the rest."""
    check_options("NEON", options, OPTIONS, NeonSchedule)
    caps.check(loop)
    requested = options.get("schedule")
    if requested is not None and requested not in KINDS:
        raise ValueError(f"kernel '{loop.name}': NEON schedule must be one of {KINDS}, "
                         f"got {requested!r}")
    tile = options.get("tile")
    if tile is not None and (len(tile) != 2 or tile[0] < 1 or tile[1] < 4 or tile[1] % 4) \
            and tuple(tile) != (1, 1):  # (1, 1): an elementwise kernel without transposed tiles
        raise ValueError(f"NEON tiles need (rows >= 1, columns a multiple of 4), got {tile}")
    kib = options.get("pack_block_kib")
    if kib is not None and kib < 1:
        raise ValueError(f"kernel '{loop.name}': pack_block_kib must be at least 1, got {kib}")
    base = NeonSchedule("row", "int64_t" if loop.needs_long_index else "int", loop,
                        vector_width=caps.vector_width,
                        threads=loop.numel >= PARALLEL_MIN_ELEMENTS or
                        loop.flops() >= PARALLEL_MIN_OPERATIONS)
    c = contraction(loop) if requested in (None, "tiled") else None
    if requested == "tiled" and c is None:
        raise ValueError("schedule 'tiled' needs a contraction (one sum of a product of "
                         "operands on disjoint output axes)")
    if c is not None:
        if options.get("group_rows") not in (None, 1):
            raise ValueError(f"group_rows applies to the 'row' schedule; kernel "
                             f"'{loop.name}' runs 'tiled'")
        sched = _tiled(base, c, tile, options.get("pack"), kib)
    else:
        sched = _untiled(base, requested, options.get("group_rows"), tile,
                         options.get("row_vectors"))
    if options.get("row_vectors") not in (None, 1) and sched.kind != "row":
        raise ValueError(f"row_vectors applies to the 'row' schedule; kernel '{loop.name}' "
                         f"runs {sched.kind!r}")
    check_derived(sched, options, DERIVED)
    return sched


def _untiled(base: NeonSchedule, requested: str | None, group_rows: int | None,
             tile: tuple[int, ...] | None = None, row_vectors: int | None = None
             ) -> NeonSchedule:
    """'columns', 'row' or 'elementwise', and the loop each prints; an elementwise kernel with
    remapped reads as transposed tiles (``tile`` (4, 4), the default, or (1, 1): none); a
    staged 'row' with ``group_rows`` points and ``row_vectors`` vectors a step."""
    loop = base.loop
    # a contraction takes the tiles: no need to plan columns for it
    columns = columns_plan(loop) if requested in (None, "columns") else None
    if requested == "columns" and columns is None:
        raise ValueError(f"kernel '{loop.name}' cannot run schedule 'columns', which needs "
                         f"reductions computed per element and every store as float32 vectors "
                         f"along the last axis (contiguous or padded loads, at least "
                         f"{2 * VECTOR.width} columns)")
    if columns is not None:
        kind, printed = "columns", columns
    elif loop.grouped:
        kind, printed = "row", loop
    else:  # elementwise: the outer axes are the parallel ones
        kind, printed = "elementwise", replace(loop, group=tuple(range(len(loop.domain) - 1)))
    if requested == "elementwise" and kind != "elementwise":
        raise ValueError(f"kernel '{loop.name}' reduces: it cannot run 'elementwise'")
    if kind == "elementwise":
        found = transposed.plan(loop)
        given = None if tile is None else tuple(tile)
        if given not in (None, (1, 1)) and (given != (4, 4) or found is None):
            raise ValueError(
                f"kernel '{loop.name}': an elementwise tile on NEON is (4, 4), transposing an "
                f"input read along another axis than the output's contiguous one in "
                f"registers, or (1, 1) for none; " + (
                    f"got {given}" if found is not None else
                    f"this kernel has no such read in a vector form (or an axis shorter than "
                    f"4), got tile {given}"))
        if found is not None and given != (1, 1):
            return replace(base, kind=kind, tile=(4, 4), transposed=found)
    # a staged kernel's 'row' schedule: several group points (queries) per iteration
    rows = unroll.choose_group_rows(printed, group_rows, share=True)
    vectors = unroll.choose_row_vectors(printed, row_vectors, registers=True) \
        if kind == "row" else None  # AArch64: 32 vector registers
    return replace(base, kind=kind, loop=printed, group_rows=rows if loop.staged else None,
                   row_vectors=vectors)


def _tiled(base: NeonSchedule, c: Contraction, tile: tuple[int, int] | None,
           pack: bool | None, kib: int | None) -> NeonSchedule:
    k = base.loop
    if not _loads_rows_as_vectors(k, c) and _loads_rows_as_vectors(k, c.swapped(), producer=True):
        # the right operand is the one packed and loaded in vectors along its columns: a conv's
        # patches (x[..., ow + kw]) rather than its weights (w[m, c, kh, kw]); an AGO producer
        # (conv3x3 -> 1x1) as vector accumulators, each packed element once
        if pack is None and operand_has_reduction(c.left):
            pack = True
        c = c.swapped()
    n_rows = prod(k.domain[i][1] for i in c.rows)
    n_cols = prod(k.domain[i][1] for i in c.cols)
    tm, tn = min((tile or DEFAULT_TILE)[0], n_rows), (tile or DEFAULT_TILE)[1]
    if tile is None and operand_has_reduction(c.left) and n_cols <= AGO_MAX_COLUMNS:
        tn = -(-n_cols // 4) * 4  # AGO: one column tile, each producer element once
    k_extent = prod(n for _, n in c.reduce.axes)
    if pack is None:  # measured: packing pays from 256^3 up, and for a gathered operand
        gathered = not operand_has_reduction(c.right) and not _loads_rows_as_vectors(k, c)
        pack = 4 * k_extent * prod(k.domain[i][1] for i in c.cols + c.batch) > \
            PACK_B_MIN_BYTES or (gathered and n_rows > tm)
    sched = replace(base, kind="tiled", tile=(tm, tn), pack=pack, contraction=c)
    if not pack:
        return sched
    # a packed producer (AGO) computes several of its channels at once: their sums share each
    # input load and run as independent chains (one would wait on each FMA)
    ranges = {**k.ranges, **dict(k.domain)}
    grouped = operand_has_reduction(c.right) and \
        FLAT_K in free_index_symbols(flat_reduction(c, c.right, ranges))
    groups = -(-k_extent // PRODUCER_GROUP)
    kib = kib or PACK_BLOCK_BYTES >> 10
    panels = prod(k.domain[i][1] for i in c.batch) * -(-n_cols // tn)
    return replace(sched, pack_block_kib=kib,
                   k_group=-(-k_extent // groups) if grouped else 1,  # even groups, none wasted
                   pack_panels=min(panels, max(1, (kib << 10) // (4 * tn * k_extent))),
                   row_block=min(-(-n_rows // tm), max(1, ROW_BLOCK_BYTES // (4 * tm * k_extent))))


def _recomputed(k: LoopKernel, c: Contraction, tile: tuple[int, ...], pack: bool) -> float:
    """How often a fused producer element is computed: once per column tile in the left
    operand, once per row tile in an unpacked right one."""
    times = 1.0
    if operand_has_reduction(c.left):
        times = float(-(-prod(k.domain[i][1] for i in c.cols) // tile[1]))
    if operand_has_reduction(c.right) and not pack:
        times = float(-(-prod(k.domain[i][1] for i in c.rows) // tile[0]))
    return times


def columns_plan(kernel: LoopKernel) -> LoopKernel | None:
    """``c.vectorizable.columns_plan`` in NEON's four lanes."""
    return vector_columns_plan(kernel, VECTOR)


def _loads_rows_as_vectors(kernel: LoopKernel, c: Contraction, producer: bool = False) -> bool:
    """Whether ``c``'s right operand loads as float32 vectors along its last column axis
    (``producer``: computes so, a fused producer's reduction as vector accumulators)."""
    if not c.cols:
        return False
    sym = kernel.domain[c.cols[-1]][0]
    return vectorizable(c.right, sym, VECTOR, frozenset(kernel.hoisted), guarded=True,
                        reductions=producer)


def search_space(loop: LoopKernel) -> list[Config]:
    """The tunables worth measuring for ``loop``, the default first."""
    c = contraction(loop)
    if c is not None:  # register tiles; columns in whole float32x4
        tiles = [Config.of(tile=t, pack=p) for p in (False, True)
                 for t in ((4, 8), (8, 8), (4, 16), (6, 8), (2, 16), (1, 4))]
        # packed blocks a quarter and 4x the default's cache footprint
        tiles += [Config.of(tile=t, pack=True, pack_block_kib=kib)
                  for t in ((4, 8), (4, 16)) for kib in (128, 2048)]
        # AGO: the default tile spans the producer once; most others recompute it
        return [Config.of(), *tiles] if operand_has_reduction(c.left) else tiles
    if columns_plan(loop) is not None:  # windows in vector lanes, or one at a time
        return [Config.of(), Config.of(schedule="row")]
    if loop.staged:  # queries per iteration, sharing the loads of keys and values, and the
        # vectors of a row a step computes where it sums products of its own
        vectors = [Config.of(row_vectors=v) for v in unroll.row_vector_choices(loop)]
        return [Config.of(), *(Config.of(group_rows=r)
                               for r in unroll.group_row_choices(loop)), *vectors]
    if transposed.plan(loop) is not None:  # transposed tiles, or one point at a time
        return [Config.of(), Config.of(tile=(1, 1))]
    return [Config.of()]  # nothing else to tune (the vector width is the hardware's)
