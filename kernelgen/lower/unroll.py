"""Several domain points per work-item: an elementwise kernel's stores repeated for a few
neighbouring points, each copy specialised to its constants (``ir.substitute.specialise``), so the
copies share the loads and partial sums that one point per work-item reads again for every
point. Winograd's transforms are the case in point: the input transform stores the 16 values of
a 4x4 tile from 16 loads instead of 64, the output transform a 2x2 block from 16 loads instead of
36, and neither keeps the divisions and sign selects that pick taps per point.

A plan is one factor per domain axis: 1 keeps the axis parallel, its extent unrolls it
completely, and a smaller factor splits it into a parallel outer axis and an unrolled inner one
(``s = f * outer + r``). A factor that does not divide the extent leaves the last outer point
with copies past the axis's end (an odd output side split by 2: Winograd's output transform
over a 55x55 map): those store only where ``s`` is inside (``Unrolled.guards``), and such a
plan is valid only where every load of those copies stays inside its buffer over the outer
axis's whole range (``_partial_reads_in_bounds``), so that they may be read unconditionally and
shared with the copies inside.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import sympy

from ..ir.expr import Axis, Expr, IndexCond, Load, walk
from ..ir.fingerprint import by_structure
from ..ir.loop import LoopKernel
from ..ir.substitute import specialise, specialise_index
from ..mapping_types import FloorDiv, FloorMod
from ..shapes import prod
from .staging import shared_terms_only

MAX_POINTS = 16  # points one work-item covers at most (straight-line code and registers)
# except a leading run of short axes unrolled whole: a transform's tile (F(4x4,3x3)'s 6x6)
MAX_TILE_POINTS = 4 * MAX_POINTS
# unroll only when at most this share of the copies' loads is distinct: below it the shared
# loads pay for the lost parallelism; above it copies are mostly independent work
MAX_DISTINCT = 0.5


@dataclass(frozen=True)
class Unrolled:
    """The parallel axes left after unrolling, and for each copy the value of every unrolled
    domain symbol as an expression over the parallel ones."""

    parallel: tuple[Axis, ...]
    copies: tuple[dict[sympy.Symbol, sympy.Expr], ...]
    ranges: dict[sympy.Symbol, int]
    outer_of: dict[sympy.Symbol, sympy.Symbol]  # a split domain symbol -> its parallel part
    # per copy, where it stores: true, or inside the axes a factor does not divide
    guards: tuple[sympy.Basic, ...] = ()

    def value(self, root: Expr, copy: dict[sympy.Symbol, sympy.Expr]) -> Expr:
        return specialise(root, copy, self.ranges)

    def offset(self, expr: sympy.Expr, copy: dict[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
        return specialise_index(expr, copy, self.ranges)


def split(kernel: LoopKernel, factors: tuple[int, ...]) -> Unrolled:
    """``kernel``'s domain unrolled by ``factors`` (one per domain axis); ``ValueError`` where
    that is no valid plan (``check``)."""
    unrolled = _checked(kernel, factors, keep=True)
    assert unrolled is not None
    return unrolled


def _split(kernel: LoopKernel, factors: tuple[int, ...]) -> Unrolled:
    ranges = dict(kernel.ranges)
    ranges.update(kernel.domain)
    parallel: list[Axis] = []
    choices: list[list[tuple[sympy.Symbol, sympy.Expr]]] = []
    outer_of: dict[sympy.Symbol, sympy.Symbol] = {}
    for (s, n), f in zip(kernel.domain, factors):
        if f == 1:
            parallel.append((s, n))
        elif f == n:
            choices.append([(s, sympy.Integer(r)) for r in range(n)])
        else:
            # named by the axis and factor: every plan splitting it so shares its specialised
            # offsets (``specialise_index``'s cache)
            outer = sympy.Symbol(f"u_{s}_{f}", integer=True, nonnegative=True)
            outer_of[s] = outer
            parallel.append((outer, -(-n // f)))
            ranges[outer] = -(-n // f)
            choices.append([(s, f * outer + r) for r in range(f)])
    copies = tuple(dict(c) for c in itertools.product(*choices))
    extents = dict(kernel.domain)

    def guard(copy: dict[sympy.Symbol, sympy.Expr]) -> sympy.Basic:
        """Inside every split axis this copy passes the end of at the last outer point."""
        return sympy.And(*(value < extents[s] for s, value in copy.items() if s in outer_of
                           and value.subs(outer_of[s], ranges[outer_of[s]] - 1) >= extents[s]))

    return Unrolled(tuple(parallel), copies, ranges, outer_of,
                    tuple(guard(copy) for copy in copies))


def check(kernel: LoopKernel, factors: tuple[int, ...]) -> None:
    """Raise ``ValueError`` unless ``factors`` is a valid plan for ``kernel``."""
    _checked(kernel, factors, keep=False)


def _checked(kernel: LoopKernel, factors: tuple[int, ...], keep: bool) -> Unrolled | None:
    """``check``, returning the split it made (always made with ``keep``; else only where a
    factor does not divide its axis, whose copies' reads it bounds)."""
    extents = [n for _, n in kernel.domain]
    unrolled = None
    problem = None
    if len(factors) != len(extents):
        problem = f"needs one factor per domain axis ({len(extents)})"
    elif any(f < 1 or f > n for f, n in zip(factors, extents)):
        problem = "each factor must lie between 1 and its axis's extent"
    elif prod(factors) > MAX_TILE_POINTS:
        problem = f"unrolls at most {MAX_TILE_POINTS} points"
    elif extents and prod(factors) == prod(extents) and prod(extents) > 1:
        problem = "must leave some parallel work"
    else:
        partial = any(n % f for f, n in zip(factors, extents))
        if keep or partial:
            unrolled = _split(kernel, factors)
            if partial and not _partial_reads_in_bounds(kernel, unrolled):
                problem = ("a factor that does not divide its axis's extent leaves copies "
                           "past the axis's end whose reads would leave a buffer")
    if problem:
        raise ValueError(f"unroll {tuple(factors)} for domain {extents} of kernel "
                         f"'{kernel.name}': {problem}")
    return unrolled


def _partial_reads_in_bounds(kernel: LoopKernel, unrolled: Unrolled) -> bool:
    """Whether every load of the copies past an axis's end (guarded stores) reads inside its
    buffer wherever the parallel and reduction symbols range: each offset linear in them, its
    bounds from its coefficients' signs."""
    numel = {b.name: b.numel for b in kernel.inputs + kernel.outputs}
    for copy, guard in zip(unrolled.copies, unrolled.guards):
        if guard is sympy.true:
            continue
        for st in kernel.stores:
            for node in walk(unrolled.value(st.value, copy)):
                if isinstance(node, Load) and not _inside(node.offset, unrolled.ranges,
                                                          numel.get(node.buffer, 0)):
                    return False
    return True


def _inside(offset: sympy.Expr, ranges: dict[sympy.Symbol, int], numel: int) -> bool:
    """Whether ``offset``, linear in symbols each ranging over [0, ranges[s]), stays within
    [0, numel)."""
    expr = sympy.expand(offset)
    syms = expr.free_symbols
    if not syms <= set(ranges) or any(not expr.coeff(s).is_number for s in syms):
        return False
    low = high = expr.subs({s: 0 for s in syms})
    for s in syms:
        c = expr.coeff(s)
        low += min(0, c * (ranges[s] - 1))
        high += max(0, c * (ranges[s] - 1))
    rest = sympy.expand(expr - sum(expr.coeff(s) * s for s in syms))
    return bool(rest.is_number) and low >= 0 and high < numel


def none(kernel: LoopKernel) -> tuple[int, ...]:
    """The plan that unrolls nothing."""
    return (1,) * len(kernel.domain)


@lru_cache(maxsize=256)  # asked by the tuner's search space and the emitter, per emit
def ranked(kernel: LoopKernel) -> tuple[tuple[int, ...], ...]:
    """The candidate plans whose copies read at most ``MAX_DISTINCT`` of their loads
    distinctly, the smallest share first (then the fewest points). Candidates: each leading run
    of short axes unrolled completely, each axis split by a divisor it is floor-divided by in an
    index (or twice that), and both together."""
    if kernel.grouped or not kernel.loads():
        return ()
    return _ranked(kernel)


@by_structure(maxsize=1024)
def _ranked(kernel: LoopKernel) -> tuple[tuple[int, ...], ...]:
    splits = ((f, _valid_split(kernel, f)) for f in _candidates(kernel))
    scored = [(_distinct_share(kernel, u), prod(f), f) for f, u in splits if u is not None]
    return tuple(f for share, _, f in sorted(scored) if share <= MAX_DISTINCT)


def _valid_split(kernel: LoopKernel, factors: tuple[int, ...]) -> Unrolled | None:
    try:
        return split(kernel, factors)
    except ValueError:
        return None


def plan(kernel: LoopKernel) -> tuple[int, ...]:
    """The default plan: the best ``ranked`` one, or ``none`` when no plan shares enough."""
    best = ranked(kernel)
    return best[0] if best else none(kernel)


def _candidates(kernel: LoopKernel) -> list[tuple[int, ...]]:
    extents = [n for _, n in kernel.domain]
    leading = [none(kernel)]
    for k in range(1, len(extents)):
        if prod(extents[:k]) > MAX_TILE_POINTS:
            break
        leading.append(tuple(extents[:k]) + (1,) * (len(extents) - k))
    divisors = _divisors(kernel)
    splits = [tuple(f) for f in itertools.product(
        *([1, *sorted(divisors.get(s, ()))] for s, _ in kernel.domain))]
    out = []
    for lead, sp in itertools.product(leading, splits):
        factors = tuple(a if a > 1 else b for a, b in zip(lead, sp))
        points = prod(factors)
        limit = MAX_TILE_POINTS if factors == lead else MAX_POINTS
        if 1 < points <= limit and points < prod(extents) and factors not in out:
            out.append(factors)
    return out


def _divisors(kernel: LoopKernel) -> dict[sympy.Symbol, set[int]]:
    """For each domain symbol, the constant divisors of floor divisions and modulos over it
    (and twice them) below its extent: splitting by one turns those into constants (one that
    does not divide the extent leaves guarded copies, ``check`` decides whether it may)."""
    extents = dict(kernel.domain)
    out: dict[sympy.Symbol, set[int]] = {}
    for st in kernel.stores:
        for node in walk(st.value):
            exprs = [node.offset, node.guard] if isinstance(node, Load) else \
                [node.cond] if isinstance(node, IndexCond) else []
            for e in exprs:
                for atom in e.atoms(FloorDiv, FloorMod):
                    a, d = atom.args
                    for s in a.free_symbols & set(extents):
                        for f in (int(d), 2 * int(d)) if d.is_Integer else ():
                            if 1 < f <= MAX_POINTS and f < extents[s]:
                                out.setdefault(s, set()).add(f)
    return out


def _distinct_share(kernel: LoopKernel, unrolled: Unrolled) -> float:
    """Distinct loads over all loads of the copies of ``unrolled``."""
    distinct: set[Expr] = set()
    total = 0
    for copy in unrolled.copies:
        for st in kernel.stores:
            loads = {n for n in walk(unrolled.value(st.value, copy)) if isinstance(n, Load)}
            distinct |= loads
            total += len(loads)
    return len(distinct) / total if total else 1.0


# --- several group points per work-item: a staged kernel's query rows ------------------------

# A work-item computing this many group points of a staged kernel at once shares its loads of
# what every point reads (attention's keys and values). Measured, generated kernels timed
# side by side, softmax(Q K * scale) V, ms for 1 / 2 / 4 / 8 queries a work-item:
#   OpenCL (PoCL), 256 x 256 x 64: 0.70 / 0.47 / 0.35 / 0.29; 64 x 1024 x 64: 0.38 / 0.26 /
#   0.19 / 0.20. NEON (SIMDe), the same: 2.26 / 1.40 / 0.98 / 0.75; 2.67 / 1.47 / 1.00 / 0.78.
GROUP_ROWS = 8
MAX_GROUP_ROWS = 8
MIN_GROUP_ITEMS = 8  # the default keeps at least this many work-items (threads' iterations)
STAGE_FLOATS = 1 << 15  # staged floats one work-item holds at most (128 KiB of its stack)


def group_row_choices(kernel: LoopKernel) -> tuple[int, ...]:
    """How many points of the innermost group axis one work-item may compute together: 1,
    and for a staged kernel the divisors of that axis up to ``MAX_GROUP_ROWS`` whose staged
    rows fit ``STAGE_FLOATS``."""
    if not kernel.staged or not kernel.group:
        return (1,)
    _, n = kernel.domain[kernel.group[-1]]
    floats = sum(st.buffer.numel for st in kernel.staged)
    out = [1]
    for rows in range(2, MAX_GROUP_ROWS + 1):
        if n % rows == 0 and rows * floats <= STAGE_FLOATS:
            try:
                check(kernel, _group_factors(kernel, rows))
            except ValueError:
                continue
            out.append(rows)
    return tuple(out)


# A staged row of shared terms only (a softmax's exp row) this short still groups: its points
# share no loads but a broadcast mask's, and a work-item per row pays a work-group's overhead
# for little work. bench/short_rows.py (bench/results/short-rows-2026-11-29.json), masked
# softmax, one row against 8 (ms): OpenCL (PoCL) 768x64 0.134 / 0.119, 512x128 0.135 / 0.121,
# 1536x128 0.259 / 0.256 (1.08-1.22x in two runs before); from 197 floats on no gain (6144x384:
# 1.13 against 1.30-1.53 with 2-8 rows); NEON C (SIMDe) 1.06-1.11x at 64 and 128, none above.
SHORT_ROW_FLOATS = 128


def default_group_rows(kernel: LoopKernel) -> int:
    """The most group points per work-item up to ``GROUP_ROWS`` that leave at least
    ``MIN_GROUP_ITEMS`` work-items (or 1). One where no staged row computes a reduction of its
    own and the rows are longer than ``SHORT_ROW_FLOATS``: its points then share no loads (a
    softmax's staged exp row, OpenCL 'row' on PoCL, 1024x4096: 2.5 ms one row a work-item
    against 2.8 with 8; 4096x1024: 3.2 against 4.1)."""
    if shared_terms_only(kernel) and \
            sum(st.buffer.numel for st in kernel.staged) > SHORT_ROW_FLOATS:
        return 1
    points = prod(kernel.domain[g][1] for g in kernel.group)
    return max(r for r in group_row_choices(kernel)
               if r == 1 or (r <= GROUP_ROWS and points // r >= MIN_GROUP_ITEMS))


def choose_group_rows(kernel: LoopKernel, requested: int | None, share: bool) -> int:
    """``requested`` checked against ``group_row_choices``, or by default
    ``default_group_rows`` where the schedule shares the points' loads (``share``), else 1."""
    if requested is None:
        return default_group_rows(kernel) if share else 1
    choices = group_row_choices(kernel)
    if requested not in choices:
        raise ValueError(f"kernel '{kernel.name}': group_rows must be one of {choices} "
                         f"(divisors of its innermost group axis, for a staged kernel within "
                         f"{STAGE_FLOATS} staged floats), got {requested}")
    return requested


# Vectors of a staged row a step computes where the row sums products of its own (a
# projection's row under its LayerNorm; a score row read along the keys): each scalar of the
# other operand then serves that many multiply-adds, 2 x group_rows sums in registers (of 32).
# bench/row_vectors.py (bench/results/row-vectors-2026-12-05.json), one vector a step against
# two: OpenCL (PoCL, device time) 1.17-1.48x on LayerNorm(x W + b + r) of BERT's shapes, 1.07-
# 1.09x on softmax(Q K); NEON C (SIMDe) 1.14-1.24x and 1.04-1.05x; three within 7 % of two
# on those (faster on a 37 x 64 x 48 row kernel, by 20 % on OpenCL, 15 % on NEON C).
ROW_VECTORS = 2


def row_vector_choices(kernel: LoopKernel) -> tuple[int, ...]:
    """The ``row_vectors`` worth measuring: several only where a staged row computes a
    reduction of its own (a row of shared terms only, a softmax's exp row, shares no loads)."""
    return (1, 2, 3) if kernel.staged and not shared_terms_only(kernel) else ()


def choose_row_vectors(kernel: LoopKernel, requested: int | None, registers: bool
                       ) -> int | None:
    """``requested`` (1 to 4), or by default ``ROW_VECTORS`` where a staged row computes a
    reduction of its own and the target has the registers for them (``registers``), else 1;
    None for a kernel that stages no row (more than one vector refused there)."""
    if requested is not None and requested not in (1, 2, 3, 4):
        raise ValueError(f"kernel '{kernel.name}': row_vectors must be 1 to 4, got "
                         f"{requested!r}")
    if not kernel.staged:
        if requested not in (None, 1):
            raise ValueError(f"kernel '{kernel.name}': row_vectors applies to a kernel that "
                             f"stages a row per group point; this one stages none")
        return None
    if requested is not None:
        return requested
    return ROW_VECTORS if registers and row_vector_choices(kernel) else 1


def split_group(kernel: LoopKernel, rows: int) -> Unrolled | None:
    """The innermost group axis split so each work-item computes ``rows`` of its points (None
    for one)."""
    return None if rows == 1 else split(kernel, _group_factors(kernel, rows))


def _group_factors(kernel: LoopKernel, rows: int) -> tuple[int, ...]:
    factors = [1] * len(kernel.domain)
    factors[kernel.group[-1]] = rows
    return tuple(factors)
