"""Row-major shape arithmetic shared by operators, the loop IR and the emitters."""
from __future__ import annotations

import operator
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


def as_int(value: object) -> int | None:
    """``value`` as a Python int when it is an integer (an int, a NumPy integer), else None.

    A float is refused even when integral (4.0), as NumPy's shapes and Python's indexing refuse
    it: a size must not be valid or not by the luck of arithmetic (``n / 2``). A bool is refused
    too: ``True`` as a size is a mistake, not 1."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
