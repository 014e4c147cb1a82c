"""How a measured candidate is checked before its time counts: random inputs for a kernel's
buffers, and a comparison with the reference output that tells a reordered float32 reduction
from a wrong element. The tuner and the yellow-cell measurement share them."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .ir.loop import Buffer
from .ir.node import Value


def matches(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> bool:
    """Every element within rtol of the output's scale (max-norm): a long float32 reduction
    summed in another order differs by far less, one wrong element by far more. Integers and
    booleans must match exactly; NaN must be where the reference has NaN."""
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False
        if not np.issubdtype(w.dtype, np.floating):
            if not np.array_equal(g, w):
                return False
            continue
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            return False
        finite = np.isfinite(w)
        if not np.array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)]):
            return False
        rtol = 5e-3 if w.dtype == np.float16 else 1e-4
        scale = float(np.max(np.abs(w[finite]), initial=0.0)) + 1.0
        diff = np.abs(g[finite].astype(np.float64) - w[finite].astype(np.float64))
        if diff.size and float(diff.max()) > rtol * scale:
            return False
    return True


def random_input(rng: np.random.Generator, buf: Buffer | Value) -> np.ndarray:
    """Random values for ``buf``: standard normal floats, booleans, and integers in 0..2 (valid
    gather indices on any axis)."""
    if buf.dtype.value == "bool":
        return rng.random(buf.shape) < 0.5
    if buf.dtype.is_int:
        return rng.integers(0, 3, buf.shape).astype(buf.dtype.numpy)  # valid gather indices
    return rng.standard_normal(buf.shape).astype(buf.dtype.numpy)


__all__ = ["matches", "random_input"]
