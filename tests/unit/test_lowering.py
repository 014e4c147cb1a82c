"""Lowering passes on the loop IR: ``merge_reductions`` makes a reduction's axes one axis exactly
where every load reads them as one contiguous run (values are checked on every backend by
tests/backend/test_nn.py and test_ops.py, which run the same operators)."""
from __future__ import annotations

import kernelgen as kg
from kernelgen.ir.expr import Reduce, walk


def _reductions(op: kg.Op) -> list[Reduce]:
    loop = kg.fuse(op).lower()
    return [n for st in loop.stores for n in walk(st.value) if isinstance(n, Reduce)]


def test_a_global_pool_reduces_over_one_axis() -> None:
    (pool,) = _reductions(kg.global_pool("GlobalAveragePool", kg.tensor("x", (2, 3, 13, 7))))
    assert [n for _, n in pool.axes] == [91]


def test_axes_apart_in_memory_stay_apart() -> None:
    (total,) = _reductions(kg.reduce_sum(kg.tensor("x", (2, 3, 4, 5)), [1, 3]))
    assert sorted(n for _, n in total.axes) == [3, 5]


def test_a_convolution_window_keeps_its_axes() -> None:
    # the weights read (c, kh, kw) as one run, the input does not (rows of the image between)
    x, w = kg.tensor("x", (1, 4, 9, 9)), kg.tensor("w", (2, 4, 3, 3))
    (conv,) = _reductions(kg.conv(x, w))
    assert [n for _, n in conv.axes] == [4, 3, 3]


def test_trailing_axes_merge_into_one() -> None:
    (total,) = _reductions(kg.reduce_max(kg.tensor("x", (2, 3, 4, 5)), [1, 2, 3]))
    assert [n for _, n in total.axes] == [60]
