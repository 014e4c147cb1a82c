"""Host arrays a device can use in place: aligned to ``ALIGN`` bytes (Intel's CPU OpenCL runtime
copies any buffer not aligned to its 128-byte base alignment, PoCL none), and, for large ones,
taken from a pool of blocks that earlier calls' results have released.

A fresh 64 MiB array costs milliseconds of page faults the first time it is written, more than
a fused kernel over it takes, so a call that returns a new array each time would be dominated by
them. The pool keeps released blocks (up to ``POOL_BYTES``) and hands them out again: an array
is released when it and every view of it are gone (each array owns its block through a ctypes
object that NumPy views keep alive), so a block is never reused while any view of it lives.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict

import numpy as np

ALIGN = 4096       # a page: any device's base alignment divides it
POOLED = 1 << 20   # arrays at least this large come from the pool
POOL_BYTES = 1 << 29  # released blocks kept, at most (least recently released go first)

_lock = threading.Lock()
_free: OrderedDict[int, list[np.ndarray]] = OrderedDict()  # block bytes -> released blocks
_free_bytes = 0


def aligned(address: int, alignment: int = ALIGN) -> bool:
    return address % alignment == 0


def empty(shape: tuple[int, ...], dtype: np.dtype | type | str) -> np.ndarray:
    """An uninitialised C-ordered array aligned to ``ALIGN`` bytes; large ones reuse a
    released block of the same size."""
    dt = np.dtype(dtype)
    nbytes = max(int(np.prod(shape, dtype=np.int64)) * dt.itemsize, 1)
    size = -(-nbytes // ALIGN) * ALIGN
    block = _take(size) if size >= POOLED else None
    if block is None:
        raw = np.empty(size + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
        block = raw[start:start + size]
    owner = (ctypes.c_char * size).from_buffer(block.data)
    if size >= POOLED:
        weakref.finalize(owner, _release, block).atexit = False
    return np.frombuffer(memoryview(owner), dt, count=nbytes // dt.itemsize).reshape(shape)


def copy(array: np.ndarray) -> np.ndarray:
    """``array``'s values in a new aligned array (``empty``)."""
    out = empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


def _take(size: int) -> np.ndarray | None:
    global _free_bytes
    with _lock:
        blocks = _free.get(size)
        if not blocks:
            return None
        block = blocks.pop()
        _free_bytes -= size
        if not blocks:
            del _free[size]
        return block


def _release(block: np.ndarray) -> None:
    global _free_bytes
    size = block.nbytes
    with _lock:
        _free.setdefault(size, []).append(block)
        _free.move_to_end(size)
        _free_bytes += size
        while _free_bytes > POOL_BYTES:  # drop the least recently released sizes first
            oldest, blocks = next(iter(_free.items()))
            blocks.pop(0)
            _free_bytes -= oldest
            if not blocks:
                del _free[oldest]
