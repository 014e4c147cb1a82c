"""Substituting index symbols inside expressions: specialising symbols to constants (an
unrolled copy, a tile's position) and flattening runs of axes into one position (a vector
along merged output axes). Pure functions of the IR, used by the lowering passes, the
interpreter and every backend."""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

import sympy

from ..mapping_types import FloorDiv, FloorMod, simplify_index
from ..mapping_types.index_map import simplify_guard
from .expr import Axis, Expr, IndexCond, Load, Read, Select, free_index_symbols, transform


def specialise(root: Expr, values: Mapping[sympy.Symbol, int | sympy.Expr],
               ranges: Mapping[sympy.Symbol, int], keep: Collection[Expr] = ()) -> Expr:
    """``root`` with some index symbols replaced (by constants, or ``2*outer + 1`` for a split
    axis): offsets and guards simplified, and selects on conditions that became constant
    replaced by their taken side. Equal loads and sums of the copies for different values then
    compare equal, so an emitter that unrolls a small axis shares them (Winograd's 16 transform
    positions read one 4x4 tile). ``ranges`` bounds every symbol in the result. Nodes in
    ``keep`` stay as they are (an epilogue's contraction sum)."""
    sub = {s: sympy.sympify(v) for s, v in values.items()}
    fixed = set(sub)

    def visit(node: Expr, recurse: Callable[[Expr], Expr]) -> Expr | None:
        if node in keep or not fixed & free_index_symbols(node):
            return node
        if isinstance(node, Load):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            offset = specialise_index(node.offset, sub, ranges)
            return Load(node.dtype, node.buffer, offset,
                        simplify_guard(node.guard.xreplace(sub), ranges), data)
        if isinstance(node, IndexCond):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return IndexCond(node.dtype, simplify_guard(node.cond.xreplace(sub), ranges), data)
        if isinstance(node, Select):
            cond = recurse(node.cond)
            if isinstance(cond, IndexCond) and cond.cond in (sympy.true, sympy.false):
                return recurse(node.if_true if cond.cond is sympy.true else node.if_false)
        return None

    return transform(root, visit)


# specialise_index's results by what they depend on. An unrolled kernel specialises the same
# offsets to the same values again and again: each copy of each candidate plan (``unroll``
# names a split axis's outer part by the axis and factor), then the printer. F(4x4,3x3)'s
# output transform over 64x56x56 asked 23832 times for 3336 distinct results.
_SPECIALISED: dict[tuple[Any, ...], sympy.Expr] = {}
_SPECIALISED_MAX = 1 << 16


