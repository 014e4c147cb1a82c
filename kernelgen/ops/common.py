"""Shared pieces of operator construction: axis checks, broadcasting maps, the Op factory."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sympy

from ..dtypes import DType
from ..errors import AttributeError_, AxisError, BroadcastError, DtypeError, KernelgenError
from ..ir.expr import Expr, Read
from ..ir.node import MathProperties, Op, Value, new_name
from ..mapping_types import out_symbols
from ..shapes import as_int

Shape = tuple[int, ...]


def check_value(op: str, value: object, input: str) -> Value:
    if not isinstance(value, Value):
        raise KernelgenError(f"{op}: input '{input}' must be a kernelgen tensor or operator, "
                             f"got {type(value).__name__}")
    return value


def int_attr(op: str, attribute: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an int (an int or a NumPy integer; a float, even 4.0, or a bool raises
    ``AttributeError_``, see ``shapes.as_int``), at least ``minimum`` when given."""
    n = as_int(value)
    if n is None:
        expected = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise AttributeError_(op, attribute, expected, value)
    if minimum is not None and n < minimum:
        raise AttributeError_(op, attribute, f"an integer >= {minimum}", value)
    return n


def int_list(op: str, attribute: str, values: object, minimum: int | None = None) -> list[int]:
    """``values`` (a list or tuple of integers) as ints, each at least ``minimum`` when given;
    anything else raises ``AttributeError_`` naming ``attribute`` with the whole value."""
    expected = "a list of integers" + ("" if minimum is None else f" >= {minimum}")
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise AttributeError_(op, attribute, expected, values)
    given = list(values)
    out: list[int] = []
    for v in given:
        n = as_int(v)
        if n is None or (minimum is not None and n < minimum):
            raise AttributeError_(op, attribute, expected, given)
        out.append(n)
    return out


def normalize_axis(op: str, value: Value, axis: int, rank: int | None = None,
                   attribute: str = "axis") -> int:
    """``axis`` in [0, rank): a non-integer raises AttributeError_, one out of range AxisError."""
    rank = value.rank if rank is None else rank
    n = int_attr(op, attribute, axis)
    if not -rank <= n < rank:
        raise AxisError(op, value.name, n, rank)
    return n % rank


def normalize_axes(op: str, value: Value, axes: Sequence[int], rank: int | None = None,
                   attribute: str = "axes") -> tuple[int, ...]:
    """Axes in [0, rank); an axis out of range raises AxisError, a repeated one AttributeError_."""
    int_list(op, attribute, axes)
    normalized = tuple(normalize_axis(op, value, a, rank, attribute) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise AttributeError_(op, attribute, "distinct axes", list(axes))
    return normalized


def require_dtype(op: str, value: Value, allowed: frozenset[DType] | set[DType], what: str) -> None:
    if value.dtype not in allowed:
        raise DtypeError(op, value.name, what, str(value.dtype))


def same_dtype(op: str, values: Sequence[Value]) -> DType:
    first = values[0]
    for v in values[1:]:
        if v.dtype is not first.dtype:
            raise DtypeError(op, v.name, f"{first.dtype} (the dtype of '{first.name}')",
                             str(v.dtype))
    return first.dtype


def broadcast_shape(op: str, values: Sequence[Value]) -> Shape:
    """NumPy/ONNX multidirectional broadcasting."""
    rank = max(v.rank for v in values)
    out: list[int] = []
    for back in range(rank, 0, -1):
        sizes = {v.shape[v.rank - back] for v in values if v.rank >= back} - {1}
        if len(sizes) > 1:
            raise BroadcastError(op, {v.name: v.shape for v in values}, back)
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_exprs(in_shape: Shape, out_shape: Shape) -> tuple[sympy.Expr, ...]:
    """Index of an input broadcast to ``out_shape``: size-1 axes read index 0."""
    o = out_symbols(len(out_shape))
    lead = len(out_shape) - len(in_shape)
    return tuple(sympy.Integer(0) if n == 1 and out_shape[lead + k] != 1 else o[lead + k]
                 for k, n in enumerate(in_shape))


def broadcast_read(slot: int, value: Value, out_shape: Shape) -> Read:
    return Read(value.dtype, slot, broadcast_exprs(value.shape, out_shape))


def make_op(kind: str, inputs: Sequence[Value], shape: Shape, dtype: DType, body: Expr,
            attrs: dict[str, Any] | None = None, properties: MathProperties | None = None,
            name: str | None = None) -> Op:
    return Op(name or new_name(kind), tuple(shape), dtype, kind, tuple(inputs), body,
              dict(attrs or {}), properties or MathProperties())
