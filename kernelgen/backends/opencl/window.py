"""The 'window' schedule (window.cl.tmpl): a sliding-window contraction with no rows (a
depthwise or grouped conv) or a pooling window (MaxPool) whose work-items each own a few
output rows and the whole row as vectors. When it applies and with which rows
(``opencl_window``), and how it is printed (``print_kernel``)."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

import sympy

from ...dtypes import DType
from ...ir.expr import Call, Const, Expr, IndexCond, Load, extent, walk
from ...ir.loop import Buffer, LoopKernel
from ...ir.substitute import specialise, specialise_index
from ...lower import unroll
from ...lower.contraction import Contraction, operand_has_reduction
from ...shapes import prod
from .. import templates
from ..base import Capabilities
from ..c.emitter import CEmitter
from ..c.vector import VectorPrinter, VectorSyntax, read_together
from ..c.vectorizable import split_guard
from ..printer import Scope
from .columns import (VectorPlan, few_registers, opencl_contraction, vector_epilogue,
                      vector_plan)
from .language import Launch, vector_syntax

# 'window' (window.cl.tmpl), measured on PoCL for a depthwise 3x3 over 128x56x56: 0.078-0.087
# ms against 0.19 for the vector-column tiles; groups of 8 to 128 items within 10% of each other.
WINDOW_MAX_RUN = 128  # the longest run one work-item covers whole (8 float16 vectors)
# Rows a work-item owns by default (on a CPU): the most whose distinct input vectors stay
# within ``WINDOW_MAX_READS``, and never fewer than the largest divisor of the axis up to
# ``WINDOW_ROWS``. More rows read each input row once for more outputs (a 3x3 conv's R rows read
# R + 2 input rows, 2R + 1 at stride 2) and spread an item's fixed work; past the budget its
# vectors spill. Measured on PoCL (Xeon, AVX-512) by bench/window_rows.py, every row count of
# a depthwise 3x3 with ReLU6 read in, round-robin in one run (docs/benchmarks.md): 576x14x14
# stride 2 (7-wide rows, 2 float4) 0.081 ms with 7 rows (90 reads) against 0.159 with 1;
# 960x7x7 0.072 against 0.171; 576x14x14 0.116 (7 rows, 108 reads) against 0.162 (2); but
# 144x56x56 stride 2 0.339 ms with 7 rows (180 reads) against 0.197 with 4 (108), 192x28x28
# stride 2 0.240 (7 rows, 180) against 0.176 (2 rows, 60); 128x56x56 0.144 with 8 rows (120)
# against 0.138 with 7 (108).
WINDOW_ROWS = 4
WINDOW_MAX_READS = 108
WINDOW_MAX_FMAS = 2048  # straight-line code: rows x taps x vectors at most
WINDOW_LOCAL = 32
# A reduction axis of at least this many taps that no two taps share a read along (a grouped
# conv's input channels) runs as a loop around the unrolled rest: ShuffleNet's grouped 1x1 conv
# (136 channels a group, 7x7) unrolled whole took PoCL 64-74 s to compile at its first launch
# and ran in 0.284 ms; as a loop, 2 s and 0.256 ms (68 channels unrolled: 11 s).
WINDOW_LOOP_MIN = 16
# Taps a pooling window may have: its straight-line code is measured on 4-9 tap MaxPools
# (bench/pooling.py); a longer max or sum with no weights (a reduction over channels) keeps
# the 'item' schedule's loop.
POOL_MAX_TAPS = 64


@dataclass(frozen=True)
class WindowPlan:
    """A 'window' kernel's contraction and columns: the run ``columns`` walks as vectors
    starting at ``starts`` (the last one overlaps its neighbour where the run is no multiple
    of the width), ``block`` the domain position of the axis whose points one work-item owns
    several of (None: no axis outside the run), and each output's flat store offset and
    vector epilogue."""

    contraction: Contraction  # row-less: the left operand has no axis of its own
    columns: VectorPlan
    starts: tuple[int, ...]
    block: int | None
    epilogue: tuple[tuple[Buffer, sympy.Expr, Expr], ...]
    # rows of ``block`` a work-item may own: divisors of its extent up to 8 whose copies of the
    # taps stay within the straight-line code budget
    row_choices: tuple[int, ...]
    read_budget_rows: int  # the most rows within ``WINDOW_MAX_READS`` distinct vector reads
    loop: tuple[sympy.Symbol, int] | None = None  # ``tap_loop``: a reduction axis as a loop
    # the input lanes one output lane spans (2: a stride-2 window, which reads every second
    # lane) and, for such a window, the distinct vector reads of each of ``row_choices``
    reads: tuple[int, ...] = ()
    stride: int = 1

    def default_rows(self, caps: Capabilities) -> int:
        """``read_budget_rows`` on a CPU-like device (one work-item a SIMD thread), but for a
        stride-2 window on one with 16 registers (AVX2): the most rows whose reads, counted
        in register-wide pieces, fit ``WINDOW_MAX_READS``, else one. One row on a GPU, which
        wants the work-items (NVIDIA H200, bench/window_rows.py, 144x56x56: 0.021 ms with 1
        row, 0.022 with 2, 0.025 with 4, 0.033 with 7, 0.045 with 8)."""
        if not caps.simd_within_work_item:
            return 1
        if self.stride == 1 or not few_registers(caps):
            return self.read_budget_rows
        # a float16 read at stride 2 spans 32 lanes, four AVX2 registers. Measured there (AMD
        # EPYC, bench/window_rows.py, MobileNetV2's depthwise 3x3 at stride 2): 96x112x112
        # (four float16 a row) 0.68 ms with 1 row against 1.39 with 4; 144x56x56 (four float8)
        # 0.301 with 1 against 0.368 with 4; 192x28x28 (four float4) kept 2 rows (0.182
        # against 0.224 with 1). Stride-1 windows keep the budget and its floor (1-8 rows ran
        # within the noise there but for 1 row, 1.2x slower on 32x112x112).
        pieces = -(-self.columns.width * self.stride // caps.register_lanes)
        return max([1, *(r for r, n in zip(self.row_choices, self.reads)
                         if n * pieces <= WINDOW_MAX_READS)])


@lru_cache(maxsize=256)
def opencl_window(kernel: LoopKernel, widths: tuple[int, ...]) -> WindowPlan | None:
    """The 'window' plan when ``kernel`` is a row-less contraction (one operand has no axis of
    its own: a depthwise conv's weights, or ``pooling``'s constant 1) whose other operand reads
    a run of at most ``WINDOW_MAX_RUN`` output columns as vectors, with a vector epilogue, and
    whose taps times vectors fit the straight-line code budget; else None."""
    c = opencl_contraction(kernel, widths, stride2=True) or pooling(kernel)
    if c is None or c.rows or operand_has_reduction(c.left) or operand_has_reduction(c.right):
        return None
    plan = vector_plan(kernel, c, (1, WINDOW_MAX_RUN), False, widths, stride2=True)
    if plan is None or plan.right is None:
        return None
    n_run = prod(kernel.domain[i][1] for i in plan.run)
    epilogue = vector_epilogue(kernel, c, plan, masks=True)
    if n_run > WINDOW_MAX_RUN or epilogue is None:
        return None
    # two vectors at least where the run allows: a vector as wide as the run has no read
    # inside it to move a lane over at the padded ends (16 columns: two float8)
    w = next((w for w in widths if 2 * w <= n_run), plan.width)
    plan = replace(plan, width=w)
    starts = list(range(0, n_run - w + 1, w))
    if starts[-1] + w < n_run:
        starts.append(n_run - w)
    per_row = extent(c.reduce) * len(starts)
    if per_row > WINDOW_MAX_FMAS:  # a long window: straight-line code
        return None
    outer = [i for i in c.cols if i not in plan.run]
    block = outer[-1] if outer else None
    n = kernel.domain[block][1] if block is not None else 1
    rows = tuple(r for r in range(1, min(n, 8) + 1)
                 if n % r == 0 and r * per_row <= WINDOW_MAX_FMAS)
    least = max(r for r in rows if r <= WINDOW_ROWS)

    @cache  # a stride-2 window asks every choice again below
    def reads(r: int) -> int:
        return len(starts) * distinct_reads(kernel, c, plan, block, r)
    default = next((r for r in reversed(rows) if r <= least or reads(r) <= WINDOW_MAX_READS),
                   least)
    stride = _lanes_spanned(plan)  # every choice's reads, for a stride-2 window's AVX2 rows
    return WindowPlan(c, plan, tuple(starts), block, tuple(epilogue), rows, default,
                      tap_loop(c, plan), tuple(map(reads, rows)) if stride > 1 else (), stride)



def scheduled(base: Any, rows: int | None, local: int, caps: Capabilities) -> Any:
    """``base``, an OpenCL 'window' schedule, with its plan, ``window_rows`` (``rows`` checked
    against the plan's choices, or its default) and work-group ``local``."""
    window = opencl_window(base.loop, caps.vector_widths)
    assert window is not None
    if rows is None:
        rows = window.default_rows(caps)
    elif rows not in window.row_choices:
        raise ValueError(f"kernel '{base.loop.name}': window_rows must be one of "
                         f"{window.row_choices} (divisors of the axis, within the code "
                         f"budget), got {rows}")
    return replace(base, window_rows=rows, local_size=local,
                   vector_width=window.columns.width, plan=window)


def _lanes_spanned(columns: VectorPlan) -> int:
    """Input lanes one output lane of the run spans: the largest stride along the run of the
    vector operand's loads (2 for a stride-2 window)."""
    assert columns.right is not None
    strides = [sympy.expand(n.offset).coeff(columns.flat) for n in walk(columns.right)
               if isinstance(n, Load)]
    return max([1, *(int(s) for s in strides if s.is_Integer)])


def tap_loop(c: Contraction, columns: VectorPlan) -> tuple[sympy.Symbol, int] | None:
    """The longest reduction axis of at least ``WINDOW_LOOP_MIN`` taps that every read of
    both operands takes as a term of its own (``stride * axis``, in no guard, no gathered
    index): unrolled, its taps would share no read unless another axis made up the difference
    (a grouped conv's input channels; not a padded window's rows or columns). None if there
    is none."""
    assert columns.right is not None
    nodes = [n for operand in (c.left, columns.right) for n in walk(operand)]
    for s, n in sorted(c.reduce.axes, key=lambda axis: -axis[1]):
        if n < WINDOW_LOOP_MIN:
            return None
        if all(_term_of_its_own(node, s) for node in nodes):
            return s, n
    return None


def _term_of_its_own(node: Expr, s: sympy.Symbol) -> bool:
    if isinstance(node, IndexCond):
        return s not in node.cond.free_symbols
    if not isinstance(node, Load):
        return True  # index symbols appear in loads and index conditions only
    offset = sympy.expand(node.offset)
    stride = offset.coeff(s)
    return (not node.data and s not in node.guard.free_symbols and stride.is_Integer
            and s not in (offset - stride * s).free_symbols)


def pooling(kernel: LoopKernel) -> Contraction | None:
    """A pooling window (one float32 max, min or sum over taps with no weights: a MaxPool, an
    AveragePool whose every window counts all its taps; not one whose divisor is a second
    reduction; at most ``POOL_MAX_TAPS`` taps) as a row-less contraction whose left operand
    is the constant 1 and whose every output axis is a column; None for anything else.
    The 'window' schedule then combines each tap's vector into the sums with the reduction's
    own operator instead of an FMA."""
    if len(kernel.hoisted) != 1 or len(kernel.group) != len(kernel.domain):
        return None
    r = kernel.hoisted[0]
    if r.kind not in ("sum", "max", "min") or r.dtype is not DType.float32 or \
            extent(r) > POOL_MAX_TAPS or (isinstance(r.body, Call) and r.body.fn == "mul"):
        return None
    return Contraction(r, Const(DType.float32, 1.0), r.body, (), tuple(range(len(kernel.domain))))


def is_pooling(c: Contraction) -> bool:
    """Whether ``c`` is ``pooling``'s form: no left operand to multiply by."""
    return isinstance(c.left, Const)


def distinct_reads(kernel: LoopKernel, c: Contraction, columns: VectorPlan, block: int | None,
                   rows: int) -> int:
    """How many distinct vectors of its input a work-item owning ``rows`` points of ``block``
    reads per vector of its run: the distinct offsets of the vector operand's loads over its
    rows and taps (the emitter reads equal ones once; reads of padding the emitter proves
    never taken are counted too)."""
    if block is None:
        return extent(c.reduce)
    assert columns.right is not None
    loads = [n.offset for n in walk(columns.right) if isinstance(n, Load)]
    factors = tuple(rows if pos == block else 1 for pos in range(len(kernel.domain)))
    copies = unroll.split(kernel, factors).copies
    taps = [dict(zip((s for s, _ in c.reduce.axes), map(sympy.Integer, at)))
            for at in itertools.product(*(range(n) for _, n in c.reduce.axes))]
    return len({tuple(offset.xreplace({**copy, **tap}) for offset in loads)
                for copy in copies for tap in taps})


def print_kernel(em: CEmitter, win: WindowPlan, unrolled: unroll.Unrolled,
                 ndrange: Callable[..., Launch]) -> tuple[str, Launch]:
    """The 'window' kernel of ``win``: each work-item owns the points of ``unrolled``'s
    copies (rows of the block axis) and every column of the run; the taps (but
    ``WindowPlan.loop``'s, a loop around them) and the rows are unrolled, each copy specialised
    to its constants (``ir.substitute.specialise``), so equal reads of different taps and rows
    compare equal: each is read once and added into every sum that uses it. ``ndrange`` is
    the printer's."""
    k = em.kernel
    c, cols = win.contraction, win.columns
    syntax = vector_syntax(cols.width, stride2=True)
    copies = unrolled.copies
    lanes = {k.domain[i][0] for i in cols.run}  # the run's axes are vector lanes
    parallel = [axis for axis in unrolled.parallel if axis[0] not in lanes]
    em.ranges[cols.flat] = prod(k.domain[i][1] for i in cols.run)  # bounds edge reads
    sums, outside, stores = Scope([], 1), Scope([], 1), Scope([], 1)
    taps = outside
    if win.loop is not None:  # one axis's taps (they share no reads) around the rest
        looped, n = win.loop
        r = em.symbol_names[looped] = em.fresh("r")
        em.ranges[looped] = n
        outside.add(f"{em.comment} the taps along one axis (no two read one vector: a "
                    f"group's input channels) in a loop, the rest unrolled")
        outside.add(f"for ({em.index_t} {r} = 0; {r} < {n}; ++{r}) {{")
        taps = outside.child()
    ranges = dict(em.ranges)
    index = Scope([], 1)
    launch = ndrange(parallel, index, explicit_vectors=True)
    acc = [[f"kg_acc{i}_{j}" for j in range(len(win.starts))] for i in range(len(copies))]
    init = syntax.broadcast.format(em.reduce_init(c.reduce))
    for name in (a for row in acc for a in row):
        sums.add(f"{syntax.vtype} {name} = {init};")
    lane_numbers: set[str] = set()
    _print_taps(em, win, syntax, copies, ranges, acc, taps, lane_numbers)
    if win.loop is not None:
        outside.add("}")
    # lane-number vectors (for masks) are declared once a column in the kernel's body: the
    # padded taps' reads and the stores' masks (a padded AveragePool's count) share them
    # unless the taps are inside a loop of their own
    stored = lane_numbers if win.loop is None else set()
    for (_, _, value), st in zip(win.epilogue, k.stores):
        em.carry_origins(st.value, value)  # the math library's comments
    for i, copy in enumerate(copies):
        for j, start in enumerate(win.starts):
            writer = VectorPrinter(em, cols.flat, start, stores, syntax,
                                   lanes={c.reduce: acc[i][j]}, declared=stored)
            for buf, offset, value in win.epilogue:
                row = specialise(value, copy, ranges, keep={c.reduce})
                em.carry_origins(value, row)
                text = writer.expr(row)
                off = specialise_index(offset, {**copy, cols.flat: start}, ranges)
                stores.add(syntax.store.format(v=text, ptr=em.arg_names[buf.name],
                                               off=em.index(off)))
    src = templates.render("opencl", "window.cl", name=k.name, params=em.params(),
                           rows=str(len(copies)), nv=str(len(win.starts)),
                           width=str(cols.width), index="\n".join(index.lines),
                           sums="\n".join(sums.lines), taps="\n".join(outside.lines),
                           stores="\n".join(stores.lines))
    return src, launch


def _print_taps(em: CEmitter, win: WindowPlan, syntax: VectorSyntax,
                copies: tuple[dict[sympy.Symbol, sympy.Expr], ...],
                ranges: dict[sympy.Symbol, int], acc: list[list[str]], taps: Scope,
                lane_numbers: set[str]) -> None:
    """Every unrolled tap of every copy into ``taps`` in ``syntax``'s vectors, each distinct
    input vector read once and added into the sums ``acc[copy][vector]`` that use it;
    ``lane_numbers`` collects the lane-number vectors declared in ``taps``."""
    c, cols = win.contraction, win.columns
    assert cols.right is not None
    pool = is_pooling(c)  # each tap's vector combined by the reduction's operator
    # the copies of the right operand, each with the sums it goes into, in first-use order
    users: dict[Expr, list[tuple[int, Expr]]] = {}
    looped = win.loop[0] if win.loop is not None else None
    unrolled_axes = [axis for axis in c.reduce.axes if axis[0] != looped]
    axes = [s for s, _ in unrolled_axes]
    for i, copy in enumerate(copies):
        for point in itertools.product(*(range(m) for _, m in unrolled_axes)):
            at = {**copy, **dict(zip(axes, map(sympy.Integer, point)))}
            right = specialise(cols.right, at, ranges)
            users.setdefault(right, []).append((i, specialise(c.left, at, ranges)))
    for left in dict.fromkeys(left for uses in users.values() for _, left in uses):
        em.expr(left, taps)  # the weights, read once up front (a pool's 1 prints nothing)
    readers = [VectorPrinter(em, cols.flat, start, taps, syntax, declared=lane_numbers)
               for start in win.starts]

    def row_test(right: Expr) -> frozenset[sympy.Basic]:
        """The lane-free guard parts of ``right``'s loads (a padded window's row test)."""
        tests = (split_guard(n.guard, cols.flat) for n in walk(right)
                 if isinstance(n, Load) and n.guard is not sympy.true)
        return frozenset(t[0] for t in tests if t is not None) - {sympy.true}

    groups: dict[frozenset[sympy.Basic], list[Expr]] = {}
    for right in users:  # by row test, in the order each test is first met
        groups.setdefault(row_test(right), []).append(right)
    for test, group in groups.items():
        # copies under one row test read under one 'if' (one branch, not one per vector or
        # per input channel of a group); untested ones read just before their use, to keep
        # few vectors live
        for batch in [group] if test else [[right] for right in group]:
            loads = [n for right in batch for n in walk(right) if isinstance(n, Load)]
            read_together(readers, loads)
            for right in batch:
                for j, reader in enumerate(readers):
                    vector = reader.expr(right)
                    for i, left in users[right]:
                        a = acc[i][j]
                        taps.add(f"{a} = " + (
                            syntax.combine[c.reduce.kind].format(a=a, b=vector) if pool
                            else f"fma({reader.expr(left)}, {vector}, {a})") + ";")
