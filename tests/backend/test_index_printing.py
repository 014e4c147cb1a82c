"""Index arithmetic as the backends print it: a division or remainder by a power of two whose
numerator is provably non-negative is a shift or a mask (a C compiler cannot see the sign of
our indices, and PoCL took 44 s to build one unrolled conv whose channel shuffle read '% 4'),
one by any other number stays '/' or '%'. Against NumPy on every backend."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_close, run

import kernelgen as kg


def _shuffle(groups: int, shape: tuple[int, int, int, int]) -> kg.FusedOp:
    """ShuffleNet's channel shuffle, then ReLU: reshape, transpose, reshape back."""
    n, c, h, w = shape
    x = kg.tensor("x", shape)
    split = kg.reshape(x, (n, groups, c // groups, h, w))
    swapped = kg.transpose(split, (0, 2, 1, 3, 4))
    back = kg.reshape(swapped, shape)
    return kg.fuse(split, swapped, back, kg.relu(back))


def _reference(x: np.ndarray, groups: int) -> np.ndarray:
    n, c, h, w = x.shape
    return np.maximum(x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4)
                      .reshape(x.shape), 0)


@pytest.mark.parametrize("groups, shape", [(4, (2, 12, 5, 7)), (3, (1, 9, 1, 13)),
                                           (8, (1, 16, 3, 1))])
def test_channel_shuffle_indices(backend: str, groups: int,
                                 shape: tuple[int, int, int, int]) -> None:
    x = np.random.default_rng(groups).standard_normal(shape).astype(np.float32)
    fused = _shuffle(groups, shape)
    (got,) = run(backend, fused, x)
    assert_close(got, _reference(x, groups))
    if backend in ("opencl", "neon"):
        source = fused.emit(backend).source
        body = source[source.index("{"):]  # past the KG_FLOORDIV/KG_FLOORMOD macros
        divisors = {int(d) for d in re.findall(r"(?<![%/])[%/] (\d+)", body)}
        assert not any(d > 1 and d & (d - 1) == 0 for d in divisors), \
            f"a power of two divides with '/' or '%':\n{source}"
        if groups & (groups - 1) == 0:
            assert re.search(r"& \d+\)|>> \d+\)", body), source
