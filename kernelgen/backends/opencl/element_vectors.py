"""Elementwise kernels as explicit vectors: each work-item stores ``VECTORS_PER_ITEM`` runs of
a vector of consecutive points of the innermost axis (``CEmitter.vector_stores``), the axis's
last partial chunk point by point. For a CPU runtime whose compiler vectorises poorly across
work-items: ``relu(x + y)`` over 401408 floats ran at 45 GB/s one point per work-item and
85-88 GB/s with a ``float16`` per work-item on Intel's CPU runtime, where Debian's PoCL 3.1,
which vectorises a work-group's items itself, ran 65-70 against 59-61 GB/s (Sapphire Rapids,
2 cores). So a device takes them where a probe measured them faster
(``probe.elementwise_gain``, ``device.probed_elementwise``), or where the schedule option
``vectors`` asks.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import sympy

from ...ir.loop import LoopKernel
from ...lower import unroll
from ..base import Capabilities
from ..c.emitter import CEmitter
from ..c.vectorizable import vector_columns_ok
from ..printer import Scope
from .language import Launch, vector_syntax


WIDEST = 16  # float16: one AVX-512 register
# runs of a vector per work-item: an operand broadcast along the axis (SE scaling's sigmoid of
# a channel's gate) is computed once per run; on Intel's CPU runtime 4 float16 runs ran SE
# scaling at 144x56x56 2.00x and 672x14x14 3.17x the points' speed, one run 1.35x and 1.39x
# (residual adds: 1.29-1.38x either way); PoCL 0.96-1.04x with 4
VECTORS_PER_ITEM = 4


@dataclass(frozen=True)
class ElementVectors:
    """``count`` runs of ``floatN`` points a work-item along the innermost domain axis."""

    width: int
    count: int = 1


def choose(loop: LoopKernel, caps: Capabilities, requested: bool | None
           ) -> ElementVectors | None:
    """The plan where ``requested`` (or, unless it is False, the device's measurement) asks for
    it and every store vectorises along the innermost axis, which the output is contiguous
    along; ``requested`` True where it cannot apply raises ``ValueError`` naming the kernel."""
    if requested is False or (requested is None and not caps.explicit_elementwise):
        return None
    width = max((w for w in caps.vector_widths if w <= WIDEST), default=0)
    ok = width > 1 and bool(loop.domain) and _contiguous(loop) and \
        vector_columns_ok(loop, vector_syntax(width), guarded=False)
    if requested and not ok:
        raise ValueError(f"kernel '{loop.name}': vectors needs float32 outputs stored "
                         f"contiguously along the innermost axis, which every value can be "
                         f"computed along as vectors (at least {2 * max(width, 2)} points)")
    return ElementVectors(width, VECTORS_PER_ITEM) if ok else None


def scheduled(sched: Any, caps: Capabilities, requested: bool | None) -> Any:
    """``sched``, an 'elementwise' schedule, with a vector of points a work-item where
    ``choose`` takes it: not beside a tile, an unroll or interleaved stores (its points share
    loads, or it transposes or weaves its reads), for which ``requested`` True raises."""
    loop = sched.loop
    plan = choose(loop, caps, requested) if sched.plan is None and sched.tile is None and \
        sched.unroll == unroll.none(loop) else None
    if plan is not None:
        return replace(sched, vectors=True, vector_width=plan.width, plan=plan)
    if requested:
        raise ValueError(f"kernel '{loop.name}': vectors does not combine with its tile, "
                         f"unroll or interleaved stores (its points share loads, or it "
                         f"transposes or weaves its reads)")
    return sched


def _contiguous(loop: LoopKernel) -> bool:
    last = loop.domain[-1][0]
    return sympy.expand(loop.store_offset).coeff(last) == 1


def print_kernel(em: CEmitter, plan: ElementVectors, ndrange: Callable[..., Launch],
                 index: Scope, body: Scope) -> Launch:
    """Work-items over the outer axes and chunks of ``count`` vectors of the innermost one;
    ``ndrange`` is the printer's."""
    k, t, w = em.kernel, em.index_t, plan.width
    size = w * plan.count
    last, n = k.domain[-1]
    chunk = sympy.Symbol("kg_chunk")
    em.symbol_names[chunk] = "kg_chunk"
    launch = ndrange([*k.domain[:-1], (chunk, -(-n // size))], index, explicit_vectors=True)
    index.add(f"const {t} kg_own = kg_chunk * {size};  // the chunk's first point")
    em.vector = vector_syntax(w)
    em.symbol_names[last] = em.fresh("i")
    em.vector_stores((last, n), body, "kg_own", f"min(kg_own + {size}, ({t}){n})", None,
                      em.store_list())
    return launch
