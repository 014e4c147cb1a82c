"""NEON C's register-transposed tiles (``c/transposed_tile.py``): an elementwise kernel that
reads an input along another axis than the output's contiguous one (a transpose, NCHW->NHWC, a
reshape around one) runs as 4 x 4 squares, each read as four ``float32x4_t`` rows of the input,
transposed by ``vtrnq_f32``/``vcombine_f32`` and stored as four vectors along the output.

Point by point, such a kernel read one float per cache line at a stride of a whole row: through
SIMDe on a 2-core Sapphire Rapids, a fused ``relu(transpose(x) + b)`` at 2048x2048 took 17.7 ms
against a copy's 1.1, 2.9 as tiles, and NCHW->NHWC of 64x56x56 0.42 ms, 0.07 as tiles
(docs/benchmarks.md, "The suite on NEON C"). An iteration of the parallel loop covers
``BLOCK`` x ``BLOCK`` tiles, so that the 16 input and 16 output cache lines of a 16 x 16 block
are whole before it moves on (in a development script, round-robin: 4 to 16 tiles a side
within 10 % of each other at 2048x2048 and 3072x768, 2 slower by 1.4x and 32 faster by 1.1x).
"""
from __future__ import annotations

import sympy

from ...ir.loop import LoopKernel
from ...lower.transpose import TransposedReads
from ...shapes import prod
from ..c.emitter import CEmitter
from ..c.transposed_tile import print_tile, vector_plan
from ..printer import Scope
from .language import VECTOR

BLOCK = 4  # tiles a side of a loop iteration's block


def plan(loop: LoopKernel) -> TransposedReads | None:
    """The remapped reads of an elementwise ``loop`` when it runs as 4 x 4 transposed tiles
    (``c/transposed_tile.vector_plan`` in NEON's vectors)."""
    return vector_plan(loop, VECTOR)


def print_kernel(em: CEmitter, found: TransposedReads, pragma: str | None, body: Scope) -> None:
    """The loop over blocks of tiles (in parallel under ``pragma``) into ``body``."""
    k, w, t = em.kernel, VECTOR.width, em.index_t
    (_, n_a), (_, n_b) = k.domain[found.lanes], k.domain[found.rows]
    side = w * BLOCK
    bb, ba = sympy.Symbol("kg_bb"), sympy.Symbol("kg_ba")  # block positions
    em.symbol_names.update({bb: "kg_bb", ba: "kg_ba"})
    axes = [ax for p, ax in enumerate(k.domain) if p not in (found.lanes, found.rows)]
    axes += [(bb, -(-n_b // side)), (ba, -(-n_a // side))]
    if pragma:
        body.add(pragma)
    g = em.fresh("g")
    block = em.open_loop(body, g, "0", str(prod(n for _, n in axes)))
    em.decompose(g, axes, block)
    rows = em.open_loop(block, "kg_tb", "0", str(BLOCK))
    rows.add(f"const {t} kg_b0 = {side} * kg_bb + {w} * kg_tb;")
    rows.add(f"if (kg_b0 >= {n_b}) break;")
    lanes = em.open_loop(rows, "kg_ta", "0", str(BLOCK))
    lanes.add(f"const {t} kg_a0 = {side} * kg_ba + {w} * kg_ta;")
    lanes.add(f"if (kg_a0 >= {n_a}) break;")
    print_tile(em, found, VECTOR, lanes)
    em.close_loop(rows)
    em.close_loop(block)
    em.close_loop(body)
