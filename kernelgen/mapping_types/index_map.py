"""Index maps: where an operator reads one input, as SymPy expressions of its output index."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import sympy

from .index import FloorDiv, FloorMod, bounds, out_symbols, simplify_index

Shape = tuple[int, ...]
Extents = tuple[tuple[sympy.Symbol, int], ...]


@dataclass(frozen=True)
class IndexMap:
    """For one input of an operator: the input index as a function of the output index.

    ``exprs[k]`` gives input axis ``k`` in terms of the output symbols ``o0..o{n-1}`` (see
    ``out_symbols``), the reduction symbols in ``reduce`` and the data symbols in ``data``
    (indices loaded from another tensor, as in Gather). The read happens only where ``guard``
    holds (Pad and Concat read nothing outside their source region).
    """

    out_shape: Shape
    in_shape: Shape
    exprs: tuple[sympy.Expr, ...]
    reduce: Extents = ()
    data: Extents = ()
    guard: sympy.Basic = field(default=sympy.true)

    def __post_init__(self) -> None:
        if len(self.exprs) != len(self.in_shape):
            raise ValueError(
                f"index map has {len(self.exprs)} expressions for an input of rank "
                f"{len(self.in_shape)} (shape {self.in_shape})")
        bound = set(out_symbols(len(self.out_shape))) | {s for s, _ in self.reduce + self.data}
        used: set[sympy.Basic] = set(self.guard.free_symbols)
        for axis, e in enumerate(self.exprs):
            if e.is_integer is not True:
                raise ValueError(f"index map expression for input axis {axis} is not integer: {e}")
            used |= e.free_symbols
        if stray := used - bound:
            raise ValueError(f"index map uses unbound symbols {sorted(map(str, stray))}")

    @property
    def out_symbols(self) -> tuple[sympy.Symbol, ...]:
        return out_symbols(len(self.out_shape))

    @cached_property
    def ranges(self) -> dict[sympy.Symbol, int]:
        """Every symbol the map may use, with its extent."""
        ranges = dict(zip(self.out_symbols, self.out_shape))
        ranges.update(self.reduce)
        ranges.update(self.data)
        return ranges

    @classmethod
    def identity(cls, shape: Sequence[int]) -> IndexMap:
        shape = tuple(shape)
        return cls(shape, shape, out_symbols(len(shape)))

    def simplified(self) -> IndexMap:
        exprs = tuple(simplify_index(e, self.ranges) for e in self.exprs)
        guard = simplify_guard(self.guard, self.ranges)
        return IndexMap(self.out_shape, self.in_shape, exprs, self.reduce, self.data, guard)

    def __str__(self) -> str:
        idx = ", ".join(map(str, self.exprs))
        red = "".join(f" sum_{s}<{n}" for s, n in self.reduce)
        cond = "" if self.guard is sympy.true else f" if {self.guard}"
        return f"in[{idx}]{red}{cond}"


def simplify_guard(guard: sympy.Basic, ranges: Mapping[sympy.Symbol, int]) -> sympy.Basic:
    """Simplify each index expression inside a guard and drop comparisons the ranges decide."""
    if guard in (sympy.true, sympy.false):
        return guard
    if isinstance(guard, sympy.core.relational.Relational):
        lhs = simplify_index(guard.lhs - guard.rhs, ranges)
        b = bounds(lhs, ranges)
        if b is not None:
            lo, hi = b
            decided = {
                sympy.StrictLessThan: (hi < 0, lo >= 0), sympy.LessThan: (hi <= 0, lo > 0),
                sympy.StrictGreaterThan: (lo > 0, hi <= 0), sympy.GreaterThan: (lo >= 0, hi < 0),
            }.get(type(guard))
            if decided is not None:
                if decided[0]:
                    return sympy.true
                if decided[1]:
                    return sympy.false
        return type(guard)(lhs, 0)
    if isinstance(guard, sympy.And):
        return _tightest_bounds(sympy.And(*(simplify_guard(a, ranges) for a in guard.args)))
    if isinstance(guard, (sympy.Or, sympy.Not)):
        return guard.func(*(simplify_guard(a, ranges) for a in guard.args))
    return guard


def _tightest_bounds(guard: sympy.Basic) -> sympy.Basic:
    """In a conjunction of integer bounds on the same expression keep only the tightest upper
    (``e < k``) and lower (``e >= k``) one: ``o1 < 8 & o1 < 6`` is ``o1 < 6``."""
    if not isinstance(guard, sympy.And):
        return guard
    upper: dict[sympy.Expr, int] = {}
    lower: dict[sympy.Expr, int] = {}
    rest = []
    for term in guard.args:
        norm = _as_bound(term)
        if norm is None:
            rest.append(term)
            continue
        e, k, is_upper = norm
        table, pick = (upper, min) if is_upper else (lower, max)
        table[e] = pick(table.get(e, k), k)
    bounds = [sympy.StrictLessThan(e - k, 0) for e, k in upper.items()]
    bounds += [sympy.GreaterThan(e - k, 0) for e, k in lower.items()]
    return sympy.And(*rest, *bounds)


def _as_bound(term: sympy.Basic) -> tuple[sympy.Expr, int, bool] | None:
    """``e + c OP 0`` over integers as (e, k, is_upper) meaning ``e < k`` or ``e >= k``."""
    if not isinstance(term, sympy.core.relational.Relational) or term.rhs != 0:
        return None
    lhs = sympy.expand(term.lhs)
    c = int(sum((t for t in sympy.Add.make_args(lhs) if t.is_Integer), sympy.Integer(0)))
    e = lhs - c
    if isinstance(term, sympy.StrictLessThan):
        return e, -c, True
    if isinstance(term, sympy.LessThan):
        return e, -c + 1, True
    if isinstance(term, sympy.GreaterThan):
        return e, -c, False
    if isinstance(term, sympy.StrictGreaterThan):
        return e, -c + 1, False
    return None


def compose(producer: IndexMap, consumer: IndexMap) -> IndexMap:
    """The producer's input index as a function of the consumer's output index.

    ``consumer`` reads the producer's output; ``producer`` reads its own input. Substituting the
    consumer's read expressions for the producer's output symbols gives a map from the consumer's
    output to the producer's input (DNNFusion's intra-block index composition).
    """
    if tuple(consumer.in_shape) != tuple(producer.out_shape):
        raise ValueError(
            f"cannot compose: the consumer reads a tensor of shape {consumer.in_shape} but the "
            f"producer writes shape {producer.out_shape}")
    sub = dict(zip(producer.out_symbols, consumer.exprs))
    exprs = tuple(e.xreplace(sub) for e in producer.exprs)
    guard = sympy.And(consumer.guard, producer.guard.xreplace(sub))
    return IndexMap(consumer.out_shape, producer.in_shape, exprs,
                    consumer.reduce + producer.reduce, consumer.data + producer.data,
                    guard).simplified()


# --- numeric evaluation of index expressions -------------------------------------------------

def evaluate(expr: sympy.Basic, env: Mapping[sympy.Symbol, Any]) -> Any:
    """Evaluate an index expression or guard on NumPy integer arrays, with floor semantics.

    Used by ``classify``, by property tests and by the loop-IR interpreter.
    """
    if expr is sympy.true:
        return True
    if expr is sympy.false:
        return False
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env[expr]
    args = [evaluate(a, env) for a in expr.args]
    if expr.is_Add:
        return sum(args[1:], args[0])
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        return args[0] ** int(expr.exp)
    if isinstance(expr, FloorDiv):
        return np.floor_divide(args[0], args[1])
    if isinstance(expr, FloorMod):
        return np.mod(args[0], args[1])
    if isinstance(expr, sympy.Max):
        return _fold(np.maximum, args)
    if isinstance(expr, sympy.Min):
        return _fold(np.minimum, args)
    if isinstance(expr, sympy.And):
        return _fold(np.logical_and, args)
    if isinstance(expr, sympy.Or):
        return _fold(np.logical_or, args)
    if isinstance(expr, sympy.Not):
        return np.logical_not(args[0])
    compare = {sympy.StrictLessThan: np.less, sympy.LessThan: np.less_equal,
               sympy.StrictGreaterThan: np.greater, sympy.GreaterThan: np.greater_equal,
               sympy.Equality: np.equal, sympy.Unequality: np.not_equal}.get(type(expr))
    if compare is not None:
        return compare(args[0], args[1])
    raise TypeError(f"cannot evaluate index expression {expr} (node {type(expr).__name__})")


def _fold(fn: Any, args: list[Any]) -> Any:
    out = args[0]
    for a in args[1:]:
        out = fn(out, a)
    return out
