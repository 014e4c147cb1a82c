"""The OpenCL vector contraction's default register tile and reduction unrolling: on a CPU, 4
rows x 4 vectors where four-vector column tiles waste at most ``WIDE_MAX_WASTE`` of the
columns, 8 rows x 2 vectors elsewhere; the reduction loop unrolled completely only while the
unrolled body stays within ``UNROLL_K_MAX_FMAS`` vector FMAs. Each default is checked against
NumPy on shapes that leave a partial (shifted) last row and column tile."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import schedule
from kernelgen.backends.opencl.columns import VECTOR_TILE, WIDE_MAX_WASTE, WIDE_TILE

rng = np.random.default_rng(41)
UNROLLED = '_Pragma("unroll") for (int kg_k'


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _expected_tile(m: int, n: int) -> tuple[int, int]:
    """The tile the rule gives an (m x n) output, computed from the constants."""
    caps = backends.get("opencl").caps
    width = caps.vector_widths[0]
    wide_n = WIDE_TILE[1] * width
    if caps.simd_within_work_item and n >= wide_n and \
            -(-n // wide_n) * wide_n <= WIDE_MAX_WASTE * n:
        return min(WIDE_TILE[0], m), wide_n
    return min(VECTOR_TILE[0], m), 2 * width


@pytest.mark.parametrize("m,k,n", [(97, 27, 1031), (5, 3, 784), (13, 64, 196), (64, 9, 49),
                                   (3, 1, 4096)])
def test_default_tile_follows_the_column_waste(m: int, k: int, n: int) -> None:
    """A matmul + ReLU with the default tile: the rule's tile, and NumPy's values."""
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")
    a, b = _f32(m, k), _f32(k, n)
    mm = kg.matmul(kg.tensor("a", (m, k)), kg.tensor("b", (k, n)))
    kernel = kg.fuse(mm, kg.relu(mm)).emit_kernel("opencl", tuning="none")
    assert kernel.metadata["tunables"]["tile"] == _expected_tile(m, n)
    assert_close(kernel(a, b), np.maximum(a.astype(np.float64) @ b, 0), np.float32, scale=k)


def test_pointwise_conv_takes_the_wide_tile_on_large_maps() -> None:
    """A 1x1 convolution is a GEMM over pixels: 56x56 = 3136 columns split evenly into wide
    tiles, 14x14 = 196 would waste 31 % of them."""
    require("opencl")
    caps = backends.get("opencl").caps
    if not caps.simd_within_work_item or not caps.vector_widths:
        pytest.skip("the wide tile is a CPU default (the OpenCL device is not a CPU)")
    for side, wide in ((56, True), (14, False)):
        x, w = _f32(1, 16, side, side), _f32(24, 16, 1, 1)
        conv = kg.conv(kg.tensor("x", x.shape), kg.tensor("w", w.shape))
        kernel = kg.fuse(conv).emit_kernel("opencl", tuning="none")
        assert kernel.metadata["tunables"]["tile"] == _expected_tile(24, side * side)
        assert (kernel.metadata["tunables"]["tile"][0] == WIDE_TILE[0]) == wide
        want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x)
        assert_close(kernel(x, w), want, np.float32, scale=16)


@pytest.mark.parametrize("m,k,n,unrolled", [(64, 16, 1024, False), (64, 4, 1024, True),
                                            (2, 16, 1024, True), (3, 16, 1024, False),
                                            (1, 32, 40, True)])
def test_reduction_unrolls_within_the_fma_budget(m: int, k: int, n: int,
                                                 unrolled: bool) -> None:
    """Tile rows x vectors x reduction points against the budget of 64: 8 x 2 x 16 runs a
    loop, 8 x 2 x 4 unrolls, 2 x 2 x 16 unrolls, 3 x 2 x 16 does not, 1 x 2 x 32 does."""
    require("opencl")
    caps = backends.get("opencl").caps
    if caps.vector_widths[:1] != (16,):
        pytest.skip("the budget's cases are sized for 16-lane vectors (AVX-512 PoCL)")
    a, b = _f32(m, k), _f32(k, n)
    kernel = kg.fuse(kg.matmul(kg.tensor("a", (m, k)), kg.tensor("b", (k, n)))).emit_kernel(
        "opencl", tuning="none", tile=(8, 32))
    tm, tn = kernel.metadata["tunables"]["tile"]
    fmas = tm * -(-tn // kernel.metadata["tunables"]["vector_width"]) * k
    assert (UNROLLED in kernel.source) == unrolled == (fmas <= schedule.UNROLL_K_MAX_FMAS)
    assert_close(kernel(a, b), a.astype(np.float64) @ b, np.float32, scale=k)


def test_a_depthwise_window_unrolls_its_taps() -> None:
    """The row-less depthwise contraction (one row, two vectors, 9 taps) unrolls."""
    require("opencl")
    if backends.get("opencl").caps.vector_widths[:1] != (16,):
        pytest.skip("sized for 16-lane vectors (AVX-512 PoCL)")
    x, w = _f32(1, 8, 11, 37), _f32(8, 1, 3, 3)
    conv = kg.conv(kg.tensor("x", x.shape), kg.tensor("w", w.shape), pads=[1, 1, 1, 1],
                   group=8)
    kernel = kg.fuse(conv).emit_kernel("opencl", tuning="none", schedule="tiled")
    assert UNROLLED in kernel.source
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(w[None, :, 0, i, j, None, None] * padded[:, :, i:i + 11, j:j + 37]
               for i in range(3) for j in range(3))
    assert_close(kernel(x, w), want, np.float32, scale=9)
