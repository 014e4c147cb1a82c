"""Intensive operators as loop-IR data: MatMul, Gemm, Conv (any spatial rank, stride, padding,
dilation, groups), MaxPool/AveragePool, GlobalAverage/MaxPool, and the normalisations
BatchNormalization (inference), LayerNormalization and InstanceNormalization, and LRN (local
response normalisation across channels).

Because each is an index map plus a reduction, every backend runs it, and fusion inlines any
elementwise prologue into its loads and any epilogue into its store, not only a fixed list.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from ..dtypes import FLOATS, DType
from ..errors import AttributeError_, ShapeError
from ..ir.expr import Expr, IndexCond, Read, call, cast, const, reduce, select
from ..ir.node import Constant, Op, Value, constant, new_name
from ..mapping_types import FloorDiv, fresh_reduce_symbol, out_symbols
from ..mapping_types.index_map import simplify_guard
from ..shapes import prod
from .common import (broadcast_exprs, broadcast_read, broadcast_shape, check_value, int_attr,
                     int_list, make_op, normalize_axis, require_dtype, same_dtype)
from .reduce import reduce_op

Shape = tuple[int, ...]


def matmul(a: Value, b: Value) -> Op:
    """ONNX MatMul (NumPy semantics): batched, broadcast batch axes, 1-D operands."""
    a, b = check_value("MatMul", a, "A"), check_value("MatMul", b, "B")
    same_dtype("MatMul", [a, b])
    if a.rank == 0 or b.rank == 0:
        raise ShapeError("MatMul", a.name if a.rank == 0 else b.name, "rank >= 1", "a scalar")
    a_shape = (1,) + a.shape if a.rank == 1 else a.shape
    b_shape = b.shape + (1,) if b.rank == 1 else b.shape
    k = a_shape[-1]
    if b_shape[-2] != k:
        raise ShapeError("MatMul", b.name, f"size {k} (the last axis of '{a.name}')",
                         b.shape, b.rank - 2 if b.rank > 1 else 0)
    batch = _matmul_batch(a, b, a_shape[:-2], b_shape[:-2])
    full = batch + (a_shape[-2], b_shape[-1])
    shape = tuple(n for i, n in enumerate(full)
                  if not (a.rank == 1 and i == len(full) - 2)
                  and not (b.rank == 1 and i == len(full) - 1))
    o = list(out_symbols(len(shape)))
    # rebuild the full (batch, M, N) index from the output symbols
    if a.rank == 1:
        o.insert(len(batch), sympy.Integer(0))
    if b.rank == 1:
        o.append(sympy.Integer(0))
    r = fresh_reduce_symbol("k")
    a_idx = _batch_index(a_shape[:-2], batch, o) + [o[-2], r]
    b_idx = _batch_index(b_shape[:-2], batch, o) + [r, o[-1]]
    if a.rank == 1:
        a_idx = a_idx[-1:]
    if b.rank == 1:
        b_idx = b_idx[:-1]
    body = reduce("sum", call("mul", Read(a.dtype, 0, tuple(a_idx)),
                              Read(b.dtype, 1, tuple(b_idx))), ((r, k),))
    return make_op("MatMul", [a, b], shape, a.dtype, body)


def _matmul_batch(a: Value, b: Value, a_batch: Shape, b_batch: Shape) -> Shape:
    """The broadcast batch shape; a clash names the user's tensors and their whole shapes."""
    out: list[int] = []
    for back in range(max(len(a_batch), len(b_batch)), 0, -1):
        na = a_batch[-back] if len(a_batch) >= back else 1
        nb = b_batch[-back] if len(b_batch) >= back else 1
        if 1 not in (na, nb) and na != nb:
            raise ShapeError("MatMul", b.name, f"batch axes (all but the last two) that "
                             f"broadcast with '{a.name}' {a.shape} (equal or 1, aligned from "
                             f"the right)", b.shape, len(b_batch) - back)
        out.append(nb if na == 1 else na)
    return tuple(out)


def _batch_index(in_batch: Shape, batch: Shape, o: list[sympy.Expr]) -> list[sympy.Expr]:
    lead = len(batch) - len(in_batch)
    return [sympy.Integer(0) if n == 1 and batch[lead + i] != 1 else o[lead + i]
            for i, n in enumerate(in_batch)]