def specialise_index(expr: sympy.Expr, values: Mapping[sympy.Symbol, int | sympy.Expr],
                     ranges: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """An offset with some index symbols replaced, simplified as ``specialise`` does."""
    free = expr.free_symbols
    used = {s: sympy.sympify(v) for s, v in values.items() if s in free}
    left = free.difference(used).union(*(v.free_symbols for v in used.values()))
    # the simplification reads the ranges of the result's symbols only
    key = (expr, frozenset(used.items()), frozenset((s, ranges.get(s)) for s in left))
    hit = _SPECIALISED.get(key)
    if hit is None:
        hit = simplify_index(sympy.expand(expr.xreplace(used)), ranges)
        if len(_SPECIALISED) >= _SPECIALISED_MAX:
            _SPECIALISED.clear()
        _SPECIALISED[key] = hit
    return hit


def _strides(offset: sympy.Expr, axes: list[Axis]) -> tuple[list[sympy.Expr], sympy.Expr]:
    """``offset``'s coefficient of each axis symbol and the rest (which may still hold them,
    inside a product or a division)."""
    syms = [s for s, _ in axes]
    offset = sympy.expand(offset)
    coeffs = [offset.coeff(s) for s in syms]
    return coeffs, sympy.expand(offset - sum(c * s for c, s in zip(coeffs, syms)))


def flatten_offset(offset: sympy.Expr, axes: list[Axis], flat: sympy.Symbol
                   ) -> sympy.Expr | None:
    """``offset`` with the row-major ``axes`` replaced by their flat position ``flat``, or None
    unless it walks them as one contiguous run (each axis's stride is the next one's times the
    next one's extent)."""
    coeffs, rest = _strides(offset, axes)
    runs = all(coeffs[i] == coeffs[i + 1] * axes[i + 1][1] for i in range(len(axes) - 1))
    syms = {s for s, _ in axes}
    return rest + coeffs[-1] * flat if runs and not syms & rest.free_symbols else None


def flatten_offset_aligned(offset: sympy.Expr, axes: list[Axis], flat: sympy.Symbol,
                           width: int) -> sympy.Expr | None:
    """``offset`` as a function of the row-major ``axes``' flat position ``flat`` (each axis
    its own ``floor`` and ``Mod`` of it), or None unless every ``width`` positions from a
    multiple of ``width`` on are contiguous: the offset is affine in the axes, the innermost
    has stride 1 and an extent that is a multiple of ``width``. Such a run need not be
    contiguous as a whole: a head-split projection stores ``(s, h, d)`` at ``(h, s, d)``."""
    coeffs, rest = _strides(offset, axes)
    syms = {s for s, _ in axes}
    if coeffs[-1] != 1 or axes[-1][1] % width or syms & rest.free_symbols or \
            any(syms & sympy.sympify(c).free_symbols for c in coeffs):
        return None
    positions = _positions(axes, flat)
    return rest + sum(c * positions[s] for c, (s, _) in zip(coeffs, axes))


def flatten_axes(root: Expr, axes: list[Axis], flat: sympy.Symbol,
                 keep: frozenset[Expr] = frozenset(), wrap: bool = False) -> Expr | None:
    """``root`` with the row-major ``axes`` replaced by their flat position ``flat``, or None
    when some use is not a load whose offset walks them as one contiguous run, or they appear
    in a guard or condition when there are several (unless ``wrap``: each axis is then its
    ``floor`` and ``Mod`` of ``flat`` there, a lane's own test). Nodes in ``keep`` stay as
    they are (an epilogue's contraction sum). Lets a vector run over merged output axes (a
    conv's (OH, OW) pixels; with ``wrap``, also a padded conv's, whose patch rows wrap from
    one output row into the next)."""
    syms = set(s for s, _ in axes)
    # one axis is only renamed, so a guard on it stays linear (a padded window's bounds test)
    rename = {axes[0][0]: flat} if len(axes) == 1 else \
        _positions(axes, flat) if wrap else None
    failed = False

    def visit(node: Expr, recurse: Callable[[Expr], Expr]) -> Expr | None:
        nonlocal failed
        if node in keep or not syms & free_index_symbols(node) or failed:
            return node
        if isinstance(node, Load):
            offset = flatten_offset(node.offset, axes, flat)
            guarded = bool(syms & set(node.guard.free_symbols))
            if offset is None or (guarded and rename is None) \
                    or any(syms & free_index_symbols(v) for _, _, v in node.data):
                failed = True
                return node
            guard = node.guard.xreplace(rename) if guarded and rename else node.guard
            return replace(node, offset=offset, guard=guard)
        if isinstance(node, IndexCond) and rename is not None:
            return replace(node, cond=node.cond.xreplace(rename))  # padding's inside-test
        if isinstance(node, (IndexCond, Read)):
            failed = True
            return node
        return None

    out = transform(root, visit)
    return None if failed else out


def _positions(axes: list[Axis], flat: sympy.Symbol) -> dict[sympy.Symbol, sympy.Expr]:
    """Each of the row-major ``axes`` as a function of their flat position ``flat``."""
    out: dict[sympy.Symbol, sympy.Expr] = {}
    inner = 1
    for i in reversed(range(len(axes))):
        position = FloorDiv(flat, inner) if inner > 1 else flat
        out[axes[i][0]] = FloorMod(position, axes[i][1]) if i else position
        inner *= axes[i][1]
    return out
