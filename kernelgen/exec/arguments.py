"""The one call convention of every executable (``Kernel`` and ``Program``): inputs in the order
the user built the block (``fused.inputs``), by position or by name, optional ``out=`` arrays,
and the checks that keep a call from reading or writing memory it should not.

A call never converts an array silently (a float64 array for a float32 input is an error), and
never lets a kernel write into an array it was told not to (read-only ``out=``) or read an input
it is overwriting (``out=`` that overlaps an input is computed into a fresh array, then copied).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .. import hostmem
from ..dtypes import DType
from ..errors import ArgumentError


class Param(Protocol):
    """What a call checks an array against: a kernel's ``Buffer`` or a block's ``Value``."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> DType: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


def bind_inputs(callee: str, params: Sequence[Param], positional: Sequence[Any],
                named: Mapping[str, Any], defaults: Mapping[str, np.ndarray] | None = None
                ) -> list[np.ndarray]:
    """The input arrays in ``params`` order, from positional arrays then arrays by name; each
    checked (shape, dtype) and made C-contiguous. ``defaults`` are the values of inputs that
    are constants (``kg.constant``): they need not be passed. Positional arrays then fill
    every input, when there are as many as inputs, else the inputs that are not constants.
    ``callee`` names the kernel in errors."""
    defaults = defaults or {}
    names = [p.name for p in params]
    free = [n for n in names if n not in defaults]
    if len(positional) == len(params) or not defaults:
        targets = names
    elif len(positional) <= len(free):
        targets = free
    else:
        raise ArgumentError(f"{callee} takes {len(free)} inputs ({', '.join(free)}) and "
                            f"{len(defaults)} constants that default to their values "
                            f"({', '.join(n for n in names if n in defaults)}); pass "
                            f"{len(free)} arrays, or all {len(params)}, got {len(positional)}")
    if len(positional) > len(targets):
        raise ArgumentError(f"{callee} takes {len(params)} inputs ({', '.join(names)}), "
                            f"got {len(positional)}")
    slots: dict[str, Any] = dict(zip(targets, positional))
    for key, value in named.items():
        if key not in names:
            raise ArgumentError(f"{callee} has no input named '{key}'; its inputs are "
                                f"{', '.join(names)}")
        if key in slots:
            raise ArgumentError(f"{callee}: input '{key}' given twice (by position and by name)")
        slots[key] = value
    for name, value in defaults.items():
        slots.setdefault(name, value)
    missing = [n for n in names if n not in slots]
    if missing:
        given = len(positional) + len(named)
        raise ArgumentError(f"{callee} takes {len(params)} inputs ({', '.join(names)}), got "
                            f"{given}; missing {', '.join(missing)}")
    return [_contiguous(_checked(callee, p, slots[p.name], "input")) for p in params]


def bind_outputs(callee: str, params: Sequence[Param], out: Any,
                 inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(arrays the kernel writes, arrays returned to the caller). Without ``out`` both are
    fresh arrays. An ``out`` array is checked (shape, dtype, C order, writeable); where it
    overlaps an input the kernel writes a fresh array that ``finish`` copies into it, since a
    kernel that reads an input while writing over it computes garbage (a MatMul reads each
    input element many times)."""
    if out is None:  # aligned (a device may use them in place), large ones pooled
        fresh = [hostmem.empty(p.shape, p.dtype.numpy) for p in params]
        return fresh, fresh
    if isinstance(out, np.ndarray):
        outs = [out]
    elif isinstance(out, tuple | list) and all(isinstance(o, np.ndarray) for o in out):
        outs = list(out)
    else:
        raise ArgumentError(f"{callee}: out= takes a NumPy array, or a tuple of "
                            f"{len(params)} arrays, got {type(out).__name__}")
    if len(outs) != len(params):
        raise ArgumentError(f"{callee} has {len(params)} outputs, got {len(outs)} arrays in out=")
    written = []
    for p, arr in zip(params, outs):
        _checked(callee, p, arr, "output")
        if not arr.flags.c_contiguous:
            raise ArgumentError(f"{callee}: output '{p.name}' must be C-contiguous")
        if not arr.flags.writeable:
            raise ArgumentError(f"{callee}: output '{p.name}' is a read-only array")
        overlaps = any(np.may_share_memory(arr, a) for a in inputs)
        written.append(np.empty_like(arr) if overlaps else arr)
    return written, outs


def finish(written: Sequence[np.ndarray], returned: Sequence[np.ndarray]) -> Any:
    """Copy outputs computed aside into the caller's ``out`` arrays; the call's return value."""
    for w, r in zip(written, returned):
        if w is not r:
            r[...] = w
    return returned[0] if len(returned) == 1 else tuple(returned)


def _checked(callee: str, param: Param, value: Any, role: str) -> np.ndarray:
    if value is None:
        raise ArgumentError(f"{callee}: {role} '{param.name}' is None; expected a "
                            f"{param.dtype} array of shape {tuple(param.shape)}")
    arr = np.asarray(value)
    if arr.shape != tuple(param.shape):
        raise ArgumentError(f"{callee}: {role} '{param.name}' expected shape "
                            f"{tuple(param.shape)}, got {arr.shape}")
    if arr.dtype != param.dtype.numpy:
        raise ArgumentError(f"{callee}: {role} '{param.name}' expected dtype {param.dtype}, "
                            f"got {arr.dtype}")
    return arr


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` in C order, keeping its shape (``np.ascontiguousarray`` makes a 0-d array 1-d)."""
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(arr.shape)