def gemm(a: Value, b: Value, c: Value | None = None, alpha: float = 1.0, beta: float = 1.0,
         transA: int = 0, transB: int = 0) -> Op:  # noqa: N803 - ONNX attribute names
    """ONNX Gemm: ``alpha * A' @ B' + beta * C`` with optional transposes, C broadcast."""
    a, b = check_value("Gemm", a, "A"), check_value("Gemm", b, "B")
    same_dtype("Gemm", [a, b] + ([c] if c is not None else []))
    for v in (a, b):
        if v.rank != 2:
            raise ShapeError("Gemm", v.name, "a matrix (rank 2)", v.shape)
    m, k = (a.shape[1], a.shape[0]) if transA else a.shape
    kb, n = (b.shape[1], b.shape[0]) if transB else b.shape
    if kb != k:
        raise ShapeError("Gemm", b.name, f"inner size {k}", b.shape, 1 if transB else 0)
    i, j = out_symbols(2)
    r = fresh_reduce_symbol("k")
    a_idx = (r, i) if transA else (i, r)
    b_idx = (j, r) if transB else (r, j)
    product = reduce("sum", call("mul", Read(a.dtype, 0, a_idx), Read(b.dtype, 1, b_idx)),
                     ((r, k),))
    body: Expr = product if alpha == 1 else call("mul", const(alpha, a.dtype), product)
    inputs = [a, b]
    if c is not None:
        c = check_value("Gemm", c, "C")
        if broadcast_shape("Gemm", [c, Value("y", (m, n), a.dtype)]) != (m, n):
            raise ShapeError("Gemm", c.name, f"a shape that broadcasts to {(m, n)}", c.shape)
        bias: Expr = broadcast_read(2, c, (m, n))
        if beta != 1:
            bias = call("mul", const(beta, a.dtype), bias)
        body = call("add", body, bias)
        inputs.append(c)
    attrs = {"alpha": alpha, "beta": beta, "transA": transA, "transB": transB}
    return make_op("Gemm", inputs, (m, n), a.dtype, body, attrs)


