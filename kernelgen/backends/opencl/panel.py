"""Attention's keys as a transposed panel in local memory: the 'row' schedule of a staged score
row (``lower/staging.py``) on a CPU, when the row's keys are read along the depth.

A score row ``S[i, r] = sum_d Q[i, d] K[r, d]`` with the Transpose of K fused reads K
contiguously along the depth (the reduction) and with a stride along the keys (the row's
vector lanes). Without a panel, each vector of scores is a dot product per lane folded across
the lanes (``c/dots.py``), and every work-item of 8 queries reads all of K again. Here a
work-item takes many queries (``item_rows``, by default every query of a head where that
leaves work enough for every core): it first transposes the keys it reads into a panel in
local memory, ``panel[d * stride + r] = K[r, d]``, ``width x width`` blocks at a time in
registers (``c/vector.read_transposed``), then each score vector is a sum over the depth of a
query's scalar times a panel row of keys: one multiply-add a step, no folds, the panel read
once for ``group_rows`` queries. Rows are padded (``PAD``) so that rows a power of two apart
do not fall into the same few L1 sets.

Hand-written first and timed against the dot products in one run (bench/attention_panel.py,
docs/benchmarks.md "Attention with K transposed into a panel"): 1.93-1.99x on Intel's CPU
runtime, 1.20-1.39x on PoCL, attention at 8x256x64, 12x128x64 and 4x512x64.

``choose`` (for ``schedule.choose``) finds the read and the queries a work-item takes,
``rewrite`` makes the score row read the panel, and ``print_items`` prints the work-item.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import sympy

from ...dtypes import DType
from ...ir.expr import Axis, Expr, Load, Reduce, free_index_symbols, transform, walk
from ...ir.loop import Buffer, LoopKernel, Staged
from ...lower.transpose import stride
from ...shapes import prod
from ..base import Capabilities
from ..c.emitter import CEmitter
from ..c.vector import read_transposed
from ..printer import Scope
from .columns import few_registers
from .language import Launch, vector_syntax

NAME = "kg_panel"  # the panel's identifier: no tensor's starts with kg_ (c_idents)
PAD = 16  # floats after each panel row (unpadded 256-float rows: bench/attention_panel.py)
# A work-item takes as many queries as leave this many work-items a compute unit; fewer than
# MIN_ROWS queries would transpose the keys again for too few score rows
ITEMS_PER_UNIT = 2
MIN_ROWS = 16
# Two vectors of keys a step, 2 x group_rows accumulators, with 32 vector registers (AVX-512):
# each query scalar then serves two multiply-adds
KEY_VECTORS = 2


@dataclass(frozen=True)
class KeyPanel:
    """The keys ``load`` of the staged score row (its symbol ``row``, ``keys`` long) summed
    over ``depth``, transposed into ``buffer`` (rows of ``stride`` floats, one per depth
    point); each work-item computes ``item_rows`` points of the innermost group axis."""

    load: Load
    row: sympy.Symbol
    depth: Axis
    keys: int
    stride: int
    item_rows: int
    vectors: int = 1  # vectors of keys a score step computes (``CEmitter.row_vectors``)

    @property
    def buffer(self) -> Buffer:
        return Buffer(NAME, (self.depth[1] * self.stride,), DType.float32)


def key_read(loop: LoopKernel) -> tuple[Load, sympy.Symbol, Axis, int] | None:
    """The first read of a staged row that a panel serves: a float32 load inside a one-axis
    sum, contiguous along the sum's axis and strided along the row, unguarded, and free of the
    innermost group axis (the queries, whose work-items share it). Returns it with the row's
    symbol, the sum's axis and the row's extent."""
    if not loop.group:
        return None
    split = loop.domain[loop.group[-1]][0]
    allowed = {s for g, (s, _) in enumerate(loop.domain) if g in loop.group and s != split}
    for st in loop.staged:
        for node in walk(st.value):
            if not (isinstance(node, Reduce) and node.kind == "sum" and len(node.axes) == 1):
                continue
            (d, n), = node.axes
            for load in walk(node.body):
                if not isinstance(load, Load) or load.dtype is not DType.float32 or \
                        load.guard is not sympy.true or load.data:
                    continue
                offset = sympy.expand(load.offset)
                if stride(offset, d) == 1 and stride(offset, st.row) not in (None, 0, 1) and \
                        free_index_symbols(load) <= allowed | {d, st.row}:
                    return load, st.row, (d, n), st.buffer.numel
    return None


def row_choices(loop: LoopKernel, group_rows: int) -> list[int]:
    """The queries a work-item may take with a panel: multiples of ``group_rows`` dividing the
    innermost group axis."""
    n = loop.domain[loop.group[-1]][1]
    return [m for m in range(group_rows, n + 1, group_rows) if n % m == 0]


def default_rows(loop: LoopKernel, group_rows: int, caps: Capabilities) -> int:
    """The most queries a work-item takes that leave ``ITEMS_PER_UNIT`` work-items per compute
    unit (the fewest when none does)."""
    choices = row_choices(loop, group_rows)
    n = loop.domain[loop.group[-1]][1]
    others = prod(loop.domain[g][1] for g in loop.group[:-1])
    wanted = ITEMS_PER_UNIT * (caps.compute_units or 1)
    return max((m for m in choices if others * (n // m) >= wanted), default=choices[0])


def choose(loop: LoopKernel, found: tuple[Load, sympy.Symbol, Axis, int] | None,
           caps: Capabilities, group_rows: int, width: int, requested: bool | None,
           rows: int | None) -> KeyPanel | None:
    """The panel a 'row' kernel reads its keys (``found``: ``key_read(loop)``) from, or None.
    By default on a CPU (a work-item a thread) where the panel fits the device's local memory
    and a work-item takes at least ``MIN_ROWS`` queries; ``requested`` True asks for it
    (``ValueError`` naming why it cannot), False refuses it; ``rows`` sets the queries a
    work-item takes."""
    why = None
    if found is None:
        why = ("needs a staged score row reading its keys along the summed depth "
               "(Q Kᵀ with the Transpose of K fused)")
    else:
        load, row, depth, keys = found
        pitch = -(-keys // width) * width + PAD
        if keys < 2 * width:
            why = f"needs a row of at least {2 * width} keys (two vectors), got {keys}"
        elif caps.local_memory is None or 4 * depth[1] * pitch > caps.local_memory:
            why = (f"needs {4 * depth[1] * pitch} bytes of local memory for the panel; the "
                   f"device has {caps.local_memory}")
    if why is not None or requested is False:
        if requested:
            raise ValueError(f"kernel '{loop.name}': panel {why}")
        if rows is not None:
            raise ValueError(f"kernel '{loop.name}': panel_rows applies where the keys are "
                             f"read from a panel (panel=True)")
        return None
    choices = row_choices(loop, group_rows)
    if rows is not None and rows not in choices:
        raise ValueError(f"kernel '{loop.name}': panel_rows must be one of {choices} "
                         f"(multiples of group_rows={group_rows} dividing the innermost group "
                         f"axis), got {rows}")
    item_rows = rows if rows is not None else default_rows(loop, group_rows, caps)
    if requested is None and (item_rows < MIN_ROWS or not caps.simd_within_work_item):
        return None
    vectors = 1 if few_registers(caps) else KEY_VECTORS
    return KeyPanel(load, row, depth, keys, pitch, item_rows, vectors)


def rewrite(loop: LoopKernel, plan: KeyPanel) -> LoopKernel:
    """``loop`` with the staged rows reading the keys from the panel."""
    d = plan.depth[0]
    panel = Load(DType.float32, NAME, d * plan.stride + plan.row, sympy.true)

    def visit(node: Expr, recurse: object) -> Expr | None:
        return panel if node == plan.load else None

    staged = tuple(Staged(st.buffer, st.row, transform(st.value, visit)) for st in loop.staged)
    return replace(loop, staged=staged)


def print_items(em: CEmitter, plan: KeyPanel, width: int, ndrange: Callable[..., Launch],
                index: Scope, body: Scope) -> tuple[Scope, Launch]:
    """The NDRange over work-items of ``plan.item_rows`` queries into ``index`` (the printer's
    ``ndrange``), the panel filled into ``body``, and the loop over the work-item's queries
    opened there; returns the loop's body, where the group body goes, and the launch."""
    k, t = em.kernel, em.index_t
    split = k.domain[k.group[-1]][0]
    plan_rows = em.group_plan
    outer = plan_rows.outer_of.get(split, split) if plan_rows is not None else split
    rows = len(plan_rows.copies) if plan_rows is not None else 1
    per = plan.item_rows // rows  # iterations of the outer symbol a work-item runs
    axes = em.group_axes()
    item = sympy.Symbol("kg_item")
    em.symbol_names[item] = "kg_item"
    axes = [(item, n // per) if s == outer else (s, n) for s, n in axes]
    index.add(f"__local float {NAME}[{plan.buffer.numel}];")
    launch = ndrange(axes, index)
    fill(em, plan, width, body)
    if not any(s == item for s, _ in axes):  # the split took the whole axis: one pass
        return body, launch
    body.add(f"for ({t} kg_q = 0; kg_q < {per}; ++kg_q) {{")
    inner = body.child()
    inner.add(f"const {t} {em.symbol_names[outer]} = kg_item * {per} + kg_q;")
    return inner, launch


def fill(em: CEmitter, plan: KeyPanel, width: int, scope: Scope) -> None:
    """The keys transposed into the panel: ``width x width`` blocks read as vectors along the
    depth and transposed in registers, the edges the blocks leave point by point."""
    v, t = vector_syntax(width), em.index_t
    (d, depth), keys = plan.depth, plan.keys
    r0, d0, r, dd = (sympy.Symbol(n) for n in ("kg_r0", "kg_d0", "kg_r", "kg_d"))
    whole_keys, whole_depth = keys - keys % width, depth - depth % width
    scope.add("// the keys this work-item's score rows read, transposed into the panel")
    if whole_keys and whole_depth:
        scope.add(f"for ({t} kg_r0 = 0; kg_r0 < {whole_keys}; kg_r0 += {width})")
        scope.add(f"for ({t} kg_d0 = 0; kg_d0 < {whole_depth}; kg_d0 += {width}) {{")
        block = scope.child()
        columns = read_transposed(em, v, block, plan.load, (plan.row, r0), (d, d0))
        for c, name in enumerate(columns):
            off = em.index((d0 + c) * plan.stride + r0)
            block.add(v.store.format(v=name, ptr=NAME, off=off))
        scope.add("}")
    value = em.index(plan.load.offset.xreplace({plan.row: r, d: dd}))
    edges = [(whole_keys, keys, 0, depth)] if whole_keys < keys else []
    if whole_depth < depth:
        edges.append((0, whole_keys, whole_depth, depth))
    for r_start, r_stop, d_start, d_stop in edges:
        if r_start >= r_stop:
            continue
        scope.add(f"for ({t} kg_r = {r_start}; kg_r < {r_stop}; ++kg_r)")
        scope.add(f"for ({t} kg_d = {d_start}; kg_d < {d_stop}; ++kg_d)")
        scope.child().add(f"{NAME}[kg_d * {plan.stride} + kg_r] = "
                          f"{em.buffer_load(em.buffers[plan.load.buffer], value)};")
