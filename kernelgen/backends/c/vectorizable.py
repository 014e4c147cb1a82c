"""Which expressions the C family runs as explicit vectors along an axis (``vectorizable``), and
the plans built on that judgement: a kernel's stores as vector columns (``vector_columns_ok``,
``columns_plan``) and a hoisted reduction as a vector loop (``vector_reduction_ok``). The
printer of such code is ``vector.VectorPrinter``."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import sympy

from ...dtypes import DType
from ...ir.expr import Call, Cast, Expr, IndexCond, Load, Reduce, Select, free_index_symbols, walk
from ...ir.loop import LoopKernel
from ...lower.transpose import stride
from ...mapping_types import FloorDiv, FloorMod
from .vector_syntax import VectorSyntax


def split_guard(guard: sympy.Basic, sym: sympy.Symbol
                ) -> tuple[sympy.Basic, tuple[sympy.Basic, ...]] | None:
    """``guard`` as (the part free of ``sym``, the linear inequalities in ``sym``), or None
    when it is not such a conjunction. The lanes where linear inequalities hold form one
    interval, so a vector whose first and last lanes pass has every lane inside (a padded
    window's interior)."""
    def linear(diff: sympy.Expr) -> bool:
        coeff = diff.coeff(sym)
        return bool(coeff.is_number) and sym not in sympy.expand(diff - coeff * sym).free_symbols
    return _split(guard, sym, linear)


def split_lanes(guard: sympy.Basic, sym: sympy.Symbol
                ) -> tuple[sympy.Basic, tuple[sympy.Basic, ...]] | None:
    """``guard`` as (the part free of ``sym``, the inequalities each lane tests on its own),
    or None when it is no such conjunction: as ``split_guard``, but ``sym`` may also appear
    inside ``FloorDiv`` and ``FloorMod`` (a run of merged axes, each axis a function of the
    flat position: ``flatten_axes(..., wrap=True)``). The lanes that pass need not be one
    interval, so each vector tests every lane (a mask)."""
    def affine(diff: sympy.Expr) -> bool:  # in sym and its floors and remainders
        held = diff.xreplace({w: sympy.Dummy(integer=True)
                              for w in diff.atoms(FloorDiv, FloorMod)})
        return held.is_polynomial() and sympy.Poly(held).total_degree() <= 1 and \
            all(a.is_number for a in _coefficients(held))
    return _split(guard, sym, affine)


def _split(guard: sympy.Basic, sym: sympy.Symbol, accept: Callable[[sympy.Expr], bool]
           ) -> tuple[sympy.Basic, tuple[sympy.Basic, ...]] | None:
    """``guard`` as (the part free of ``sym``, its inequalities in ``sym``), or None unless
    every term is free of ``sym`` or an inequality whose ``lhs - rhs`` ``accept`` takes."""
    terms = guard.args if isinstance(guard, sympy.And) else (guard,)
    uniform, tests = [], []
    for term in terms:
        if sym not in term.free_symbols:
            uniform.append(term)
            continue
        if not isinstance(term, sympy.core.relational.Relational) or isinstance(
                term, (sympy.Eq, sympy.Ne)) or not accept(sympy.expand(term.lhs - term.rhs)):
            return None
        tests.append(term)
    return sympy.And(*uniform), tuple(tests)


def _coefficients(expr: sympy.Expr) -> list[sympy.Expr]:
    """The coefficients of the affine ``expr`` in its free symbols."""
    return [expr.coeff(x) for x in expr.free_symbols] + [expr.as_coeff_Add()[0]]


def vectorizable(root: Expr, sym: sympy.Symbol, syntax: VectorSyntax,
                 hoisted: frozenset[Reduce] = frozenset(), guarded: bool = False,
                 reductions: bool = False, lanes: frozenset[Expr] = frozenset(),
                 wrapped: bool = False) -> bool:
    """Whether ``root`` can run as float32 vectors along ``sym``: primitives with a vector form,
    selects and comparisons; loads contiguous (stride 1) or invariant in ``sym``; index
    conditions and gathered indices free of ``sym``. With ``guarded``, a contiguous load may
    have a guard linear in ``sym`` (``VectorPrinter`` then loads the interior as one vector and
    the edges lane by lane); with ``reductions``, a nested reduction runs as a vector
    accumulator over its axes (AGO's producer inside a consumer's operand). ``lanes`` are
    nodes that are vectors already (a tile's accumulators): a node over one varies along
    ``sym`` as ``VectorPrinter`` sees it, so it needs a vector form too. With ``wrapped``
    (and ``guarded``), a guard may also test ``FloorDiv`` and ``FloorMod`` of ``sym``
    (``split_lanes``: the printer masks the lanes of one read)."""

    def lane_test(cond: sympy.Basic) -> bool:
        return split_guard(cond, sym) is not None or (
            wrapped and syntax.lane_masks and split_lanes(cond, sym) is not None)

    @functools.cache
    def ok(node: Expr) -> bool:  # cached: a shared node is judged once
        if node in hoisted or node in lanes:
            return True
        if sym not in free_index_symbols(node) and not (
                lanes and any(n in lanes for n in walk(node))):
            return True  # computed once, outside the vector loop
        if isinstance(node, Reduce):
            return (reductions and node.dtype is DType.float32
                    and node.kind in syntax.combine and ok(node.body))
        if isinstance(node, IndexCond):  # a lane mask from the lane numbers
            return guarded and syntax.lane_masks and not node.data and lane_test(node.cond)
        if isinstance(node, Load):
            step = stride(sympy.expand(node.offset), sym)
            # otherwise a guarded load stays scalar: a vector would read past the guarded region
            guard_ok = node.guard is sympy.true or (guarded and lane_test(node.guard))
            stride_ok = step == 1 or (step == 2 and bool(syntax.load_stride2))
            return node.dtype is DType.float32 and stride_ok and guard_ok and not node.data
        if isinstance(node, Call):
            lanes_ok = node.dtype in (DType.float32, DType.bool) and all(
                a.dtype in (DType.float32, DType.bool) for a in node.args)
            return lanes_ok and node.fn in syntax.functions and all(ok(c) for c in node.args)
        if isinstance(node, Select):
            return node.dtype in (DType.float32, DType.bool) and all(
                ok(c) for c in node.children())
        if isinstance(node, Cast):  # an integer or boolean input read as floats
            src = node.value
            return (node.dtype is DType.float32 and isinstance(src, Load)
                    and src.dtype.value in syntax.load_convert and src.guard is sympy.true
                    and not src.data and stride(sympy.expand(src.offset), sym) == 1)
        return False  # other casts, index conditions on sym, nested reductions: scalar code

    return ok(root)


def vector_columns_ok(kernel: LoopKernel, v: VectorSyntax | None, guarded: bool) -> bool:
    """Whether every store runs as vectors along the innermost domain axis. A reduction left
    in the stores (not hoisted) is computed per element: it runs as one vector accumulator for
    a run of output columns (a staged kernel's P V; a conv's window on NEON)."""
    if v is None or not kernel.domain:
        return False
    sym, n = kernel.domain[-1]
    hoisted = frozenset(kernel.hoisted)
    return n >= 2 * v.width and all(b.dtype is DType.float32 for b in kernel.outputs) and all(
        vectorizable(st.value, sym, v, hoisted, guarded=guarded, reductions=True)
        for st in kernel.stores)


def columns_plan(kernel: LoopKernel, v: VectorSyntax | None) -> LoopKernel | None:
    """``kernel`` with the reductions that the last axis keys computed per element inside a
    vector loop over that axis (the 'columns' schedules of NEON and OpenCL), or None where that
    does not apply. It applies when the hoisted reductions key every domain axis together (so
    a group point is one element, which a serial schedule would reduce one at a time: a
    depthwise conv's window, LRN's channels) and every store vectorises along the last axis,
    those reductions as vector accumulators. The others stay hoisted, now once per row of the
    last axis (inside a vector accumulator's loop they would be computed again at every
    step)."""
    if not kernel.hoisted or kernel.staged or not kernel.domain or \
            len(kernel.group) != len(kernel.domain):
        return None
    last, _ = kernel.domain[-1]
    rows = tuple(r for r in kernel.hoisted if last not in free_index_symbols(r))
    plan = replace(kernel, hoisted=rows, group=tuple(range(len(kernel.domain) - 1)))
    return plan if vector_columns_ok(plan, v, guarded=True) else None


def vector_reduction_ok(r: Reduce, v: VectorSyntax | None) -> bool:
    """Whether a hoisted reduction runs as a vector loop along its one axis (and a scalar
    tail)."""
    return v is not None and len(r.axes) == 1 and r.axes[0][1] >= 2 * v.width \
        and r.dtype is DType.float32 and vectorizable(r.body, r.axes[0][0], v)