def _window(op: str, x: Value, kernel: Sequence[int], strides: Sequence[int] | None,
            pads: Sequence[int] | None, dilations: Sequence[int] | None, auto_pad: str,
            ceil_mode: int = 0) -> tuple[list[int], list[int], list[int], list[int]]:
    """Output sizes, strides, pads (begins then ends) and dilations of a sliding window over x's
    spatial axes (ONNX's formulas, auto_pad included)."""
    nd = x.rank - 2
    kernel = int_list(op, "kernel_shape", kernel, 1)
    strides = int_list(op, "strides", [1] * nd if strides is None else strides, 1)
    dilations = int_list(op, "dilations", [1] * nd if dilations is None else dilations, 1)
    if len(kernel) != nd or len(strides) != nd or len(dilations) != nd:
        raise AttributeError_(op, "kernel_shape/strides/dilations", f"{nd} values each",
                              (list(kernel), strides, dilations))
    spatial = x.shape[2:]
    eff = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-n // s) for n, s in zip(spatial, strides)]
        total = [max((o - 1) * s + e - n, 0) for o, s, e, n in zip(out, strides, eff, spatial)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        return out, strides, begin + [t - b for t, b in zip(total, begin)], dilations
    if auto_pad == "VALID":
        pads = [0] * (2 * nd)
    elif auto_pad != "NOTSET":
        raise AttributeError_(op, "auto_pad", "NOTSET, SAME_UPPER, SAME_LOWER or VALID", auto_pad)
    pads = int_list(op, "pads", [0] * (2 * nd) if pads is None else pads)
    if len(pads) != 2 * nd:
        raise AttributeError_(op, "pads", f"{2 * nd} values", pads)
    out = []
    for a, (n, s, e) in enumerate(zip(spatial, strides, eff)):
        span = n + pads[a] + pads[a + nd] - e
        size = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (size - 1) * s >= n + pads[a]:  # the last window must start inside
            size -= 1
        if size < 1:
            raise ShapeError(op, x.name, "a window that fits the padded input", x.shape, a + 2)
        out.append(size)
    return out, strides, pads, dilations


def window_index(out_axes: Sequence[sympy.Expr], kernel_axes: Sequence[sympy.Expr],
                 strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
                 sizes: Sequence[int]) -> tuple[list[sympy.Expr], sympy.Basic]:
    """The input's spatial index under a sliding window (output position times stride, plus
    kernel offset times dilation, minus the begin pad), and the guard that it lies inside an
    input of spatial ``sizes`` (reads outside are padding)."""
    idx = [o * s + k * d - p for o, k, s, d, p in
           zip(out_axes, kernel_axes, strides, dilations, begin)]
    inside = sympy.And(*(sympy.And(e >= 0, e < n) for e, n in zip(idx, sizes)))
    return idx, inside


def conv(x: Value, w: Value, b: Value | None = None, auto_pad: str = "NOTSET",
         dilations: Sequence[int] | None = None, group: int = 1,
         kernel_shape: Sequence[int] | None = None, pads: Sequence[int] | None = None,
         strides: Sequence[int] | None = None) -> Op:
    """ONNX Conv over 1-3 spatial axes: stride, padding (auto_pad too), dilation, groups
    (depthwise when group == channels), optional bias."""
    x, w = check_value("Conv", x, "X"), check_value("Conv", w, "W")
    require_dtype("Conv", x, FLOATS, "a float dtype")
    same_dtype("Conv", [x, w] + ([b] if b is not None else []))
    if x.rank < 3 or w.rank != x.rank:
        raise ShapeError("Conv", w.name, f"rank {x.rank} weights for input of rank {x.rank} "
                         "(N, C, spatial...)", w.shape)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    group = int_attr("Conv", "group", group, 1)
    kernel = int_list("Conv", "kernel_shape", w.shape[2:] if kernel_shape is None
                      else kernel_shape, 1)
    if list(w.shape[2:]) != kernel:
        raise AttributeError_("Conv", "kernel_shape", f"the weights' {list(w.shape[2:])}", kernel)
    if c % group or m % group or cg != c // group:
        raise ShapeError("Conv", w.name, f"{c // group} input channels per group (C={c}, "
                         f"group={group}) and M divisible by group", w.shape, 1)
    if b is not None and (b.rank != 1 or b.shape[0] != m):
        raise ShapeError("Conv", b.name, f"a bias of shape ({m},)", b.shape)
    out, strides_, pads_, dil = _window("Conv", x, kernel, strides, pads, dilations, auto_pad)
    begin = pads_[:len(kernel)]
    shape = (n, m, *out)
    o = out_symbols(len(shape))
    rc = fresh_reduce_symbol("c")
    rk = [fresh_reduce_symbol("kk") for _ in kernel]
    g = FloorDiv(o[1], m // group)
    spatial, inside = window_index(o[2:], rk, strides_, dil, begin, x.shape[2:])
    x_read = Read(x.dtype, 0, (o[0], g * cg + rc, *spatial), inside)
    w_read = Read(w.dtype, 1, (o[1], rc, *rk))
    axes = ((rc, cg), *zip(rk, kernel))
    body: Expr = reduce("sum", call("mul", x_read, w_read), tuple(axes))
    inputs = [x, w]
    if b is not None:
        body = call("add", body, Read(b.dtype, 2, (o[1],)))
        inputs.append(b)
    attrs = {"kernel_shape": kernel, "strides": strides_, "dilations": dil, "group": group,
             "pads": begin + _end_pads(x, kernel, strides_, begin, dil, out)}
    return make_op("Conv", inputs, shape, x.dtype, body, attrs)


def _end_pads(x: Value, kernel: list[int], strides: list[int], begin: list[int],
              dil: list[int], out: list[int]) -> list[int]:
    """End pads that reproduce ``out`` exactly (for attrs; the body only needs the begin)."""
    return [max((o - 1) * s + d * (k - 1) + 1 - n - b, 0)
            for o, s, d, k, n, b in zip(out, strides, dil, kernel, x.shape[2:], begin)]


def _pool(kind: str, x: Value, kernel_shape: Sequence[int], auto_pad: str, ceil_mode: int,
          dilations: Sequence[int] | None, pads: Sequence[int] | None,
          strides: Sequence[int] | None, count_include_pad: int = 0) -> Op:
    x = check_value(kind, x, "X")
    require_dtype(kind, x, FLOATS, "a float dtype")
    if x.rank < 3:
        raise ShapeError(kind, x.name, "(N, C, spatial...)", x.shape)
    kernel = int_list(kind, "kernel_shape", kernel_shape, 1)
    out, strides_, pads_, dil = _window(kind, x, kernel, strides, pads, dilations, auto_pad,
                                        ceil_mode)
    begin, end = pads_[:len(kernel)], pads_[len(kernel):]
    shape = (*x.shape[:2], *out)
    o = out_symbols(len(shape))
    rk = [fresh_reduce_symbol("kk") for _ in kernel]
    spatial, inside = window_index(o[2:], rk, strides_, dil, begin, x.shape[2:])
    read = Read(x.dtype, 0, (o[0], o[1], *spatial), inside)
    axes = tuple(zip(rk, kernel))
    valid = IndexCond(DType.bool, inside)
    if kind == "MaxPool":
        # A NaN in the window gives NaN, as ReduceMax, NumPy and PyTorch do. ONNX leaves it
        # open: its reference evaluator drops NaN, and onnxruntime 1.32 answers by position
        # (2x2 windows [1,NaN,3,4] -> 4, [1,3,4,NaN] -> NaN, [-inf,NaN,-inf,-inf] -> -3.4e38).
        body = reduce("max", select(valid, read, const(float("-inf"), x.dtype)), axes)
    elif _whole_windows(x.shape[2:], out, kernel, strides_, dil, begin, end, count_include_pad):
        # every window counts all its taps: the divisor is a constant, and the pool one sum
        # (a pooling window on OpenCL's CPUs) instead of two
        body = call("div", reduce("sum", read, axes), const(float(prod(kernel)), x.dtype))
    else:
        total = reduce("sum", read, axes)
        # the taps that count: inside the input, or (count_include_pad) inside the padded
        # window, clipped to the pads (the taps of a ceil_mode window past the end pad do not
        # count, as in onnxruntime and PyTorch)
        lows = [-p for p in begin] if count_include_pad else [0] * len(kernel)
        highs = [n + e if count_include_pad else n for n, e in zip(x.shape[2:], end)]
        body = call("div", total, _window_count(spatial, rk, kernel, lows, highs,
                                                dict(zip(o, shape)), x.dtype))
    attrs = {"kernel_shape": kernel, "strides": strides_, "dilations": dil, "pads": pads_,
             "ceil_mode": ceil_mode}
    if kind == "AveragePool":
        attrs["count_include_pad"] = count_include_pad
    return make_op(kind, [x], shape, x.dtype, body, attrs)


# A window count of at most this many taps along its axes together is written out tap by tap;
# beyond, it is a reduction of its own
COUNT_UNROLLED_TAPS = 32


def _window_count(spatial: Sequence[sympy.Expr], taps: Sequence[sympy.Symbol],
                  kernel: Sequence[int], lows: Sequence[int], highs: Sequence[int],
                  ranges: dict[sympy.Symbol, int], dtype: DType) -> Expr:
    """How many taps of each output's window have their index ``spatial`` in ``[low,
    high)`` on every axis. The condition is one per axis, so the count is the product over
    the axes of each axis's count, a sum of tap conditions on the output index alone: no
    second reduction beside the window's sum (ShuffleNet's 3x3 stride-2 pools 1.5x faster on
    OpenCL's 'item' schedule, bench/average_pool_count.py), and conditions that OpenCL's
    pooling window prints as lane masks (1.6-2.7x faster again). A tap that counts for every
    output is a constant; longer windows sum their taps in a reduction."""
    inside = sympy.And(*(sympy.And(e >= lo, e < hi) for e, lo, hi in zip(spatial, lows, highs)))
    if sum(kernel) > COUNT_UNROLLED_TAPS:
        return reduce("sum", cast(IndexCond(DType.bool, inside), dtype),
                      tuple(zip(taps, kernel)))
    count: Expr | None = None
    for e, tap, k, lo, hi in zip(spatial, taps, kernel, lows, highs):
        always, terms = 0, list[Expr]()
        for t in range(k):
            at = e.subs(tap, t)
            cond = simplify_guard(sympy.And(at >= lo, at < hi), ranges)
            if cond is sympy.true:
                always += 1
            elif cond is not sympy.false:
                terms.append(select(IndexCond(DType.bool, cond), const(1.0, dtype),
                                    const(0.0, dtype)))
        parts = [const(float(always), dtype), *terms] if always else terms
        axis: Expr = parts[0] if parts else const(0.0, dtype)
        for term in parts[1:]:
            axis = call("add", axis, term)
        count = axis if count is None else call("mul", count, axis)
    assert count is not None
    return count


def _whole_windows(sizes: Sequence[int], out: Sequence[int], kernel: Sequence[int],
                   strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
                   end: Sequence[int], count_include_pad: int) -> bool:
    """Whether every window of an AveragePool counts all its taps: no tap of any window
    falls in the begin pad (unless pads count) or past the input's end (and end pad, when
    pads count), so the count is the kernel's size."""
    for n, o, k, s, d, lo, hi in zip(sizes, out, kernel, strides, dilations, begin, end):
        last = (o - 1) * s + (k - 1) * d - lo  # the last tap of the last window
        counted_end = n + hi if count_include_pad else n  # taps from here on do not count
        if last >= counted_end or (lo > 0 and not count_include_pad):
            return False
    return True


def max_pool(x: Value, kernel_shape: Sequence[int], auto_pad: str = "NOTSET", ceil_mode: int = 0,
             dilations: Sequence[int] | None = None, pads: Sequence[int] | None = None,
             storage_order: int = 0, strides: Sequence[int] | None = None) -> Op:
    """ONNX MaxPool (the Y output): padding never wins the max."""
    del storage_order  # only affects the Indices output, which is not produced
    return _pool("MaxPool", x, kernel_shape, auto_pad, ceil_mode, dilations, pads, strides)


def average_pool(x: Value, kernel_shape: Sequence[int], auto_pad: str = "NOTSET",
                 ceil_mode: int = 0, count_include_pad: int = 0,
                 dilations: Sequence[int] | None = None, pads: Sequence[int] | None = None,
                 strides: Sequence[int] | None = None) -> Op:
    """ONNX AveragePool: the mean over the window's valid (or, with count_include_pad, padded)
    positions."""
    return _pool("AveragePool", x, kernel_shape, auto_pad, ceil_mode, dilations, pads, strides,
                 count_include_pad)


def global_pool(kind: str, x: Value) -> Op:
    """ONNX GlobalAveragePool / GlobalMaxPool (``kind``, the ONNX op type): reduce every
    spatial axis, keeping them as 1."""
    reductions = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
    if kind not in reductions:  # any other word would otherwise have pooled silently
        raise AttributeError_("global_pool", "kind", "'GlobalAveragePool' or 'GlobalMaxPool'",
                              kind)
    x = check_value(kind, x, "X")
    op = reduce_op(reductions[kind], x, list(range(2, x.rank)), 1)
    op.kind, op.attrs = kind, {}
    return op


def batch_normalization(x: Value, scale: Value, b: Value, mean: Value, var: Value,
                        epsilon: float = 1e-5, momentum: float = 0.9,
                        training_mode: int = 0) -> Op:
    """ONNX BatchNormalization in inference: per-channel (axis 1) affine normalisation.

    With constant parameters (a model's initializers) the operator's inputs are ``x`` and two
    per-channel constants computed here, ``s = scale / sqrt(var + epsilon)`` and
    ``t = B - mean * s``, and it computes ``x * s + t`` as one multiply-add (``muladd``, one
    FMA where the device has a fast one; as onnxruntime's kernel does): no kernel then
    evaluates the square root per output (fused after a 1x1 convolution over a short
    reduction, the rsqrt of every row cost 1.05-1.5x its time). Parameters whose ``s``
    or ``t`` would not be finite keep the five inputs and the formula as written."""
    x = check_value("BatchNormalization", x, "X")
    if training_mode:
        raise AttributeError_("BatchNormalization", "training_mode", "0 (inference)",
                              training_mode)
    del momentum  # training only
    require_dtype("BatchNormalization", x, FLOATS, "a float dtype")
    params = [scale, b, mean, var]
    same_dtype("BatchNormalization", [x, *params])
    c = x.shape[1] if x.rank > 1 else 1
    for name, v in zip(("scale", "B", "input_mean", "input_var"), params):
        if v.shape != (c,):
            raise ShapeError("BatchNormalization", v.name, f"shape ({c},) for input '{name}'",
                             v.shape)
    o = out_symbols(x.rank)
    ch = (o[1],) if x.rank > 1 else (sympy.Integer(0),)
    xs = Read(x.dtype, 0, tuple(o))
    name = new_name("BatchNormalization")
    affine = _constant_affine(name, x, params, epsilon)
    if affine is not None:
        body = call("muladd", xs, Read(x.dtype, 1, ch), Read(x.dtype, 2, ch))
        return make_op("BatchNormalization", [x, *affine], x.shape, x.dtype, body,
                       {"epsilon": epsilon}, name=name)
    s, bb, mu, va = (Read(x.dtype, k + 1, ch) for k in range(4))
    inv = call("rsqrt", call("add", va, const(epsilon, x.dtype)))
    body = call("add", call("mul", call("mul", call("sub", xs, mu), inv), s), bb)
    return make_op("BatchNormalization", [x, *params], x.shape, x.dtype, body,
                   {"epsilon": epsilon}, name=name)


def _constant_affine(name: str, x: Value, params: Sequence[Value], epsilon: float
                     ) -> tuple[Constant, Constant] | None:
    """``s`` and ``t`` (``batch_normalization``) as constants named after the operator
    ``name`` (two normalisations of one ``x`` each have their own), where the four parameters
    are constants and both come out finite; else None."""
    values = [np.asarray(v.value, np.float64) for v in params if isinstance(v, Constant)]
    if len(values) < 4:
        return None
    gamma, beta, mu, va = values
    s, t = _affine(gamma, beta, mu, va, epsilon)
    s, t = s.astype(x.dtype.numpy), t.astype(x.dtype.numpy)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        return None
    return constant(f"{name}_scale", s), constant(f"{name}_shift", t)


def _affine(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray,
            epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(all="ignore"):
        s = gamma / np.sqrt(var + epsilon)
        return s, beta - mean * s


def batch_norm_affine(bn: Op) -> tuple[np.ndarray, np.ndarray] | None:
    """A BatchNormalization's per-channel ``(s, t)`` with ``y = x * s + t`` (float64) when
    its parameters are constants: the two it reads, or computed from its four; else None."""
    values = [np.asarray(v.value, np.float64) for v in bn.inputs[1:] if isinstance(v, Constant)]
    if len(values) < len(bn.inputs) - 1:
        return None
    if len(values) == 2:
        return values[0], values[1]
    gamma, beta, mu, va = values
    return _affine(gamma, beta, mu, va, bn.attrs["epsilon"])


def _normalize(kind: str, x: Value, axes: tuple[int, ...], epsilon: float,
               scale: Read | None, bias: Read | None) -> Expr:
    """(x - mean) / sqrt(var + eps) * scale + bias over ``axes``, two hoistable reductions.

    The mean is the row's first element plus the mean of the differences from it: for a row of
    values close together (33 of 34 equal, the fuzzer's case) that sums small numbers, whose
    rounding is small against the mean (exact there), where summing the values themselves left
    the mean 5 ulps off, which x - mean turned into 2e-4 relative."""
    o = out_symbols(x.rank)
    count = prod(x.shape[a] for a in axes)

    def over_axes() -> tuple[Read, tuple[tuple[sympy.Symbol, int], ...]]:
        syms = {a: fresh_reduce_symbol("r") for a in axes}
        idx = tuple(syms.get(a, o[a]) for a in range(x.rank))
        return Read(x.dtype, 0, idx), tuple((syms[a], x.shape[a]) for a in axes)

    first = Read(x.dtype, 0, tuple(sympy.Integer(0) if a in axes else o[a]
                                   for a in range(x.rank)))
    r1, ax1 = over_axes()
    mean = call("add", first, call("div", reduce("sum", call("sub", r1, first), ax1),
                                   const(count, x.dtype)))
    r2, ax2 = over_axes()
    centred = call("sub", r2, mean)
    var = call("div", reduce("sum", call("mul", centred, centred), ax2), const(count, x.dtype))
    here = call("sub", Read(x.dtype, 0, tuple(o)), mean)
    body: Expr = call("mul", here, call("rsqrt", call("add", var, const(epsilon, x.dtype))))
    if scale is not None:
        body = call("mul", body, scale)
    if bias is not None:
        body = call("add", body, bias)
    return body


def layer_normalization(x: Value, scale: Value, b: Value | None = None, axis: int = -1,
                        epsilon: float = 1e-5, stash_type: int = 1) -> Op:
    """ONNX LayerNormalization (the Y output): normalise over axes ``axis..rank-1`` in one
    kernel (mean and variance are two reductions hoisted per row)."""
    x = check_value("LayerNormalization", x, "X")
    require_dtype("LayerNormalization", x, FLOATS, "a float dtype")
    del stash_type  # computation runs in the compute type of x (f32 for f16)
    axis = normalize_axis("LayerNormalization", x, axis)
    norm_shape = x.shape[axis:]
    inputs = [x, scale] + ([b] if b is not None else [])
    same_dtype("LayerNormalization", inputs)
    for v in inputs[1:]:
        if broadcast_shape("LayerNormalization", [v, Value("n", norm_shape, x.dtype)]) \
                != norm_shape:
            raise ShapeError("LayerNormalization", v.name,
                             f"a shape that broadcasts to {norm_shape}", v.shape)
    s = Read(x.dtype, 1, broadcast_exprs(scale.shape, x.shape))
    bias = Read(x.dtype, 2, broadcast_exprs(b.shape, x.shape)) if b is not None else None
    body = _normalize("LayerNormalization", x, tuple(range(axis, x.rank)), epsilon, s, bias)
    return make_op("LayerNormalization", inputs, x.shape, x.dtype, body,
                   {"axis": axis, "epsilon": epsilon})


def instance_normalization(x: Value, scale: Value, b: Value, epsilon: float = 1e-5) -> Op:
    """ONNX InstanceNormalization: normalise each (n, c) over the spatial axes."""
    x = check_value("InstanceNormalization", x, "input")
    require_dtype("InstanceNormalization", x, FLOATS, "a float dtype")
    same_dtype("InstanceNormalization", [x, scale, b])
    if x.rank < 3:
        raise ShapeError("InstanceNormalization", x.name, "(N, C, spatial...)", x.shape)
    c = x.shape[1]
    for v in (scale, b):
        if v.shape != (c,):
            raise ShapeError("InstanceNormalization", v.name, f"shape ({c},)", v.shape)
    o = out_symbols(x.rank)
    body = _normalize("InstanceNormalization", x, tuple(range(2, x.rank)), epsilon,
                      Read(x.dtype, 1, (o[1],)), Read(x.dtype, 2, (o[1],)))
    return make_op("InstanceNormalization", [x, scale, b], x.shape, x.dtype, body,
                   {"epsilon": epsilon})


def lrn(x: Value, size: int, alpha: float = 0.0001, beta: float = 0.75, bias: float = 1.0) -> Op:
    """ONNX LRN: ``x / (bias + alpha / size * square_sum) ** beta``, where ``square_sum`` sums
    the squares of the channels ``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` clipped to
    the tensor's channels (axis 1): a window over channels, Many-to-Many like a pool."""
    x = check_value("LRN", x, "X")
    require_dtype("LRN", x, FLOATS, "a float dtype")
    if x.rank < 3:
        raise ShapeError("LRN", x.name, "(N, C, spatial...)", x.shape)
    size = int_attr("LRN", "size", size, 1)
    o = out_symbols(x.rank)
    r = fresh_reduce_symbol("c")
    channel = o[1] - (size - 1) // 2 + r
    inside = sympy.And(channel >= 0, channel < x.shape[1])
    near = Read(x.dtype, 0, (o[0], channel, *o[2:]), inside)  # 0 outside the channels
    square_sum = reduce("sum", call("mul", near, near), ((r, size),))
    scale = call("add", const(bias, x.dtype), call("mul", const(alpha / size, x.dtype),
                                                     square_sum))
    body = call("div", Read(x.dtype, 0, tuple(o)), call("pow", scale, const(beta, x.dtype)))
    return make_op("LRN", [x], x.shape, x.dtype, body,
                   {"size": size, "alpha": alpha, "beta": beta, "bias": bias})
