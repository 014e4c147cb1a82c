"""The OpenCL vector contraction's operand order (``swap_operands``): a 1x1 convolution over a
small map vectorises its output channels (the weights, packed once) with the pixels as rows
where pixel vectors would waste columns, by default on a CPU with 32 SIMD registers where that
saves enough reduction points an output point or the weights are large
(``columns.swaps_by_default``). Every order is checked against NumPy on
awkward shapes: prime channel counts (a shifted last column tile), pixel counts no row count
divides, batches whose row tiles cross from one image to the next."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl.columns import SWAP_MIN_REDUCTION

rng = np.random.default_rng(43)


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _pointwise(x: np.ndarray, w: np.ndarray, bias: np.ndarray, constant: bool = True
               ) -> tuple[kg.FusedOp, np.ndarray]:
    """relu(conv1x1(x, w) + bias) with constant weights and bias, and its float64 value."""
    value = (kg.constant if constant else kg.tensor)
    weights = value("w", w) if constant else value("w", w.shape)  # type: ignore[operator]
    conv = kg.conv(kg.tensor("x", x.shape), weights,
                   kg.constant("b", bias) if constant else kg.tensor("b", bias.shape))
    want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x)
    return kg.fuse(conv, kg.relu(conv)), np.maximum(want + bias[None, :, None, None], 0)


def _opencl() -> None:
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")


@pytest.mark.parametrize("c,m,side,batch,rows", [
    (512, 112, 7, 1, 7),     # 49 pixels: 7 rows; 112 channels, a shifted last column tile
    (600, 64, 13, 1, 13),    # 169 pixels (a prime squared): 13 rows
    (400, 96, 9, 2, 9),      # two images of 81 pixels: the rows span both
    (256, 1024, 14, 1, 7),   # few points saved (SWAP_MIN_SAVED), but 1 MiB of weights
    (384, 64, 14, 1, None),  # few points saved, 96 KiB of weights: pixel vectors
    (96, 64, 7, 1, None),    # a reduction under SWAP_MIN_REDUCTION: pixel vectors
    (256, 48, 8, 1, None),   # 64 pixels fill two 32-wide tiles: pixel vectors
])
def test_pointwise_conv_over_a_small_map_takes_channel_vectors(c: int, m: int, side: int,
                                                              batch: int, rows: int | None
                                                              ) -> None:
    """Generated for an AVX-512 CPU: the default order and rows the rule gives, the weights
    packed once; for an AVX2 CPU (16 registers, not measured there) pixel vectors. Run here
    against NumPy."""
    _opencl()
    x, w, bias = _f32(batch, c, side, side), _f32(m, c, 1, 1) / np.float32(np.sqrt(c)), _f32(m)
    fused, want = _pointwise(x, w, bias)
    avx512 = backends.REGISTRY["opencl"].for_device("cpu-avx512")  # type: ignore[attr-defined]
    kernel = fused.emit_kernel(avx512, tuning="none")
    tunables = kernel.metadata["tunables"]
    assert bool(tunables.get("swap_operands")) == (rows is not None)
    if rows is not None:
        assert c >= SWAP_MIN_REDUCTION
        assert tunables["tile"][0] == rows and kernel.metadata["packed_once"]
        assert kernel.metadata["right_operand_reads"] == ["w"]
    require_vectors_of(kernel.source)
    assert_close(kernel(x), want, np.float32, scale=c)
    avx2 = backends.REGISTRY["opencl"].for_device("cpu-avx2")  # type: ignore[attr-defined]
    assert not fused.emit_kernel(avx2, tuning="none").metadata["tunables"].get("swap_operands")


@pytest.mark.parametrize("swap", [True, False])
@pytest.mark.parametrize("c,m,side,batch,tile", [(131, 37, 7, 3, (8, 32)), (29, 5, 3, 1, None),
                                                 (3, 17, 5, 2, (5, 16))])
def test_both_operand_orders_agree_with_numpy(swap: bool, c: int, m: int, side: int,
                                              batch: int, tile: tuple[int, int] | None
                                              ) -> None:
    """Either order, forced, on this device: constant weights (packed once when they are the
    vector operand), and weights given at each call (packed at each launch), with tiles whose
    rows cross images and channel tiles wider than the channels."""
    _opencl()
    x, w, bias = _f32(batch, c, side, side), _f32(m, c, 1, 1), _f32(m)
    options = {"swap_operands": swap, **({"tile": tile} if tile else {})}
    for constant in (True, False):
        fused, want = _pointwise(x, w, bias, constant)
        kernel = fused.emit_kernel("opencl", tuning="none", **options)
        assert kernel.metadata["tunables"]["swap_operands"] is swap
        if swap:  # constants packed once; else packed at each launch where two tiles read them
            assert bool(kernel.metadata.get("packed_once")) is constant
            assert kernel.metadata.get("packed_operand_reads", ["w"]) == ["w"]
        args = (x,) if constant else (x, w, bias)
        assert_close(kernel(*args), want, np.float32, scale=c)


def test_a_matmul_with_swapped_operands_equals_numpy() -> None:
    """A MatMul + bias whose output columns are few (a classifier's 10): the rows (the batch of
    37) as vectors, the columns in rows of the tile."""
    _opencl()
    a, b, bias = _f32(37, 300), _f32(300, 10), _f32(10)
    mm = kg.matmul(kg.tensor("a", a.shape), kg.constant("b", b))
    kernel = kg.fuse(mm, kg.add(mm, kg.constant("bias", bias))).emit_kernel(
        "opencl", tuning="none", swap_operands=True)
    assert_close(kernel(a), a.astype(np.float64) @ b + bias, np.float32, scale=300)


def test_swap_operands_is_refused_where_it_does_not_apply() -> None:
    """On another schedule, and on AGO's fused producer, naming the kernel and why."""
    _opencl()
    x = kg.tensor("x", (8, 300))
    with pytest.raises(ValueError, match=r"swap_operands applies to the 'tiled' schedule"):
        kg.fuse(kg.reduce_sum(x, axes=[1])).emit_kernel("opencl", swap_operands=True)
    x4 = kg.tensor("x", (1, 4, 9, 9))
    p = kg.conv(x4, kg.tensor("w1", (8, 4, 3, 3)), pads=[1, 1, 1, 1])
    r = kg.relu(p)
    fused = kg.fuse(p, r, kg.conv(r, kg.tensor("w2", (16, 8, 1, 1))), force=True)
    with pytest.raises(ValueError, match=r"swap_operands applies to a contraction of plain "
                                         r"operands; this one computes a fused producer"):
        fused.emit_kernel("opencl", tuning="none", swap_operands=True)


def test_the_tuner_measures_both_orders() -> None:
    """The search space holds both orders for a 1x1 conv, right after the default, and none
    for a contraction whose left operand has fewer points than a vector."""
    _opencl()
    opencl = backends.get("opencl")
    fused, _ = _pointwise(_f32(1, 64, 7, 7), _f32(32, 64, 1, 1), _f32(32))
    space = [c.as_options() for c in opencl.search_space(fused.lower())]
    assert space[:3] == [{}, {"swap_operands": True}, {"swap_operands": False}]
    narrow = kg.matmul(kg.tensor("a", (2, 40)), kg.tensor("b", (40, 64)))
    assert not any("swap_operands" in c.as_options()
                   for c in opencl.search_space(kg.fuse(narrow).lower()))
