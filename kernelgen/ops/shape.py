"""Data-movement operators. Inside a fused block they are pure index arithmetic: Reorganize
(Reshape, Flatten, Squeeze, Unsqueeze), Shuffle (Transpose, DepthToSpace, SpaceToDepth),
One-to-One pieces (Slice, Concat, Split, Pad) and One-to-Many (Expand, Gather, Resize)."""
from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import sympy

from ..dtypes import INTS, DType
from ..errors import AttributeError_, ShapeError
from ..ir.expr import Expr, IndexCond, Read, const, select
from ..ir.indexing import clamp_index
from ..ir.node import Op, Value
from ..mapping_types import (FloorDiv, FloorMod, evaluate, fresh_reduce_symbol, out_symbols,
                             simplify_index)
from ..shapes import prod, row_major_strides
from .common import (broadcast_exprs, broadcast_shape, check_value, int_attr, int_list, make_op,
                     normalize_axes, normalize_axis, require_dtype, same_dtype)

Shape = tuple[int, ...]


def _move(kind: str, x: Value, shape: Shape, exprs: Sequence[sympy.Expr], attrs: dict,
          guard: sympy.Basic = sympy.true) -> Op:
    ranges = dict(zip(out_symbols(len(shape)), shape))
    exprs = tuple(simplify_index(sympy.sympify(e), ranges) for e in exprs)
    return make_op(kind, [x], shape, x.dtype, Read(x.dtype, 0, exprs, guard), attrs)


def _reshape_to(kind: str, x: Value, shape: Shape, attrs: dict) -> Op:
    """Any reshape: the flat row-major offset is kept, each input axis is recovered from it."""
    if prod(shape) != x.numel:
        raise ShapeError(kind, x.name, f"a shape with {x.numel} elements", shape)
    out_strides = zip(out_symbols(len(shape)), row_major_strides(shape))
    flat = sum((o * s for o, s in out_strides), sympy.Integer(0))
    exprs = [FloorMod(FloorDiv(flat, s), n) for s, n in zip(row_major_strides(x.shape), x.shape)]
    return _move(kind, x, shape, exprs, attrs)


def transpose(x: Value, perm: Sequence[int] | None = None) -> Op:
    """ONNX Transpose; ``perm`` defaults to reversing the axes."""
    x = check_value("Transpose", x, "data")
    perm = tuple(range(x.rank))[::-1] if perm is None else tuple(perm)
    if len(perm) != x.rank:
        raise AttributeError_("Transpose", "perm", f"a permutation of 0..{x.rank - 1}", perm)
    normalize_axes("Transpose", x, perm, attribute="perm")
    perm = tuple(p % x.rank for p in perm)
    o = out_symbols(x.rank)
    exprs = [o[perm.index(a)] for a in range(x.rank)]
    return _move("Transpose", x, tuple(x.shape[p] for p in perm), exprs, {"perm": list(perm)})


def reshape(x: Value, shape: Sequence[int], allowzero: int = 0) -> Op:
    """ONNX Reshape: one -1 is inferred; 0 copies the input dimension unless ``allowzero``."""
    x = check_value("Reshape", x, "data")
    dims = [x.shape[i] if d == 0 and not allowzero and i < x.rank else d
            for i, d in enumerate(int_list("Reshape", "shape", shape))]
    if dims.count(-1) > 1 or any(d < -1 or d == 0 for d in dims):
        raise AttributeError_("Reshape", "shape", "positive sizes, at most one -1", list(shape))
    if -1 in dims:
        known = prod(d for d in dims if d != -1)
        if x.numel % known:
            raise ShapeError("Reshape", x.name, f"a shape whose known sizes divide {x.numel}",
                             tuple(shape))
        dims[dims.index(-1)] = x.numel // known
    return _reshape_to("Reshape", x, tuple(dims), {"shape": list(shape)})


def flatten(x: Value, axis: int = 1) -> Op:
    """ONNX Flatten to 2-D: ``(prod(shape[:axis]), prod(shape[axis:]))``."""
    x = check_value("Flatten", x, "input")
    axis = int_attr("Flatten", "axis", axis)
    if not -x.rank <= axis <= x.rank:
        raise ShapeError("Flatten", x.name, f"-{x.rank} <= axis <= {x.rank}", str(axis))
    if axis < 0:  # counted from the back over the rank (ONNX: -1 keeps the last axis apart)
        axis += x.rank
    shape = (prod(x.shape[:axis]), prod(x.shape[axis:]))
    return _reshape_to("Flatten", x, shape, {"axis": axis})


