"""Lowering passes on the loop IR: ``merge_reductions`` makes a reduction's axes one axis exactly
where every load reads them as one contiguous run; ``split_groups`` splits a grouped 1x1
conv's output channels into the group and the channel within it, and nothing else (values are
checked on every backend by tests/backend/test_nn.py and test_ops.py, which run the same
operators)."""
from __future__ import annotations

import numpy as np
import pytest

import kernelgen as kg
from kernelgen.ir.expr import Load, Reduce, walk
from kernelgen.lower.contraction import contraction
from kernelgen.mapping_types import FloorDiv


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


def _grouped(out_channels: int, kernel: int, groups: int, **attrs: object) -> kg.Op:
    x = kg.tensor("x", (2, 4 * groups, 5, 7))
    w = kg.constant("w", np.ones((out_channels, 4, kernel, kernel), np.float32))
    return kg.conv(x, w, group=groups, **attrs)


def test_a_grouped_pointwise_conv_splits_its_output_channels() -> None:
    loop = kg.fuse(_grouped(24, 1, 3)).lower()
    # batch (2), then the groups (3) and their 8 channels, then the pixels (35)
    assert [n for _, n in loop.domain] == [2, 3, 8, 35]
    loads = [n for n in walk(loop.hoisted[0]) if isinstance(n, Load)]
    assert not any(load.offset.atoms(FloorDiv) for load in loads)
    c = contraction(loop)  # the group an axis of both operands, its channels the weights' own
    assert c is not None and c.batch == (1,)
    assert {c.rows, c.cols} == {(0, 3), (2,)}


def test_a_wide_grouped_window_conv_splits_its_output_channels() -> None:
    """AlexNet's grouped 3x3 and 5x5 convs: 32 channels a group or more, split as the
    pointwise ones are, the window's taps summed with the group's channels."""
    loop = kg.fuse(_grouped(64, 3, 2, pads=[1, 1, 1, 1])).lower()
    assert [n for _, n in loop.domain] == [2, 2, 32, 5, 7]
    c = contraction(loop)
    assert c is not None and c.batch == (1,)


@pytest.mark.parametrize("out_channels,kernel,groups,attrs", [
    (6, 1, 3, {}),  # 2 channels a group: fewer than SPLIT_MIN_CHANNELS
    (24, 3, 3, {"pads": [1, 1, 1, 1]}),  # a window too, 8 channels a group: 'window' takes it
    (12, 1, 12, {}),  # depthwise: no group to split
])
def test_other_convolutions_keep_their_channel_axis(out_channels: int, kernel: int,
                                                    groups: int, attrs: dict) -> None:
    loop = kg.fuse(_grouped(out_channels, kernel, groups, **attrs)).lower()
    assert out_channels in [n for _, n in loop.domain]


def test_single_element_constants_are_read_as_numbers() -> None:
    """A single-element constant read by an operator that reduces over nothing (Clip's
    bounds, a scale) becomes a literal of the fused body and no kernel input; a contraction
    keeps such an operand a buffer (its templates read it), and larger constants stay inputs."""
    from kernelgen.ir.expr import Const, Read
    x = kg.tensor("x", (3, 5))
    y = kg.mul(kg.clip(x, kg.constant("lo", np.float32(0)), kg.constant("hi", np.float32(6))),
               kg.constant("scale", np.array([0.5], np.float32)))
    fused = kg.fuse(y.inputs[0], y)
    assert [v.name for v in fused.inputs] == ["x"]
    values = {n.value for n in walk(fused.outputs[0].body) if isinstance(n, Const)}
    assert {0.0, 6.0, 0.5} <= values
    bias = kg.add(kg.tensor("a", (3, 5)), kg.constant("b", np.arange(5, dtype=np.float32)))
    assert [v.name for v in kg.fuse(bias).inputs] == ["a", "b"]
    gemm = kg.gemm(kg.tensor("m", (3, 4)), kg.constant("w", np.ones((4, 2), np.float32)),
                   kg.constant("c", np.ones(1, np.float32)))
    assert [v.name for v in kg.fuse(gemm).inputs] == ["m", "w", "c"]
    assert sum(isinstance(n, Read) for n in walk(kg.fuse(gemm).outputs[0].body)) == 3
