"""The OpenCL vector contraction's default register tile and reduction unrolling: on a CPU, 6
rows x 4 vectors where four-vector column tiles waste at most ``WIDE_MAX_WASTE`` of the
columns (4 rows where 6-row tiles would waste as much of the rows), 8 rows x 2 vectors
elsewhere, and with 16 SIMD registers (AVX2) 4 x 3 and 6 x 2
register-wide vectors; the reduction loop unrolled completely only while the unrolled body
stays within ``UNROLL_K_MAX_FMAS`` vector FMAs; a tile's column vectors computing their
epilogue statement by statement in turn. Each default is checked against NumPy on
shapes that leave a partial (shifted) last row and column tile."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import schedule
from kernelgen.backends.opencl.columns import WIDE_MAX_WASTE, register_tiles

rng = np.random.default_rng(41)
UNROLLED = '_Pragma("unroll") for (int kg_k'


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _expected_tile(m: int, n: int, backend: object = None) -> tuple[int, int]:
    """The tile the rule gives an (m x n) output on ``backend`` (the test device's by
    default), computed from its register tiles."""
    caps = (backend or backends.get("opencl")).caps  # type: ignore[attr-defined]
    tiles = register_tiles(caps)
    width = tiles.widths[0]
    wide_n = tiles.wide[1] * width
    if caps.simd_within_work_item and n >= wide_n and \
            -(-n // wide_n) * wide_n <= WIDE_MAX_WASTE * n:
        rows = min(tiles.wide[0], m)
        if -(-m // rows) * rows > WIDE_MAX_WASTE * m:  # 6-row tiles over 32 rows: 36 computed
            rows = tiles.wide_few_rows
        return rows, wide_n
    return min(tiles.default[0], m), tiles.default[1] * width


@pytest.mark.parametrize("m,k,n", [(97, 27, 1031), (5, 3, 784), (13, 64, 196), (64, 9, 49),
                                   (3, 1, 4096), (32, 16, 1024), (29, 5, 640)])
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
        assert (kernel.metadata["tunables"]["tile"][1] == register_tiles(caps).wide[1] *
                register_tiles(caps).widths[0]) == wide
        want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x)
        assert_close(kernel(x, w), want, np.float32, scale=16)


@pytest.mark.parametrize("device,side,tile,width", [
    ("cpu-avx2", 56, (4, 24), 8), ("cpu-avx2", 14, (6, 16), 8), ("cpu-avx2", 7, (6, 16), 8),
    ("cpu-avx512", 56, (6, 64), 16), ("cpu-avx512", 14, (8, 32), 16),
    ("cpu-sse", 56, (4, 12), 4), ("cpu-sse", 7, (6, 8), 4)])
def test_register_tiles_fit_the_devices_registers(device: str, side: int,
                                                  tile: tuple[int, int], width: int) -> None:
    """A 1x1 convolution + ReLU generated for a declared CPU: its sums fill at most 12 of AVX2's
    and SSE's 16 registers (vectors one register wide), 24 of AVX-512's 32; run on the test
    device against NumPy (29 output channels: a partial last row tile)."""
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")
    be = backends.REGISTRY["opencl"].for_device(device)  # type: ignore[attr-defined]
    x, w = _f32(1, 19, side, side), _f32(29, 19, 1, 1)
    conv = kg.conv(kg.tensor("x", x.shape), kg.tensor("w", w.shape))
    kernel = kg.fuse(conv, kg.relu(conv)).emit_kernel(be, tuning="none")
    tunables = kernel.metadata["tunables"]
    assert (tuple(tunables["tile"]), tunables["vector_width"]) == (tile, width)
    assert tuple(tunables["tile"]) == _expected_tile(29, side * side, be)
    require_vectors_of(kernel.source)
    want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x)
    assert_close(kernel(x, w), np.maximum(want, 0), np.float32, scale=19)


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
        pytest.skip("the budget's cases are sized for 16-lane vectors (AVX-512 PoCL), which "
                    "the OpenCL device does not build")
    a, b = _f32(m, k), _f32(k, n)
    # generated for AVX-512 (an AVX2 device's tile takes 8-lane vectors), run on this device
    avx512 = backends.REGISTRY["opencl"].for_device("cpu-avx512")  # type: ignore[attr-defined]
    kernel = kg.fuse(kg.matmul(kg.tensor("a", (m, k)), kg.tensor("b", (k, n)))).emit_kernel(
        avx512, tuning="none", tile=(8, 32))
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


@pytest.mark.parametrize("c,m,side,grouped", [(512, 521, 5, True), (263, 1009, 7, True),
                                              (700, 400, 13, False), (37, 131, 5, False),
                                              (3, 17, 2, False)])
def test_work_groups_hold_column_tiles_where_the_left_operand_is_larger(
        c: int, m: int, side: int, grouped: bool) -> None:
    """A 1x1 convolution whose weights (the left operand) are 4 times its input or more and
    1 MiB or more runs work-groups of one row tile's column tiles on a CPU (they share its
    weight rows); else of row tiles (700->400: weights 2.4 times the input; 37->131: 19 KiB
    of weights). Both orders, forced, agree with NumPy on the same awkward shapes (prime
    channel counts, a partial last row and column tile)."""
    require("opencl")
    caps = backends.get("opencl").caps
    if not caps.simd_within_work_item or not caps.vector_widths:
        pytest.skip("column-tile groups are a CPU default (the OpenCL device is not a CPU)")
    x, w = _f32(1, c, side, side), _f32(m, c, 1, 1)
    conv = kg.conv(kg.tensor("x", x.shape), kg.tensor("w", w.shape))
    fused = kg.fuse(conv, kg.relu(conv))
    want = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x), 0)
    default = fused.emit_kernel("opencl", tuning="none")
    assert bool(default.metadata["tunables"].get("group_columns")) == grouped
    for order in (True, False):
        kernel = fused.emit_kernel("opencl", tuning="none", group_columns=order)
        local = kernel.metadata["launch"]["local_size"]
        tiles_c = kernel.metadata["launch"]["global_size"][1]
        if order:  # the group fills the column tiles before the row tiles: all it may hold,
            # or a divisor of the column tiles not under half that (no idle items in the last)
            most = min(tiles_c, kernel.metadata["tunables"]["local_size"])
            assert local[1] == most or (tiles_c % local[1] == 0 and 2 * local[1] >= most)
        assert_close(kernel(x, w), want, np.float32, scale=c)


def test_column_tile_groups_are_refused_where_they_do_not_apply() -> None:
    """group_columns with a packed right operand, on the scalar template (no run as wide as a
    vector) or on another schedule is refused, naming the kernel and what it needs."""
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")
    mm = kg.matmul(kg.tensor("a", (64, 32)), kg.tensor("b", (32, 40)))
    with pytest.raises(ValueError, match=r"group_columns applies .* in place.*pack=False"):
        kg.fuse(mm).emit_kernel("opencl", tuning="none", pack=True, group_columns=True)
    narrow = kg.matmul(kg.tensor("a", (2, 7, 13)), kg.tensor("b", (13, 3)))  # no vector run
    with pytest.raises(ValueError, match=r"'fused_matmul'.*group_columns applies to the "
                                         r"vector template"):
        kg.fuse(narrow).emit_kernel("opencl", tuning="none", group_columns=False)
    x = kg.tensor("x", (8, 300))
    with pytest.raises(ValueError, match=r"group_columns applies to the 'tiled' schedule"):
        kg.fuse(kg.reduce_sum(x, axes=[1])).emit_kernel("opencl", group_columns=True)


@pytest.mark.parametrize("device,m,k,n", [("cpu-avx2", 37, 29, 61), ("cpu-avx2", 29, 31, 3001),
                                          ("cpu-avx512", 13, 7, 131)])
def test_a_tiles_epilogue_interleaves_its_column_vectors(device: str, m: int, k: int,
                                                          n: int) -> None:
    """MatMul + bias + GELU (erf) generated for a declared CPU: a whole tile's column vectors
    compute their epilogue statement by statement in turn, so their erf chains overlap (the
    bias loads on consecutive lines, the stores last, one after another); the last column tile,
    shifted back, computes it in vectors too and stores the lanes from ``kg_own`` on, none lane
    by lane in a loop. Run on the test device against ``math.erf``, with a partial last row
    tile."""
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")
    be = backends.REGISTRY["opencl"].for_device(device)  # type: ignore[attr-defined]
    a, w, bias = _f32(m, k), _f32(k, n), _f32(n)
    mm = kg.matmul(kg.tensor("a", (m, k)), kg.tensor("w", (k, n)))
    ops = [mm, kg.add(mm, kg.tensor("bias", (n,)))]
    ops.append(kg.div(ops[-1], kg.constant("sqrt2", np.array(math.sqrt(2), np.float32))))
    ops.append(kg.erf(ops[-1]))
    ops.append(kg.add(ops[-1], kg.constant("one", np.array(1, np.float32))))
    ops.append(kg.mul(ops[1], ops[-1]))
    ops.append(kg.mul(ops[-1], kg.constant("half", np.array(0.5, np.float32))))
    kernel = kg.fuse(*ops).emit_kernel(be, tuning="none")
    tunables = kernel.metadata["tunables"]
    vectors = tunables["tile"][1] // tunables["vector_width"]
    assert tunables["schedule"] == "tiled" and vectors >= 2
    lines = kernel.source.splitlines()
    start = next(i for i, line in enumerate(lines) if "a whole tile" in line)
    end = next(i for i in range(start, len(lines)) if "the last tile, shifted" in lines[i])
    loads = [i for i in range(start, end) if "vload" in lines[i] and "bias" in lines[i]]
    stores = [i for i in range(start, end) if "vstore" in lines[i]]
    assert loads == list(range(loads[0], loads[0] + vectors))
    assert stores == list(range(end - vectors, end))
    shifted = lines[end:next(i for i in range(end, len(lines)) if lines[i].strip() == "}")]
    assert not any("for (" in line or "kg_sums" in line for line in shifted)
    assert any("vstore" in line or "] = " in line for line in shifted)
    require_vectors_of(kernel.source)
    hd = a.astype(np.float64) @ w + bias
    want = 0.5 * hd * (1 + np.vectorize(math.erf)(hd / math.sqrt(2)))
    assert_close(kernel(a, w, bias), want, np.float32, scale=k)


@pytest.mark.parametrize("n", [63, 47, 57, 50, 33])
def test_shifted_last_column_tile_stores_its_lanes_as_vectors(n: int) -> None:
    """The last column tile of a run that is no multiple of the tile shifts back over its
    neighbour: its epilogue (bias + sigmoid) is computed in vectors and each vector stores the
    lanes from the tile's first own column on, in pieces of 8, 4, 2 and 1 lanes (shifts of 1,
    17, 7, 14 and 31 lanes on 32-column tiles; with AVX-512's 16-lane vectors the first two
    need all four pieces), never lane by lane in a loop. Against NumPy, every column checked."""
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")
    m, k = 11, 13
    a, w, bias = _f32(m, k), _f32(k, n), _f32(n)
    mm = kg.matmul(kg.tensor("a", (m, k)), kg.tensor("w", (k, n)))
    added = kg.add(mm, kg.tensor("bias", (n,)))
    kernel = kg.fuse(mm, added, kg.sigmoid(added)).emit_kernel("opencl", tuning="none",
                                                                 tile=(4, 32))
    tile_n, width = kernel.metadata["tunables"]["tile"][1], kernel.metadata["tunables"][
        "vector_width"]
    shift = -(-n // tile_n) * tile_n - n
    src = kernel.source
    assert "kg_sums" not in src
    if shift:  # the shifted tile's first stored lane: a piece of the vector it falls in
        assert f"the last tile, shifted {shift} back" in src
        lane = shift % width
        if lane:
            assert f".s{lane:x}" in src
    hd = a.astype(np.float64) @ w + bias
    assert_close(kernel(a, w, bias), 1 / (1 + np.exp(-hd)), np.float32, scale=k)


@pytest.mark.parametrize("side,channels", [(112, 3), (223, 3), (55, 16)])
def test_conv_with_a_shifted_last_column_tile(side: int, channels: int) -> None:
    """A stride-2 stem conv (3 channels, 3x3, pads 1) and a stride-1 3x3 conv with bias and
    ReLU6, whose output rows (56, 112, 55 columns) end in a shifted column tile, against
    ONNX's reference evaluator."""
    require("opencl")
    stride = 2 if channels == 3 else 1
    x = kg.tensor("x", (1, channels, side, side))
    weights, bias = _f32(24, channels, 3, 3), _f32(1, 24, 1, 1)
    conv = kg.conv(x, kg.constant("w", weights), strides=[stride] * 2, pads=[1] * 4)
    ops = [conv, kg.add(conv, kg.constant("b", bias))]
    ops.append(kg.clip(ops[-1], 0.0, 6.0))
    kernel = kg.fuse(*ops).emit_kernel("opencl", tuning="none")
    xv = _f32(1, channels, side, side)
    want = evaluate_chain(ops, {"x": xv, "w": weights, "b": bias})[ops[-1].name]
    assert_close(kernel(xv), want, np.float32, scale=9 * channels)
