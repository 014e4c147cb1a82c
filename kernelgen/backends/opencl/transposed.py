"""The register-transposed tile of an elementwise kernel (``lower/transpose.py``,
``c/transposed_tile.py``) on OpenCL: a work-item covers width x width points of the output's
contiguous axis (the lanes) and the axis a remapped input is contiguous along (the rows). When
it applies and with which width (``choose``, for ``schedule.choose``), and the NDRange over the
tiles (``print_kernel``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.transpose import TransposedReads
from ..base import Capabilities
from ..c.emitter import CEmitter
from ..c.transposed_tile import print_tile, vector_plan
from ..printer import Scope
from .language import Launch, vector_syntax

# Measured on PoCL for relu(transpose(x) + b) at 2048x2048, hand-written, three rounds beside a
# busy core (copy 0.72 ms): 8x8 tiles in 16x16 work-groups 1.17-1.27 ms, 4x4 1.9-2.0, 16x16
# 1.3-2.8; one point a work-item 8.4-13 ms. Dimension 0 of the work-group is at most
# GROUP_WIDTH tiles wide, so a group spans as many tiles along the rows as along the lanes
# (256 wide: 1.8-4.6 ms).
DEFAULT_WIDTH = 8
GROUP_WIDTH = 16


def choose(loop: LoopKernel, caps: Capabilities, tile: tuple[int, ...] | None,
           unroll_given: Any) -> tuple[tuple[int, int] | None, TransposedReads | None]:
    """The tile an elementwise ``loop`` reports and the plan it runs (None: one point a
    work-item, or ``unroll``'s several). By default the transposed tile where the kernel has
    remapped reads and no ``unroll`` is given, at ``DEFAULT_WIDTH``; ``tile=(w, w)`` asks for
    width ``w``, ``tile=(1, 1)`` for none."""
    if tile is not None and tuple(tile) == (1, 1):  # reported only where a tile could run
        return ((1, 1) if tile_plan(loop, caps) else None), None
    if tile is None:
        width = next((w for w in caps.vector_widths if w <= DEFAULT_WIDTH), 0)
        plan = tile_plan(loop, caps, width) if width and unroll_given is None else None
        return ((width, width) if plan else None), plan
    width = tile[0]
    plan = tile_plan(loop, caps, width) if tile[0] == tile[1] else None
    if plan is None:
        choices = [w for w in caps.vector_widths if tile_plan(loop, caps, w)]
        raise ValueError(
            f"kernel '{loop.name}': an elementwise tile is a square of the device's vector "
            f"widths, transposing an input read along another axis than the output's "
            f"contiguous one in registers; " + (
                f"this kernel takes tile (w, w) for w in {choices} or (1, 1) (one point a "
                f"work-item), got {tuple(tile)}" if choices else
                f"this kernel has no such read in a vector form (or an axis shorter than a "
                f"vector), got tile {tuple(tile)}"))
    if unroll_given is not None and tuple(unroll_given) != unroll.none(loop):
        raise ValueError(f"kernel '{loop.name}': unroll and a transposed tile are two ways "
                         f"to cover several points; give one")
    return (width, width), plan


def tile_plan(loop: LoopKernel, caps: Capabilities, width: int | None = None
              ) -> TransposedReads | None:
    """The remapped reads of ``loop`` when it runs as transposed tiles of ``width`` (any of
    the device's vector widths when None): float32 outputs, and every store with a vector
    form along the output's contiguous axis once the remapped loads are vectors."""
    for w in caps.vector_widths if width is None else (width,):
        plan = vector_plan(loop, vector_syntax(w)) if w in caps.vector_widths else None
        if plan is not None:
            return plan
    return None


def print_kernel(em: CEmitter, plan: TransposedReads, width: int,
                 ndrange: Callable[..., Launch], index: Scope, body: Scope) -> Launch:
    """The NDRange over tiles into ``index`` (the printer's ``ndrange``: dimension 0 along
    the lanes, 1 along the rows, the other axes on 2), and the tile into ``body``."""
    k, w = em.kernel, width
    (_, n_a), (_, n_b) = k.domain[plan.lanes], k.domain[plan.rows]
    ta, tb = sympy.Symbol("kg_ta"), sympy.Symbol("kg_tb")  # tile positions
    em.symbol_names.update({ta: "kg_ta", tb: "kg_tb"})
    others = [ax for p, ax in enumerate(k.domain) if p not in (plan.lanes, plan.rows)]
    launch = ndrange([*others, (tb, -(-n_b // w)), (ta, -(-n_a // w))], index,
                     dim0_max=GROUP_WIDTH)
    index.add(f"const {em.index_t} kg_a0 = {w} * kg_ta;")
    index.add(f"const {em.index_t} kg_b0 = {w} * kg_tb;")
    print_tile(em, plan, vector_syntax(w), body)
    return launch
