"""Reductions and row normalisations (Many-to-Many): ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/
LogSum/LogSumExp over any axes, Softmax and LogSoftmax over one axis."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from ..dtypes import FLOATS, NUMERIC, DType
from ..ir.expr import Expr, Read, call, const, reduce, select
from ..ir.node import Op, Value
from ..mapping_types import fresh_reduce_symbol, out_symbols
from .common import check_value, make_op, normalize_axes, normalize_axis, require_dtype

E = Expr


def _reduced_read(x: Value, axes: tuple[int, ...], keepdims: bool
                  ) -> tuple[Read, tuple[tuple[sympy.Symbol, int], ...], tuple[int, ...]]:
    """Read ``x`` with fresh reduction symbols on ``axes``; other axes follow the output index."""
    out_shape = tuple(1 if a in axes else n for a, n in enumerate(x.shape)
                      if keepdims or a not in axes)
    o = iter(out_symbols(len(out_shape)))
    exprs: list[sympy.Expr] = []
    red: list[tuple[sympy.Symbol, int]] = []
    for a, n in enumerate(x.shape):
        if a in axes:
            if keepdims:
                next(o)
            r = fresh_reduce_symbol()
            red.append((r, n))
            exprs.append(r)
        else:
            exprs.append(next(o))
    return Read(x.dtype, 0, tuple(exprs)), tuple(red), out_shape


# kind -> (dtypes, body builder from (read, axes, count) to the reduced value)
def _lse(x: Value, axes: tuple[int, ...], keepdims: bool) -> tuple[E, tuple[int, ...]]:
    r1, ax1, shape = _reduced_read(x, axes, keepdims)
    r2, ax2, _ = _reduced_read(x, axes, keepdims)
    peak = reduce("max", r1, ax1)
    # shift by the max only when it is finite: an infinite max would give exp(inf - inf) = NaN
    # where the answer is +Inf (a +Inf in the row) or -Inf (all -Inf); unshifted, exp gives both
    shift = select(call("isinf", peak), const(0, x.dtype), peak)
    total = reduce("sum", call("exp", call("sub", r2, shift)), ax2)
    return call("add", shift, call("log", total)), shape


_SIMPLE: dict[str, tuple[frozenset[DType], str, Callable[[E], E], Callable[[E, int], E]]] = {
    # kind: (dtypes, combiner, per-element map, finish(total, count))
    "ReduceSum": (NUMERIC, "sum", lambda v: v, lambda t, n: t),
    "ReduceMean": (FLOATS, "sum", lambda v: v, lambda t, n: call("div", t, const(n, t.dtype))),
    "ReduceMax": (NUMERIC, "max", lambda v: v, lambda t, n: t),
    "ReduceMin": (NUMERIC, "min", lambda v: v, lambda t, n: t),
    "ReduceProd": (NUMERIC, "prod", lambda v: v, lambda t, n: t),
    "ReduceL1": (NUMERIC, "sum", lambda v: call("abs", v), lambda t, n: t),
    "ReduceL2": (FLOATS, "sum", lambda v: call("mul", v, v), lambda t, n: call("sqrt", t)),
    "ReduceSumSquare": (NUMERIC, "sum", lambda v: call("mul", v, v), lambda t, n: t),
    "ReduceLogSum": (FLOATS, "sum", lambda v: v, lambda t, n: call("log", t)),
}
REDUCE_KINDS = (*_SIMPLE, "ReduceLogSumExp")


def reduce_op(kind: str, x: Value, axes: Sequence[int] | None = None, keepdims: int = 1,
              noop_with_empty_axes: int = 0) -> Op:
    """ONNX Reduce* with ``axes`` as an attribute list; None or empty reduces every axis (unless
    ``noop_with_empty_axes``, which makes it the identity)."""
    x = check_value(kind, x, "data")
    dtypes = FLOATS if kind == "ReduceLogSumExp" else _SIMPLE[kind][0]
    require_dtype(kind, x, dtypes, " or ".join(sorted(map(str, dtypes))))
    if not axes:
        axes = () if noop_with_empty_axes else tuple(range(x.rank))
    norm = normalize_axes(kind, x, axes)
    attrs = {"axes": list(norm), "keepdims": keepdims}
    if kind == "ReduceLogSumExp":
        body, shape = _lse(x, norm, bool(keepdims))
    else:
        _, combiner, elem, finish = _SIMPLE[kind]
        read, red, shape = _reduced_read(x, norm, bool(keepdims))
        count = 1
        for _, n in red:
            count *= n
        body = finish(reduce(combiner, elem(read), red), count)
    return make_op(kind, [x], shape, x.dtype, body, attrs)


def _softmax_parts(x: Value, axis: int) -> tuple[E, E, E]:
    """(x at the output index, the row max, the row sum of exp(x - max)) for one axis."""
    here = Read(x.dtype, 0, out_symbols(x.rank))
    r1, ax1, _ = _reduced_read(x, (axis,), True)
    r2, ax2, _ = _reduced_read(x, (axis,), True)
    peak = reduce("max", r1, ax1)
    total = reduce("sum", call("exp", call("sub", r2, peak)), ax2)
    return here, peak, total


def softmax(x: Value, axis: int = -1) -> Op:
    """ONNX Softmax (opset 13: one axis), numerically stable, as one fused body.

    The exps are multiplied by the sum's reciprocal, one division a row, as onnxruntime's MLAS
    does: the sum is at least 1 (the max's own exp), so 1/sum is a normal number and the product
    is within 1.5 ulp of the quotient, with the same NaN and zero results (float16 divides: its
    1/sum is subnormal from sums of 16385 on). A division per element cost 1.04-1.09x on masked
    softmax rows of 128 and 1.03-1.16x on fused attention (PoCL, Sapphire Rapids;
    docs/benchmarks.md, "Softmax by the sum's reciprocal")."""
    x = check_value("Softmax", x, "input")
    require_dtype("Softmax", x, FLOATS, "a float dtype")
    here, peak, total = _softmax_parts(x, normalize_axis("Softmax", x, axis))
    exps = call("exp", call("sub", here, peak))
    body = call("div", exps, total) if x.dtype is DType.float16 else \
        call("mul", exps, call("div", const(1.0, x.dtype), total))
    return make_op("Softmax", [x], x.shape, x.dtype, body, {"axis": axis})


def log_softmax(x: Value, axis: int = -1) -> Op:
    """ONNX LogSoftmax: ``x - max - log(sum(exp(x - max)))`` over one axis."""
    x = check_value("LogSoftmax", x, "input")
    require_dtype("LogSoftmax", x, FLOATS, "a float dtype")
    here, peak, total = _softmax_parts(x, normalize_axis("LogSoftmax", x, axis))
    body = call("sub", call("sub", here, peak), call("log", total))
    return make_op("LogSoftmax", [x], x.shape, x.dtype, body, {"axis": axis})
