"""A NumPy interpreter of the loop IR: the reference semantics every emitter is tested against.

Every domain and reduction symbol gets its own NumPy axis; expressions evaluate to arrays that
broadcast over the axes they use, and a ``Reduce`` combines over its own axes. The results are
what a backend must produce, up to floating-point rounding.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy

from ..dtypes import DType
from ..errors import ArgumentError
from ..mapping_types import evaluate
from .expr import Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select, walk
from .indexing import raw_index
from .loop import LoopKernel, inline_staged


def _int_div(a: Any, b: Any) -> Any:  # C semantics: truncate toward zero
    q = np.floor_divide(a, b)
    return np.where((np.mod(a, b) != 0) & ((a < 0) != (b < 0)), q + 1, q)


def _div(a: Any, b: Any) -> Any:
    if np.issubdtype(np.result_type(a, b), np.integer):
        return _int_div(a, b)
    return np.divide(a, b)


def _erf(x: Any) -> Any:
    return np.vectorize(math.erf, otypes=[np.asarray(x).dtype])(x)


def _pow(a: Any, b: Any) -> Any:
    """C's pow, special values included (pow(-Inf, 0.5) = +Inf, pow(-0, 0.5) = +0): NumPy
    takes a sqrt shortcut for an exponent of 0.5 that is a scalar or broadcast from one, so
    the exponents are materialised."""
    a, b = np.asarray(a), np.asarray(b)
    shape = np.broadcast_shapes(a.shape, b.shape)
    return np.power(a, np.array(np.broadcast_to(b, shape or (1,)))).reshape(shape)


# the bit-level primitives by their definitions on normal floats (frexp: x = m 2^e, m in
# [0.5, 1)); what the backends' bit manipulations give elsewhere is unspecified
def _exp2i(k: Any) -> Any:
    k = np.asarray(k)
    power = np.ldexp(np.ones_like(k), np.nan_to_num(k).astype(np.int32))
    return np.where(k == -127, np.zeros_like(power), power)  # the exponent field's zero: +0


def _logb(x: Any) -> Any:
    return (np.frexp(x)[1] - 1).astype(np.asarray(x).dtype)


def _significand(x: Any) -> Any:
    return np.frexp(x)[0] * 2


NUMPY_PRIMITIVES: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "neg": np.negative,
    "muladd": lambda a, b, c: np.add(np.multiply(a, b), c),
    "abs": np.abs, "max": np.maximum, "min": np.minimum, "pow": _pow, "fmod": np.fmod,
    "mod": np.mod, "sign": np.sign, "exp": np.exp, "expm1": np.expm1, "log": np.log,
    "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "rint": np.rint, "exp2i": _exp2i, "logb": _logb, "significand": _significand,
    "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "isnan": np.isnan,
    "isinf": np.isinf, "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
    "not": np.logical_not,
}
_REDUCERS: dict[str, Callable[..., Any]] = {"sum": np.sum, "prod": np.prod, "max": np.max,
                                            "min": np.min}


def _np(dtype: DType) -> np.dtype:
    return dtype.compute.numpy


def interpret(kernel: LoopKernel, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Run ``kernel`` on NumPy arrays; returns one array per output. Staged rows are
    evaluated where they are read (``loop.inline_staged``): the same values, computed the plain
    way. A gathered index outside [-n, n-1] raises ``ArgumentError``."""
    kernel = inline_staged(kernel)
    ev = _evaluator(kernel, inputs)
    full = tuple(e for _, e in kernel.domain) + (1,) * (ev.ndim - len(kernel.domain))
    outs = []
    for buf, st in zip(kernel.outputs, kernel.stores):
        value = np.broadcast_to(np.asarray(ev.value(st.value)), full)
        outs.append(value.reshape(buf.shape).astype(buf.dtype.numpy))
    return tuple(outs)


def check_indices(kernel: LoopKernel, *inputs: np.ndarray) -> None:
    """Raise ``ArgumentError`` where a gathered index of ``kernel`` on ``inputs`` lies outside
    its axis; evaluates the index expressions only (what the host-side check falls back on when
    an index is computed, not read from an input)."""
    kernel = inline_staged(kernel)
    ev = _evaluator(kernel, inputs)
    for root in kernel.roots():
        for node in walk(root):
            if isinstance(node, (Load, IndexCond)):
                for _, n, v in node.data:
                    ev.index(v, n)


def _evaluator(kernel: LoopKernel, inputs: tuple[np.ndarray, ...]) -> _Evaluator:
    if len(inputs) != len(kernel.inputs):
        raise ArgumentError(f"{kernel.name}: expected {len(kernel.inputs)} inputs "
                            f"({', '.join(b.name for b in kernel.inputs)}), got {len(inputs)}")
    buffers: dict[str, np.ndarray] = {}
    for buf, arr in zip(kernel.inputs, inputs):
        arr = np.asarray(arr)
        if arr.shape != buf.shape:
            raise ArgumentError(f"{kernel.name}: input '{buf.name}' expected shape {buf.shape}, "
                                f"got {arr.shape}")
        buffers[buf.name] = np.ascontiguousarray(arr, dtype=buf.dtype.numpy).reshape(-1)
    axis_of, extents = _axes(kernel)
    ndim = max(axis_of.values(), default=-1) + 1
    env: dict[sympy.Symbol, Any] = {}
    for s, pos in axis_of.items():
        shape = [1] * ndim
        shape[pos] = extents[s]
        env[s] = np.arange(extents[s], dtype=np.int64).reshape(shape)
    return _Evaluator(kernel.name, buffers, env, axis_of, extents, ndim)


