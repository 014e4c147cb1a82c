"""Integer index arithmetic in SymPy with explicit floor semantics, and range-aware simplification.

# Note: floor vs. truncating division
C's ``/`` and ``%`` truncate toward zero, SymPy and Python floor. Index maps use ``FloorDiv`` and
``FloorMod`` (both floor, divisor a positive integer constant since shapes are concrete). Emitters
print C ``/``/``%`` only where ``is_provably_nonnegative`` holds for the numerator, and a floor helper
otherwise.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import sympy

Bounds = tuple[int, int]

_counter = itertools.count()


def out_symbol(axis: int) -> sympy.Symbol:
    """The canonical symbol for output axis ``axis`` (shared by every operator's index map)."""
    return sympy.Symbol(f"o{axis}", integer=True, nonnegative=True)


def out_symbols(rank: int) -> tuple[sympy.Symbol, ...]:
    return tuple(out_symbol(a) for a in range(rank))


def fresh_reduce_symbol(hint: str = "r") -> sympy.Symbol:
    """A new reduction symbol; reductions bind their own symbols, so names never collide."""
    return sympy.Symbol(f"{hint}{next(_counter)}", integer=True, nonnegative=True)


class FloorDiv(sympy.Function):
    """``floor(a / b)`` for a positive integer constant ``b``."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1:
            return a
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if a == 0:
            return sympy.Integer(0)
        return None


class FloorMod(sympy.Function):
    """``a - b * floor(a / b)`` for a positive integer constant ``b`` (result in ``[0, b)``)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


def bounds(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> Bounds | None:
    """Inclusive integer bounds of ``expr`` when every symbol ``s`` ranges over ``[0, ranges[s])``.

    Returns None when the expression is not built from operations whose bounds we can follow.
    """
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        if expr in ranges:
            return 0, max(int(ranges[expr]) - 1, 0)
        return None
    if expr.is_Add:
        lo = hi = 0
        for term in expr.args:
            b = bounds(term, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if expr.is_Mul:
        lo, hi = 1, 1
        for factor in expr.args:
            b = bounds(factor, ranges)
            if b is None:
                return None
            products = [lo * b[0], lo * b[1], hi * b[0], hi * b[1]]
            lo, hi = min(products), max(products)
        return lo, hi
    if isinstance(expr, FloorDiv):
        b = bounds(expr.args[0], ranges)
        d = int(expr.args[1])
        return None if b is None else (b[0] // d, b[1] // d)
    if isinstance(expr, FloorMod):
        b = bounds(expr.args[0], ranges)
        d = int(expr.args[1])
        if b is not None and b[0] >= 0 and b[1] < d:
            return b
        return 0, d - 1
    if isinstance(expr, (sympy.Max, sympy.Min)):
        bs = [bounds(a, ranges) for a in expr.args]
        if any(b is None for b in bs):
            return None
        pick = max if isinstance(expr, sympy.Max) else min
        return pick(b[0] for b in bs), pick(b[1] for b in bs)  # type: ignore[index]
    return None


def is_provably_nonnegative(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> bool:
    b = bounds(expr, ranges)
    return b is not None and b[0] >= 0


def _split_multiples(a: sympy.Expr, d: int) -> tuple[sympy.Expr, sympy.Expr]:
    """Split ``a`` into ``(q, rest)`` with ``a == d*q + rest``, moving every term whose integer
    coefficient is a multiple of ``d`` into ``q``."""
    q, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(a)):
        coeff, factor = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % d == 0:
            q += (int(coeff) // d) * factor
        else:
            rest += term
    return q, rest


def simplify_index(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """Simplify an index expression using the symbol ranges (Inductor's simplify_with_ranges idea).

    Rules, applied bottom-up: ``FloorDiv(d*q + r, d) -> q + FloorDiv(r, d)``; ``FloorMod(d*q + r, d)
    -> FloorMod(r, d)``; ``FloorDiv(r, d) -> 0`` and ``FloorMod(r, d) -> r`` when ``0 <= r < d``;
    ``FloorDiv(FloorDiv(a, b), c) -> FloorDiv(a, b*c)``; ``FloorMod(FloorMod(a, m), d) -> FloorMod(a, d)``
    when ``d`` divides ``m``.
    """
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return expr
    args = [simplify_index(a, ranges) for a in expr.args]
    if isinstance(expr, (FloorDiv, FloorMod)):
        a, d = args[0], int(args[1])
        if isinstance(expr, FloorDiv) and isinstance(a, FloorDiv):
            return simplify_index(FloorDiv(a.args[0], d * int(a.args[1])), ranges)
        if isinstance(expr, FloorMod) and isinstance(a, FloorMod) and int(a.args[1]) % d == 0:
            return simplify_index(FloorMod(a.args[0], d), ranges)
        q, rest = _split_multiples(a, d)
        b = bounds(rest, ranges)
        in_range = b is not None and 0 <= b[0] and b[1] < d
        if isinstance(expr, FloorDiv):
            if q != 0:  # floor((d*q + r)/d) == q + floor(r/d) for any integer q
                return sympy.expand(q + (0 if in_range else FloorDiv(rest, d)))
            return sympy.Integer(0) if in_range else FloorDiv(sympy.expand(a), d)
        if in_range:
            return rest
        return FloorMod(rest if q != 0 else sympy.expand(a), d)
    rebuilt = expr.func(*args)
    return sympy.expand(rebuilt) if isinstance(rebuilt, (sympy.Add, sympy.Mul)) else rebuilt