def squeeze(x: Value, axes: Sequence[int] | None = None) -> Op:
    """ONNX Squeeze: drop the listed size-1 axes (all size-1 axes when none are listed)."""
    x = check_value("Squeeze", x, "data")
    norm = tuple(a for a, n in enumerate(x.shape) if n == 1) if axes is None \
        else normalize_axes("Squeeze", x, axes)
    for a in norm:
        if x.shape[a] != 1:
            raise ShapeError("Squeeze", x.name, "size 1 on a squeezed axis", x.shape, a)
    shape = tuple(n for a, n in enumerate(x.shape) if a not in norm)
    return _reshape_to("Squeeze", x, shape, {"axes": list(norm)})


def unsqueeze(x: Value, axes: Sequence[int]) -> Op:
    """ONNX Unsqueeze: insert size-1 axes at the listed positions of the output."""
    x = check_value("Unsqueeze", x, "data")
    rank = x.rank + len(axes)
    norm = normalize_axes("Unsqueeze", x, axes, rank)
    dims = iter(x.shape)
    shape = tuple(1 if a in norm else next(dims) for a in range(rank))
    return _reshape_to("Unsqueeze", x, shape, {"axes": list(norm)})


def slice_op(x: Value, starts: Sequence[int], ends: Sequence[int],
             axes: Sequence[int] | None = None, steps: Sequence[int] | None = None) -> Op:
    """ONNX Slice with clamped starts/ends and any non-zero steps, negative included."""
    x = check_value("Slice", x, "data")
    starts, ends = int_list("Slice", "starts", starts), int_list("Slice", "ends", ends)
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else int_list("Slice", "steps", steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise AttributeError_("Slice", "starts/ends/axes/steps", "lists of equal length",
                              (list(starts), list(ends), axes, steps))
    norm = normalize_axes("Slice", x, axes)
    o = out_symbols(x.rank)
    exprs: list[sympy.Expr] = list(o)
    shape = list(x.shape)
    for a, start, end, step in zip(norm, starts, ends, steps):
        if step == 0:
            raise AttributeError_("Slice", "steps", "non-zero steps", steps)
        begin, stop, step = slice(start, end, step).indices(x.shape[a])
        shape[a] = len(range(begin, stop, step))
        if shape[a] == 0:
            raise ShapeError("Slice", x.name, "a non-empty slice (empty tensors are not supported)",
                             f"[{start}:{end}:{step}] of size {x.shape[a]}", a)
        exprs[a] = begin + step * o[a]
    attrs = {"starts": list(starts), "ends": list(ends), "axes": list(norm), "steps": steps}
    return _move("Slice", x, tuple(shape), exprs, attrs)


def concat(values: Sequence[Value], axis: int) -> Op:
    """ONNX Concat: each output element comes from exactly one input (a guarded read)."""
    if isinstance(values, Value) or not isinstance(values, Sequence) or not values:
        raise ShapeError("Concat", None, "a non-empty list of input tensors (concat([a, b], "
                         "axis))", repr(values) if not isinstance(values, Value)
                         else f"the tensor '{values.name}'")
    values = [check_value("Concat", v, f"inputs[{k}]") for k, v in enumerate(values)]
    first = values[0]
    same_dtype("Concat", values)
    axis = normalize_axis("Concat", first, axis)
    for v in values[1:]:
        if v.rank != first.rank:
            raise ShapeError("Concat", v.name, f"rank {first.rank}", v.shape)
        for a in range(first.rank):
            if a != axis and v.shape[a] != first.shape[a]:
                raise ShapeError("Concat", v.name, f"size {first.shape[a]} like '{first.name}'",
                                 v.shape, a)
    shape = list(first.shape)
    shape[axis] = sum(v.shape[axis] for v in values)
    o = out_symbols(first.rank)
    body: Expr | None = None
    offset = shape[axis]
    for k in reversed(range(len(values))):  # build the select chain from the last input back
        offset -= values[k].shape[axis]
        exprs = tuple(o[a] - offset if a == axis else o[a] for a in range(first.rank))
        inside = sympy.And(o[axis] >= offset, o[axis] < offset + values[k].shape[axis])
        read = Read(first.dtype, k, exprs, inside)
        body = read if body is None else select(IndexCond(DType.bool, o[axis] < offset
                                                          + values[k].shape[axis]), read, body)
    return make_op("Concat", values, tuple(shape), first.dtype, body, {"axis": axis})


def split(x: Value, split: Sequence[int] | None = None, axis: int = 0,
          num_outputs: int | None = None) -> tuple[Op, ...]:
    """ONNX Split: one Slice-like operator per output."""
    x = check_value("Split", x, "input")
    axis = normalize_axis("Split", x, axis)
    n = x.shape[axis]
    if split is None:
        if num_outputs is None:
            raise AttributeError_("Split", "num_outputs", "a positive count when 'split' is absent",
                                  num_outputs)
        count = int_attr("Split", "num_outputs", num_outputs, 1)
        chunk = -(-n // count)  # ONNX: pieces of ceil(n / count), the last one smaller
        split = [min(chunk, n - k * chunk) for k in range(count)]
        if split[-1] < 1:
            raise AttributeError_("Split", "num_outputs", f"a count that splits axis {axis} of "
                                  f"'{x.name}' (size {n}) into non-empty pieces of "
                                  f"ceil({n}/count) (at most {n})", num_outputs)
    split = int_list("Split", "split", split)
    if sum(split) != n or any(s < 1 for s in split):
        raise AttributeError_("Split", "split", f"positive sizes summing to {n} (axis {axis})",
                              list(split))
    outs, start = [], 0
    for k, size in enumerate(split):
        piece = slice_op(x, [start], [start + size], [axis])
        piece.kind, piece.attrs = "Split", {"axis": axis, "split": list(split), "output": k}
        outs.append(piece)
        start += size
    return tuple(outs)


def expand(x: Value, shape: Sequence[int]) -> Op:
    """ONNX Expand: broadcast ``x`` against ``shape``."""
    x = check_value("Expand", x, "input")
    target = Value("shape", tuple(int_list("Expand", "shape", shape, 1)), x.dtype)
    out = broadcast_shape("Expand", [x, target])
    return _move("Expand", x, out, broadcast_exprs(x.shape, out), {"shape": list(shape)})


def pad(x: Value, pads: Sequence[int], constant_value: float = 0.0, mode: str = "constant",
        axes: Sequence[int] | None = None) -> Op:
    """ONNX Pad, modes 'constant' and 'edge'; negative pads crop."""
    x = check_value("Pad", x, "data")
    pads = int_list("Pad", "pads", pads)
    axes = list(range(x.rank)) if axes is None else list(normalize_axes("Pad", x, axes))
    if len(pads) != 2 * len(axes):
        raise AttributeError_("Pad", "pads", f"{2 * len(axes)} values (begins then ends)",
                              list(pads))
    if mode not in ("constant", "edge"):
        raise AttributeError_("Pad", "mode", "'constant' or 'edge'", mode)
    o = out_symbols(x.rank)
    exprs: list[sympy.Expr] = list(o)
    shape = list(x.shape)
    inside = sympy.true
    for k, a in enumerate(axes):
        begin, end = int(pads[k]), int(pads[k + len(axes)])
        shape[a] = x.shape[a] + begin + end
        if shape[a] < 1:
            raise ShapeError("Pad", x.name, "a non-empty padded axis", tuple(shape), a)
        src = o[a] - begin
        if mode == "edge":
            exprs[a] = sympy.Max(0, sympy.Min(x.shape[a] - 1, src))
        else:
            exprs[a] = src
            inside = sympy.And(inside, src >= 0, src < x.shape[a])
    attrs = {"pads": list(pads), "mode": mode, "constant_value": constant_value, "axes": axes}
    ranges = dict(zip(o, shape))
    read = Read(x.dtype, 0, tuple(simplify_index(e, ranges) for e in exprs), inside)
    body = read if inside is sympy.true else select(IndexCond(DType.bool, inside), read,
                                                    const(constant_value, x.dtype))
    return make_op("Pad", [x], tuple(shape), x.dtype, body, attrs)


def gather(data: Value, indices: Value, axis: int = 0) -> Op:
    """ONNX Gather along one axis; negative indices count from the end."""
    data = check_value("Gather", data, "data")
    indices = check_value("Gather", indices, "indices")
    require_dtype("Gather", indices, INTS, "int32 or int64")
    axis = normalize_axis("Gather", data, axis)
    q = indices.rank
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    o = out_symbols(len(shape))
    n = data.shape[axis]
    raw = Read(indices.dtype, 1, tuple(o[axis:axis + q]))
    v = fresh_reduce_symbol("g")
    exprs = (*o[:axis], v, *o[axis + q:])
    # wrapped once and clamped: generated code never reads outside ``data``; the interpreter
    # and the call-time check (exec/bounds.py) report an index outside [-n, n-1]
    body = Read(data.dtype, 0, tuple(exprs), sympy.true, ((v, n, clamp_index(raw, n)),))
    return make_op("Gather", [data, indices], shape, data.dtype, body, {"axis": axis})


def depth_to_space(x: Value, blocksize: int, mode: str = "DCR") -> Op:
    """ONNX DepthToSpace on NCHW, modes DCR and CRD."""
    x = check_value("DepthToSpace", x, "input")
    b = int_attr("DepthToSpace", "blocksize", blocksize, 1)
    if x.rank != 4 or x.shape[1] % (b * b):
        raise ShapeError("DepthToSpace", x.name, f"NCHW with C divisible by {b * b}", x.shape, 1)
    if mode not in ("DCR", "CRD"):
        raise AttributeError_("DepthToSpace", "mode", "'DCR' or 'CRD'", mode)
    n, c, h, w = x.shape
    cc = c // (b * b)
    o = out_symbols(4)
    bh, bw = FloorMod(o[2], b), FloorMod(o[3], b)
    ch = bh * b * cc + bw * cc + o[1] if mode == "DCR" else o[1] * b * b + bh * b + bw
    exprs = [o[0], ch, FloorDiv(o[2], b), FloorDiv(o[3], b)]
    return _move("DepthToSpace", x, (n, cc, h * b, w * b), exprs, {"blocksize": b, "mode": mode})


def space_to_depth(x: Value, blocksize: int) -> Op:
    """ONNX SpaceToDepth on NCHW (inverse of DepthToSpace in DCR mode)."""
    x = check_value("SpaceToDepth", x, "input")
    b = int_attr("SpaceToDepth", "blocksize", blocksize, 1)
    if x.rank != 4 or x.shape[2] % b or x.shape[3] % b:
        raise ShapeError("SpaceToDepth", x.name, f"NCHW with H and W divisible by {b}", x.shape)
    n, c, h, w = x.shape
    o = out_symbols(4)
    bh, bw, ch = FloorDiv(o[1], b * c), FloorMod(FloorDiv(o[1], c), b), FloorMod(o[1], c)
    exprs = [o[0], ch, o[2] * b + bh, o[3] * b + bw]
    return _move("SpaceToDepth", x, (n, c * b * b, h // b, w // b), exprs, {"blocksize": b})


_COORD_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize(x: Value, scales: Sequence[float] | None = None, sizes: Sequence[int] | None = None,
           mode: str = "nearest", coordinate_transformation_mode: str = "half_pixel",
           nearest_mode: str = "round_prefer_floor") -> Op:
    """ONNX Resize, nearest mode, with every coordinate transformation and rounding rule.

    Each axis's source index is exact integer arithmetic ``FloorDiv(a*o + b, c)`` (clamped),
    verified at build time against the ONNX formula evaluated in float64.
    """
    x = check_value("Resize", x, "X")
    if mode != "nearest":
        raise AttributeError_("Resize", "mode", "'nearest'", mode)
    if coordinate_transformation_mode not in _COORD_MODES:
        raise AttributeError_("Resize", "coordinate_transformation_mode", str(_COORD_MODES),
                              coordinate_transformation_mode)
    if nearest_mode not in _NEAREST_MODES:
        raise AttributeError_("Resize", "nearest_mode", str(_NEAREST_MODES), nearest_mode)
    if (scales is None) == (sizes is None) or len(scales or sizes or ()) != x.rank:
        raise AttributeError_("Resize", "scales/sizes",
                              f"exactly one of them, with {x.rank} values",
                              (scales, sizes))
    if sizes is not None:
        out = tuple(int_list("Resize", "sizes", sizes))
        scale = [Fraction(m, n) for m, n in zip(out, x.shape)]
    else:
        scale = [Fraction(float(s)).limit_denominator(1 << 12) for s in scales]  # type: ignore[union-attr]
        out = tuple(int(np.floor(n * float(s))) for n, s in zip(x.shape, scales))  # type: ignore[arg-type]
    o = out_symbols(x.rank)
    exprs = []
    for a, (n, m, s) in enumerate(zip(x.shape, out, scale)):
        if m < 1:
            raise ShapeError("Resize", x.name, "a non-empty output", out, a)
        true_scale = float(scales[a]) if scales is not None else m / n
        exprs.append(_nearest_axis(o[a], n, m, s, true_scale, coordinate_transformation_mode,
                                   nearest_mode, x.name, a))
    attrs = {"scales": list(scales) if scales else None, "sizes": list(sizes) if sizes else None,
             "coordinate_transformation_mode": coordinate_transformation_mode,
             "nearest_mode": nearest_mode}
    return _move("Resize", x, out, exprs, attrs)


def _nearest_axis(o: sympy.Symbol, n: int, m: int, s: Fraction, true_scale: float, coord: str,
                  rounding: str, name: str, axis: int) -> sympy.Expr:
    # Source coordinate as num(o) / den with integer num, den > 0.
    p, q = s.numerator, s.denominator  # s = p/q, so x/s = x*q/p
    if coord == "asymmetric":
        num, den = o * q, sympy.Integer(p)
    elif coord == "tf_half_pixel_for_nn":
        num, den = (2 * o + 1) * q, sympy.Integer(2 * p)
    elif coord == "align_corners":
        num, den = (o * (n - 1), sympy.Integer(m - 1)) if m > 1 else \
            (sympy.Integer(0), sympy.Integer(1))
    elif coord == "pytorch_half_pixel" and m == 1:
        num, den = sympy.Integer(0), sympy.Integer(1)
    else:  # half_pixel: (o + 1/2)/s - 1/2
        num, den = (2 * o + 1) * q - p, sympy.Integer(2 * p)
    d = int(den)
    if rounding == "floor":
        idx = FloorDiv(num, d)
    elif rounding == "ceil":
        idx = FloorDiv(num + d - 1, d)
    elif rounding == "round_prefer_ceil":  # floor(x + 1/2)
        idx = FloorDiv(2 * num + d, 2 * d)
    else:  # round_prefer_floor: ceil(x - 1/2)
        idx = FloorDiv(2 * num - d + 2 * d - 1, 2 * d)
    expr = sympy.Max(0, sympy.Min(n - 1, idx))
    _check_nearest(expr, o, n, m, true_scale, coord, rounding, name, axis)
    return expr


def _check_nearest(expr: sympy.Expr, o: sympy.Symbol, n: int, m: int, scale: float, coord: str,
                   rounding: str, name: str, axis: int) -> None:
    """Compare the integer formula with ONNX's float64 one on every output position."""
    pos = np.arange(m, dtype=np.float64)
    x = {"asymmetric": pos / scale, "tf_half_pixel_for_nn": (pos + 0.5) / scale,
         "align_corners": pos * (n - 1) / (m - 1) if m > 1 else pos * 0,
         "pytorch_half_pixel": (pos + 0.5) / scale - 0.5 if m > 1 else pos * 0,
         "half_pixel": (pos + 0.5) / scale - 0.5}[coord]
    ref = {"floor": np.floor(x), "ceil": np.ceil(x), "round_prefer_ceil": np.floor(x + 0.5),
           "round_prefer_floor": np.ceil(x - 0.5)}[rounding]
    ref = np.clip(ref, 0, n - 1).astype(np.int64)
    got = np.broadcast_to(evaluate(expr, {o: np.arange(m, dtype=np.int64)}), (m,))
    if not np.array_equal(got, ref):
        raise ShapeError("Resize", name, "a scale that is a ratio of small integers "
                         "(the nearest index must be exact integer arithmetic)", str(scale), axis)