def _axes(kernel: LoopKernel) -> tuple[dict[sympy.Symbol, int], dict[sympy.Symbol, int]]:
    """A NumPy axis per symbol: the domain's first, then each reduction symbol one past the
    deepest symbol that ever encloses it. Symbols never nested in each other are never live
    together, so they share axes (keepdims leaves a reduced axis size 1), and deeply inlined
    blocks (softmax of softmax of ...) stay far below NumPy's 32/64-dimension limits."""
    extents = dict(kernel.domain)
    parents: dict[sympy.Symbol, set[sympy.Symbol | None]] = {}
    seen: set[tuple[int, sympy.Symbol | None]] = set()

    def visit(node: Expr, inner: sympy.Symbol | None) -> None:
        if (id(node), inner) in seen:
            return
        seen.add((id(node), inner))
        if isinstance(node, Reduce):
            for s, n in node.axes:  # a reduction's own axes nest in the order given
                extents[s] = n
                parents.setdefault(s, set()).add(inner)
                inner = s
        for child in node.children():
            visit(child, inner)

    for st in kernel.stores:
        visit(st.value, None)
    depth: dict[sympy.Symbol, int] = {}

    def depth_of(s: sympy.Symbol) -> int:
        if s not in depth:
            depth[s] = 1 + max(-1 if p is None else depth_of(p) for p in parents[s])
        return depth[s]

    base = len(kernel.domain)
    axis_of = {s: k for k, (s, _) in enumerate(kernel.domain)}
    axis_of.update({s: base + depth_of(s) for s in parents})
    return axis_of, extents


class _Evaluator:
    def __init__(self, name: str, buffers: dict[str, np.ndarray], env: dict[sympy.Symbol, Any],
                 axis_of: dict[sympy.Symbol, int], extents: dict[sympy.Symbol, int], ndim: int
                 ) -> None:
        self.name, self.buffers, self.env, self.axis_of = name, buffers, env, axis_of
        self.extents, self.ndim = extents, ndim
        self.memo: dict[Expr, Any] = {}

    def value(self, node: Expr) -> Any:
        if node in self.memo:
            return self.memo[node]
        out = self._compute(node)
        self.memo[node] = out
        return out

    def index(self, value: Expr, n: int) -> Any:
        """A data binding's value, a position in [0, n-1]; the caller's index (inside
        ``indexing.clamp_index``) must lie in [-n, n-1], any other binding in [0, n-1]."""
        raw = raw_index(value, n)
        checked, low = (value, 0) if raw is None else (raw, -n)
        got = np.asarray(self.value(checked))
        bad = got[(got < low) | (got > n - 1)]
        if bad.size:
            names = sorted({x.buffer for x in walk(checked) if isinstance(x, Load)})
            source = ", ".join(f"'{x}'" for x in names) or "a constant"
            raise ArgumentError(f"kernel '{self.name}': index input {source} holds {bad.flat[0]}, "
                                f"outside [{low}, {n - 1}] (a gathered axis of size {n})")
        return np.asarray(self.value(value)).astype(np.int64)

    def _compute(self, node: Expr) -> Any:
        dt = _np(node.dtype)
        if isinstance(node, Const):
            return np.asarray(node.value, dtype=dt)
        if isinstance(node, IndexCond):
            env = dict(self.env)
            env.update({s: self.index(v, n) for s, n, v in node.data})
            return np.asarray(evaluate(node.cond, env), dtype=bool)
        if isinstance(node, Load):
            env = dict(self.env)
            env.update({s: self.index(v, n) for s, n, v in node.data})
            offset = np.asarray(evaluate(node.offset, env), dtype=np.int64)
            guard = np.asarray(evaluate(node.guard, env), dtype=bool)
            flat = self.buffers[node.buffer]
            got = flat[np.where(guard, offset, 0)].astype(dt)
            return np.where(guard, got, np.zeros((), dt))
        if isinstance(node, Call):
            args = [self.value(a) for a in node.args]
            with np.errstate(all="ignore"):
                return np.asarray(NUMPY_PRIMITIVES[node.fn](*args)).astype(dt)
        if isinstance(node, Select):
            return np.where(self.value(node.cond), self.value(node.if_true),
                            self.value(node.if_false)).astype(dt)
        if isinstance(node, Cast):
            v = np.asarray(self.value(node.value))
            if node.dtype is DType.bool:
                return v != 0
            with np.errstate(all="ignore"):
                return v.astype(dt)
        if isinstance(node, Reduce):
            body = np.asarray(self.value(node.body))
            axes = tuple(self.axis_of[s] for s, _ in node.axes)
            shape = list(np.broadcast_shapes(body.shape, (1,) * self.ndim))
            for s, _ in node.axes:
                shape[self.axis_of[s]] = self.extents[s]
            body = np.broadcast_to(body, shape)
            with np.errstate(all="ignore"):
                return _REDUCERS[node.kind](body, axis=axes, keepdims=True).astype(dt)
        raise TypeError(f"interpreter cannot evaluate {type(node).__name__}")

