"""Leading-dimension padding for contraction operands whose rows alias in the cache.

A register-tiled contraction walks its operands' rows: ``a[m, k]`` for a few rows ``m`` at
each ``k``, ``b[k, n]`` for successive ``k``. When a row is a multiple of 4 KiB long, all of
those rows start at addresses that map to the same sets of a set-associative L1 cache, which
then holds only a dozen of them (4K aliasing): at 2048³ PoCL's tiled GEMM ran at 128 GFLOP/s
reading the operands as they are, and at 181 reading copies whose rows were 16 floats longer
(1024³: 148 and 190), timed side by side with the same source apart from the row stride.

``padded_stages`` copies each such operand once into rows ``PAD_ELEMENTS`` longer (a Pad
stage; a constant is padded when the program is built) and runs the block on the copies
through a Slice that the contraction's loads fold into their offsets, so the block itself is
unchanged. The copies cost one pass over each operand (about 1% of a 2048³ GEMM). A block
whose kernel packs its right operand into panels (``pack``, on by default for large
contractions) is not padded: the driver returns that kernel, whose panels do not alias. Only
backends whose capabilities say ``pads_aliased_rows`` ask.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..dtypes import DType
from ..fusion import FusedBlock, fuse
from ..ir.node import Constant, Op, Value, constant, rewire
from ..lower import lower
from ..lower.contraction import contraction, operand_buffers
from ..ops import pad, slice_op

ALIAS_BYTES = 4096  # rows a multiple of this apart share their L1 sets
PAD_ELEMENTS = 16  # extra elements a padded row gets (one 64-byte line of float32)
PAD_MIN_BYTES = 1 << 20  # smaller operands stay: their rows fit in L2 whatever the sets


@dataclass(frozen=True)
class Padded:
    """A block reading padded copies of its aliased operands: the copy stages, the block on
    the copies (through slices), the constants padded now, and the operands' names."""

    copies: tuple[FusedBlock, ...]
    block: FusedBlock
    folded: dict[str, np.ndarray]
    padded: tuple[str, ...]


def aliased_operands(fused: FusedBlock) -> list[Value]:
    """The block's float32 inputs that its contraction reads and whose rows (last axis) are a
    multiple of ``ALIAS_BYTES`` long, at least ``PAD_MIN_BYTES`` in all."""
    loop = lower(fused)
    c = contraction(loop)
    if c is None:
        return []
    read = operand_buffers(c.left, c.right)
    return [v for v in fused.inputs
            if v.name in read and v.dtype is DType.float32 and v.rank >= 2
            and (v.shape[-1] * 4) % ALIAS_BYTES == 0 and v.numel * 4 >= PAD_MIN_BYTES]


def _padded_rows(value: np.ndarray) -> np.ndarray:
    return np.pad(value, [(0, 0)] * (value.ndim - 1) + [(0, PAD_ELEMENTS)])


def refolded(padded: Padded, constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``padded.folded`` for a block of the same structure whose constants have the values
    ``constants`` (by name)."""
    return {name: _padded_rows(constants[name.removesuffix("_padded")]) for name in padded.folded}


def padded_stages(fused: FusedBlock) -> Padded | None:
    """``fused`` reading padded copies of its aliased operands, or None when none alias (or
    the block has several outputs, which one kernel returns together)."""
    values = aliased_operands(fused)
    if not values or len(fused.outputs) != 1:  # a Program returns one output
        return None
    swaps: list[tuple[Value, Value]] = []
    views: list[Op] = []
    copies: list[FusedBlock] = []
    folded: dict[str, np.ndarray] = {}
    for v in values:
        last = v.rank - 1
        source: Value
        if isinstance(v, Constant):  # padded once, here
            padded = constant(f"{v.name}_padded", _padded_rows(v.value))
            folded[padded.name] = padded.value
            source = padded
        else:
            copy = pad(v, [0] * v.rank + [0] * last + [PAD_ELEMENTS])
            copies.append(fuse(copy))
            source = copy
        view = slice_op(source, [0], [v.shape[-1]], axes=[last])
        views.append(view)
        swaps.append((v, view))
    block = fuse(*views, *rewire(fused.ops, swaps), force=True)  # the block, reading the views
    return Padded(tuple(copies), block, folded, tuple(v.name for v in values))
