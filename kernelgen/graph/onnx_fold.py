"""Constant folding at import: ONNX nodes whose inputs are all known, computed with NumPy.

Exported models compute shapes at run time (``Shape -> Gather -> Unsqueeze -> Concat ->
Reshape``), make weights with ``ConstantOfShape``, and reshape parameters with ``Unsqueeze``.
With concrete input shapes all of it is known at import, so it runs here and only the tensors
that depend on the inputs become kernels. Each entry takes the node's input arrays (None for an
omitted optional input) and its keyword arguments (ONNX attributes, with the inputs that
kernelgen takes as attributes already read into them by ``onnx_nodes``) and returns the
outputs. Nodes outside the table fold through kernelgen's own operator and the IR interpreter
(``onnx_import``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Arrays = Sequence[np.ndarray | None]
Folder = Callable[[Arrays, dict[str, Any]], list[np.ndarray]]


def _one(fn: Callable[..., np.ndarray]) -> Folder:
    return lambda xs, kw: [np.asarray(fn(*xs, **kw))]


def _cast(x: np.ndarray, to: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    del saturate, round_mode  # float8 conversions only
    return x.astype(to)


def _gather(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.take(data, indices.astype(np.int64), axis=axis)


def _unsqueeze(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = np.expand_dims(x, a)
    return x


def _squeeze(x: np.ndarray, axes: Sequence[int] | None = None) -> np.ndarray:
    return np.squeeze(x, axis=None if axes is None else tuple(a % x.ndim for a in axes))


def _reshape(x: np.ndarray, shape: Sequence[int], allowzero: int = 0) -> np.ndarray:
    dims = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    return x.reshape(dims)


def _slice(x: np.ndarray, starts: Sequence[int], ends: Sequence[int],
           axes: Sequence[int] | None = None, steps: Sequence[int] | None = None) -> np.ndarray:
    index = [slice(None)] * x.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a % x.ndim] = slice(*slice(int(s), int(e), int(st)).indices(x.shape[a % x.ndim]))
    return x[tuple(index)]


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):  # ONNX integer division truncates toward zero
        return (np.trunc(a / b)).astype(a.dtype)
    return a / b


def _mod(a: np.ndarray, b: np.ndarray, fmod: int = 0) -> np.ndarray:
    return np.fmod(a, b) if fmod else np.mod(a, b)


def _flatten(x: np.ndarray, axis: int = 1) -> np.ndarray:
    axis %= x.ndim + 1 if axis < 0 else x.ndim + 1
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


def _reduce(fn: Callable[..., np.ndarray]) -> Folder:
    def fold(xs: Arrays, kw: dict[str, Any]) -> list[np.ndarray]:
        axes = kw.get("axes")
        if not axes:
            axes = None if not kw.get("noop_with_empty_axes") else ()
        if axes == ():
            return [np.asarray(xs[0])]
        axis = None if axes is None else tuple(a % xs[0].ndim for a in axes)
        return [np.asarray(fn(xs[0], axis=axis, keepdims=bool(kw.get("keepdims", 1))))]
    return fold


def _split(xs: Arrays, kw: dict[str, Any]) -> list[np.ndarray]:
    x, axis = xs[0], kw.get("axis", 0)
    sizes = kw.get("split")
    if sizes is None:
        count = kw["num_outputs"]
        chunk = -(-x.shape[axis] // count)
        sizes = [min(chunk, x.shape[axis] - k * chunk) for k in range(count)]
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _variadic(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Folder:
    def fold(xs: Arrays, kw: dict[str, Any]) -> list[np.ndarray]:
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return [np.asarray(out)]
    return fold


def _range(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    dtype = np.result_type(start, limit, delta)
    return np.arange(start.item(), limit.item(), delta.item()).astype(dtype)


def _clip(x: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    return np.clip(x, lo, hi).astype(x.dtype)


_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div, "Pow": np.power,
    "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log,
    "Floor": np.floor, "Ceil": np.ceil, "Reciprocal": np.reciprocal, "Sign": np.sign,
    "Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal, "Not": np.logical_not, "And": np.logical_and,
    "Or": np.logical_or, "Xor": np.logical_xor, "Where": np.where, "Relu": lambda x:
    np.maximum(x, 0).astype(x.dtype),
}

FOLDERS: dict[str, Folder] = {
    **{k: _one(fn) for k, fn in _ELEMENTWISE.items()},
    "Identity": _one(lambda x: x), "Dropout": lambda xs, kw: [xs[0]],
    "Cast": _one(_cast), "Gather": _one(_gather), "Unsqueeze": _one(_unsqueeze),
    "Squeeze": _one(_squeeze), "Reshape": _one(_reshape), "Flatten": _one(_flatten),
    "Slice": _one(_slice), "Mod": _one(_mod), "Clip": _one(_clip),
    "Concat": lambda xs, kw: [np.concatenate(xs, axis=kw["axis"])],
    "Transpose": _one(lambda x, perm=None: np.transpose(x, perm)),
    "Expand": _one(lambda x, shape: x * np.ones(shape, x.dtype)),
    "Tile": _one(lambda x, repeats: np.tile(x, repeats)),
    "Range": _one(_range),
    "NonZero": _one(lambda x: np.array(np.nonzero(x), dtype=np.int64)),
    "ConstantOfShape": _one(lambda shape, value: np.full(shape, value.reshape(()),
                                                           value.dtype)),
    "Split": _split,
    "Sum": _variadic(np.add), "Max": _variadic(np.maximum), "Min": _variadic(np.minimum),
    "Mean": lambda xs, kw: [np.asarray(sum(xs) / len(xs)).astype(xs[0].dtype)],
    "ReduceSum": _reduce(np.sum), "ReduceProd": _reduce(np.prod), "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min), "ReduceMean": _reduce(np.mean),
}


def fold(op_type: str, inputs: Arrays, kwargs: dict[str, Any]) -> list[np.ndarray] | None:
    """The outputs of ``op_type`` on known ``inputs`` (its data inputs, in order), or None when
    the table lacks it. NumPy's dtype rules apply, which agree with ONNX's for the same-typed
    inputs ONNX requires."""
    folder = FOLDERS.get(op_type)
    if folder is None:
        return None
    return [np.asarray(out) for out in folder(inputs, kwargs)]
