"""The public operator constructors, one snake_case function per ONNX operator.

Attribute keyword names are ONNX's (``kernelgen.leaky_relu(x, alpha=0.1)``,
``kernelgen.softmax(x, axis=1)``), so the ONNX importer is a table of these functions.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .graph import Op, Value
from .ops import BINARY, UNARY, binary, reduce_op, unary, variadic
from .ops.reduce import REDUCE_KINDS

# Python keywords (and, or, not) take NumPy's logical_* names.
_SPECIAL = {"IsNaN": "isnan", "IsInf": "isinf", "ReduceL1": "reduce_l1", "ReduceL2": "reduce_l2",
            "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor", "Not": "logical_not"}


def snake(kind: str) -> str:
    """ONNX op type -> constructor name: 'LeakyRelu' -> 'leaky_relu'."""
    return _SPECIAL.get(kind) or re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def _unary_fn(kind: str) -> Callable[..., Op]:
    def fn(x: Value, **attrs: Any) -> Op:
        return unary(kind, x, **attrs)
    fn.__doc__ = f"ONNX {kind}, elementwise; keyword attributes as ONNX names them."
    return fn


def _binary_fn(kind: str) -> Callable[[Value, Value], Op]:
    def fn(a: Value, b: Value) -> Op:
        return binary(kind, a, b)
    fn.__doc__ = f"ONNX {kind} with NumPy broadcasting."
    return fn


def _variadic_fn(kind: str) -> Callable[..., Op]:
    def fn(*values: Value) -> Op:
        return variadic(kind, *values)
    fn.__doc__ = f"ONNX {kind} over any number of broadcast inputs."
    return fn


def _reduce_fn(kind: str) -> Callable[..., Op]:
    def fn(x: Value, axes: list[int] | tuple[int, ...] | None = None, keepdims: int = 1,
           noop_with_empty_axes: int = 0) -> Op:
        return reduce_op(kind, x, axes, keepdims, noop_with_empty_axes)
    fn.__doc__ = f"ONNX {kind} over ``axes`` (all axes when None)."
    return fn


# ONNX op type -> constructor (Split returns a tuple of operators, so Any)
CONSTRUCTORS: dict[str, Callable[..., Any]] = {}
for _kind in UNARY:
    CONSTRUCTORS[_kind] = _unary_fn(_kind)
for _kind in BINARY:
    if _kind not in ("Max", "Min"):
        CONSTRUCTORS[_kind] = _binary_fn(_kind)
for _kind in ("Sum", "Mean", "Max", "Min"):
    CONSTRUCTORS[_kind] = _variadic_fn(_kind)
for _kind in REDUCE_KINDS:
    CONSTRUCTORS[_kind] = _reduce_fn(_kind)
for _kind, _fn in CONSTRUCTORS.items():
    _fn.__name__ = _fn.__qualname__ = snake(_kind)

globals().update({snake(k): f for k, f in CONSTRUCTORS.items()})
__all__ = sorted(snake(k) for k in CONSTRUCTORS)
