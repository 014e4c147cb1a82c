"""Row-major shape arithmetic shared by operators, the loop IR and the emitters."""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def prod(values: Iterable[int]) -> int:
    """The product of integer sizes (1 for none), as a Python int that never overflows."""
    out = 1
    for v in values:
        out *= int(v)
    return out


def row_major_strides(shape: Sequence[int]) -> list[int]:
    """Element strides of a C-contiguous tensor: the last axis has stride 1."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return strides[::-1]
