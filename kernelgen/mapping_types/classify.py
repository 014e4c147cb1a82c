"""Infer an index map's mapping type from the map itself, not from an operator-name table."""
from __future__ import annotations

import numpy as np
import sympy

from .index import FloorDiv, FloorMod, simplify_index
from .index_map import IndexMap, evaluate
from .types import MappingType

# Index maps are checked on every point of domains up to this size, else on two corner boxes.
_MAX_POINTS = 1 << 16


def classify(index_map: IndexMap) -> MappingType:
    """The DNNFusion mapping type of one input's index map.

    - any reduction over more than one element: MANY_TO_MANY;
    - an index loaded from data (Gather), or an input element read by two outputs: ONE_TO_MANY;
    - a bijection keeping row-major order that changes the shape: REORGANIZE;
    - an injective map that permutes the order: SHUFFLE;
    - otherwise (identity, slices, pads, concatenation pieces): ONE_TO_ONE.

    Injectivity and order are decided on the real index arithmetic: exhaustively for domains up to
    2**16 points, and on the low and high corner boxes of larger domains.
    """
    m = index_map
    if any(n > 1 for _, n in m.reduce):
        return MappingType.MANY_TO_MANY
    if m.data:
        return MappingType.ONE_TO_MANY
    live = [s for s, n in zip(m.out_symbols, m.out_shape) if n > 1]
    used = set().union(*(e.free_symbols for e in m.exprs)) if m.exprs else set()
    if any(s not in used for s in live):
        return MappingType.ONE_TO_MANY  # an output axis the input does not depend on: broadcast
    offsets, valid = _linear_offsets(m)
    offsets = offsets[valid]
    if np.unique(offsets).size != offsets.size:
        return MappingType.ONE_TO_MANY
    if offsets.size > 1 and not np.all(np.diff(offsets) > 0):
        return MappingType.SHUFFLE
    same_numel = int(np.prod(m.in_shape)) == int(np.prod(m.out_shape))
    if same_numel and bool(valid.all()) and _keeps_linear_order(m, offsets):
        if m.in_shape != m.out_shape:
            return MappingType.REORGANIZE
    return MappingType.ONE_TO_ONE


def _sample_points(shape: tuple[int, ...]) -> list[np.ndarray]:
    """Row-major ordered sample points: the whole domain if small, else the grid made of the
    lowest and highest indices of each axis (so edges, where index maps usually break, are seen)."""
    if int(np.prod(shape, dtype=np.int64)) <= _MAX_POINTS:
        return [g.reshape(-1) for g in np.indices(shape, dtype=np.int64)]
    side = max(1, int(_MAX_POINTS ** (1.0 / len(shape)) // 2))
    axes = [np.union1d(np.arange(min(n, side)), np.arange(max(0, n - side), n)) for n in shape]
    return [g.reshape(-1) for g in np.meshgrid(*axes, indexing="ij")]


def _linear_offsets(m: IndexMap) -> tuple[np.ndarray, np.ndarray]:
    points = _sample_points(m.out_shape)
    count = points[0].size if points else 1
    env = dict(zip(m.out_symbols, points))
    env.update({s: np.zeros(count, np.int64) for s, _ in m.reduce})
    strides = np.cumprod((1,) + tuple(reversed(m.in_shape[1:])))[::-1]
    offsets = np.zeros(count, np.int64)
    valid = np.broadcast_to(np.asarray(evaluate(m.guard, env), bool), (count,)).copy()
    for e, stride, n in zip(m.exprs, strides, m.in_shape):
        idx = np.broadcast_to(np.asarray(evaluate(e, env), np.int64), (count,))
        valid &= (idx >= 0) & (idx < n)
        offsets = offsets + idx * int(stride)
    return offsets, valid


def _keeps_linear_order(m: IndexMap, offsets: np.ndarray) -> bool:
    """True if input offset == output offset at every sampled point (a pure reshape)."""
    points = _sample_points(m.out_shape)
    strides = np.cumprod((1,) + tuple(reversed(m.out_shape[1:])))[::-1]
    out_offsets = sum((p * int(s) for p, s in zip(points, strides)),
                      np.zeros(offsets.size, np.int64))
    return bool(np.array_equal(offsets, out_offsets))


def is_identity(m: IndexMap) -> bool:
    return m.in_shape == m.out_shape and m.guard is sympy.true and not m.reduce and \
        tuple(m.exprs) == m.out_symbols


def folds_to_flat(m: IndexMap) -> bool:
    """True for a Reorganize map (a reshape: every element keeps its row-major position) whose
    input offset simplifies to the output's own flat offset with no division left: fused, it
    costs no index arithmetic and moves nothing, so it changes no loop's locality."""
    return classify(m) is MappingType.REORGANIZE and offset_folds(m)


def offset_folds(m: IndexMap) -> bool:
    """``folds_to_flat`` for a map already classified Reorganize: its input offset simplifies
    with no division left."""
    return not _flat_offset(m).has(FloorDiv, FloorMod)


# The shortest innermost run ``keeps_runs`` accepts: a multiple of every vector width the
# backends use (NEON's 4 floats, AVX2's 8, AVX-512's 16), so a vector never straddles two runs.
KEPT_RUN = 16


def keeps_runs(m: IndexMap, run: int = KEPT_RUN) -> bool:
    """True for a remap that moves whole runs along the output's innermost axis: the input
    offset steps by 1 along that axis, which no other term (no floor or modulo) involves, and
    its extent is a multiple of ``run`` (a transpose of outer axes, a head split
    ``(s, h*d) -> (h, s, d)``). A loop that writes contiguous vectors along that axis still
    does through the remap, only at other places."""
    if not m.out_shape or m.out_shape[-1] % run or m.reduce or m.data or m.guard is not sympy.true:
        return False
    return _steps_by_one(_flat_offset(m), m.out_symbols[-1])


def _flat_offset(m: IndexMap) -> sympy.Expr:
    """The row-major offset into ``m``'s input, simplified and expanded."""
    in_strides = np.cumprod((1,) + tuple(reversed(m.in_shape[1:])))[::-1]
    return sympy.expand(simplify_index(sum((e * int(s) for e, s in zip(m.exprs, in_strides)),
                                           sympy.Integer(0)), m.ranges))


def _steps_by_one(offset: sympy.Expr, sym: sympy.Symbol) -> bool:
    """Whether ``offset`` is ``sym`` plus terms free of it (no floor or modulo of it)."""
    return offset.coeff(sym) == 1 and sym not in sympy.expand(offset - sym).free_symbols


def reads_runs_along_reduction(m: IndexMap, run: int = KEPT_RUN) -> bool:
    """True for a reduction's read through a remap (``m``: the consumer's output and reduction
    index to the remap's source) that steps by 1 along one reduction axis, which no floor or
    modulo involves, of a multiple of ``run`` elements: the reduction still reads whole
    contiguous runs (attention's scores read ``transpose(k)`` along the head dimension, an NT
    product, whose operand the contraction's tiles pack into panels)."""
    if m.data or m.guard is not sympy.true:
        return False
    offset = _flat_offset(m)
    return any(n % run == 0 and _steps_by_one(offset, s) for s, n in m.reduce)
