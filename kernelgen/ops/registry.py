"""The operator table: one constructor per ONNX operator type, built in one place.

The elementwise, variadic and reduction constructors are generated from their tables
(``kernelgen.leaky_relu(x, alpha=0.1)``); the others are the functions of ``ops``.
Attribute keyword names are ONNX's (``kernelgen.softmax(x, axis=1)``), so the ONNX importer is
a lookup in ``CONSTRUCTORS``.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..ir.node import Op, Value
from .elementwise import (BINARY, UNARY, binary, cast_op, clip, dropout, mod, prelu, unary,
                          variadic, where)
from .nn import (average_pool, batch_normalization, conv, gemm, global_pool, instance_normalization,
                 layer_normalization, lrn, matmul, max_pool)
from .reduce import REDUCE_KINDS, log_softmax, reduce_op, softmax
from .shape import (concat, depth_to_space, expand, flatten, gather, pad, reshape, resize, slice_op,
                    space_to_depth, split, squeeze, transpose, unsqueeze)

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
# the generated constructors, importable by name (kernelgen.relu, kernelgen.reduce_sum, ...)
GENERATED = {snake(k): f for k, f in CONSTRUCTORS.items()}
globals().update(GENERATED)

CONSTRUCTORS.update({
    "Cast": cast_op, "Clip": clip, "Concat": concat, "DepthToSpace": depth_to_space,
    "Expand": expand, "Flatten": flatten, "Gather": gather, "LogSoftmax": log_softmax,
    "Mod": mod, "Pad": pad, "PRelu": prelu, "Reshape": reshape, "Resize": resize,
    "Slice": slice_op, "Softmax": softmax, "SpaceToDepth": space_to_depth, "Split": split,
    "Squeeze": squeeze, "Transpose": transpose, "Unsqueeze": unsqueeze, "Where": where,
    "MatMul": matmul, "Gemm": gemm, "Conv": conv, "MaxPool": max_pool,
    "AveragePool": average_pool, "BatchNormalization": batch_normalization,
    "LayerNormalization": layer_normalization, "InstanceNormalization": instance_normalization,
    "GlobalAveragePool": lambda x: global_pool("GlobalAveragePool", x),
    "GlobalMaxPool": lambda x: global_pool("GlobalMaxPool", x),
    "LRN": lrn, "Dropout": dropout,
})

__all__ = ["CONSTRUCTORS", "GENERATED", "snake", *sorted(GENERATED)]
