"""Fused blocks that read an input along another axis than the output's contiguous one (a
transpose, NCHW<->NHWC, a reshape around a transpose): equal to NumPy on every backend, on
awkward shapes; on OpenCL and NEON C they run as register-transposed tiles
(``backends/c/transposed_tile.py``), chosen from the composed index maps' strides, with tails
cut by primes."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, opencl_caps, require, run

import kernelgen as kg

# (input shape, permutation): 2-D, with sides below, at and above the tile; NCHW->NHWC and
# back; a 3-D rotation
PERMUTATIONS = [((37, 29), (1, 0)), ((8, 8), (1, 0)), ((1, 64), (1, 0)), ((9, 17), (1, 0)),
                ((2, 13, 7, 11), (0, 2, 3, 1)), ((2, 11, 5, 13), (0, 3, 1, 2)),
                ((5, 24, 9), (2, 0, 1))]


def _transpose_add_relu(shape: tuple[int, ...], perm: tuple[int, ...], dtype: str = "float32"
                        ) -> tuple[kg.FusedOp, dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(sum(shape))
    out_shape = tuple(shape[p] for p in perm)
    x = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(out_shape[-1]).astype(dtype)
    t = kg.transpose(kg.tensor("x", shape, dtype), perm)
    s = kg.add(t, kg.tensor("b", (out_shape[-1],), dtype))
    r = kg.relu(s)
    return kg.fuse(t, s, r), {"x": x, "b": b}, np.maximum(np.transpose(x, perm) + b, 0)


@pytest.mark.parametrize("shape,perm", PERMUTATIONS)
def test_fused_transposes_equal_numpy(backend: str, shape: tuple[int, ...],
                                      perm: tuple[int, ...]) -> None:
    fused, arrays, want = _transpose_add_relu(shape, perm)
    (got,) = run(backend, fused, *(arrays[t.name] for t in fused.inputs))
    assert_close(got, want)


@pytest.mark.parametrize("shape,perm", PERMUTATIONS)
def test_opencl_tiles_where_both_axes_hold_a_vector(shape: tuple[int, ...],
                                                    perm: tuple[int, ...]) -> None:
    """The tile is taken where the output's contiguous axis and the axis the input is read
    along both span a vector (8 on a CPU, 4 on a GPU, whose vectors stop at 4); else one
    point per work-item."""
    width = max(w for w in opencl_caps().vector_widths if w <= 8)
    fused, _, _ = _transpose_add_relu(shape, perm)
    kernel = fused.emit("opencl", tuning="none")
    out_shape = [shape[p] for p in perm]
    read_along = shape[-1]  # the input's contiguous axis
    tiled = min(out_shape[-1], read_along) >= width
    assert (kernel.metadata["tunables"].get("tile") == (width, width)) == tiled, kernel.source
    if tiled:
        assert kernel.metadata["transposed_reads"] == ["x"]


@pytest.mark.parametrize("tile", [(4, 4), (8, 8), (16, 16), (1, 1)])
def test_every_tile_width_equals_numpy(tile: tuple[int, int]) -> None:
    """Each width on sides that no width divides (37 x 41); (1, 1) is one point per item."""
    require("opencl")
    fused, arrays, want = _transpose_add_relu((41, 37), (1, 0))
    kernel = fused.emit("opencl", tile=tile, tuning="none")
    assert kernel.metadata["tunables"]["tile"] == tile
    assert ("kg_a0" in kernel.source) == (tile != (1, 1))
    assert_close(kernel(*(arrays[t.name] for t in fused.inputs)), want)


@pytest.mark.parametrize("shape,perm", PERMUTATIONS)
def test_neon_tiles_where_both_axes_hold_a_vector(shape: tuple[int, ...],
                                                  perm: tuple[int, ...]) -> None:
    """NEON C takes 4 x 4 tiles (vtrnq_f32) where both axes span four points, and runs one
    point at a time with ``tile=(1, 1)``; both equal NumPy."""
    require("neon")
    fused, arrays, want = _transpose_add_relu(shape, perm)
    inputs = [arrays[t.name] for t in fused.inputs]
    kernel = fused.emit("neon", tuning="none")
    tiled = min(shape[p] for p in (perm[-1], len(shape) - 1)) >= 4
    assert (kernel.metadata["tunables"].get("tile") == (4, 4)) == tiled
    assert ("kg_vtranspose4_f32(" in kernel.source) == tiled, kernel.source
    if tiled:
        assert kernel.metadata["transposed_reads"] == ["x"]
    points = fused.emit("neon", tuning="none", tile=(1, 1))
    assert "kg_vtranspose4_f32(" not in points.source
    assert_close(kernel(*inputs), want)
    assert_close(points(*inputs), want)


@pytest.mark.parametrize("shape,tile,words", [
    ((16, 16), (8, 8), r"\(4, 4\), transposing"),
    ((16, 16), (4, 8), r"\(4, 4\), transposing"),
    ((3, 16), (4, 4), "no such read"),
])
def test_neon_bad_tiles_are_refused_with_the_kernel_named(shape: tuple[int, int],
                                                          tile: tuple[int, int],
                                                          words: str) -> None:
    require("neon")
    fused, _, _ = _transpose_add_relu(shape, (1, 0))
    with pytest.raises(ValueError, match=words) as info:
        fused.emit("neon", tuning="none", tile=tile)
    assert "fused_transpose_add_relu" in str(info.value)


def test_two_inputs_read_transposed_and_two_outputs(backend: str) -> None:
    """Both inputs are read along the rows, and two outputs are stored from one tile."""
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((19, 23)).astype(np.float32) for _ in range(2))
    tx = kg.transpose(kg.tensor("x", x.shape), (1, 0))
    ty = kg.transpose(kg.tensor("y", y.shape), (1, 0))
    s = kg.add(tx, ty)
    m = kg.mul(tx, ty)
    fused = kg.fuse(tx, ty, s, m, outputs=[s, m])
    arrays = {"x": x, "y": y}
    got = run(backend, fused, *(arrays[t.name] for t in fused.inputs))
    assert_close(got[0], x.T + y.T)
    assert_close(got[1], x.T * y.T)
    if backend in ("opencl", "neon"):
        facts = fused.emit(backend, tuning="none").metadata
        assert facts["transposed_reads"] == ["x", "y"]


def test_reads_along_different_axes_stay_point_by_point(backend: str) -> None:
    """Two inputs read along two different axes: no one tile serves both, and the kernel is
    still right."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 10, 11)).astype(np.float32)
    y = rng.standard_normal((10, 11, 9)).astype(np.float32)
    tx = kg.transpose(kg.tensor("x", x.shape), (1, 2, 0))   # (10, 11, 9), read along axis 1
    ty = kg.transpose(kg.tensor("y", y.shape), (0, 1, 2))   # contiguous
    tz = kg.transpose(kg.tensor("z", (11, 9, 10)), (2, 0, 1))  # (10, 11, 9), read along 0
    z = rng.standard_normal((11, 9, 10)).astype(np.float32)
    xy = kg.add(tx, ty)
    s = kg.add(xy, tz)
    fused = kg.fuse(tx, ty, tz, xy, s)
    arrays = {"x": x, "y": y, "z": z}
    (got,) = run(backend, fused, *(arrays[t.name] for t in fused.inputs))
    assert_close(got, np.transpose(x, (1, 2, 0)) + y + np.transpose(z, (2, 0, 1)))
    if backend in ("opencl", "neon"):
        assert "tile" not in fused.emit(backend, tuning="none").metadata["tunables"]


def test_channel_shuffle_reads_rows_contiguously(backend: str) -> None:
    """ShuffleNet's channel shuffle (reshape, transpose, reshape) permutes channels only: the
    composed map reads along W contiguously, so no tile is needed, and the result is right."""
    n, c, h, w, g = 2, 12, 5, 7, 3
    x = np.random.default_rng(5).standard_normal((n, c, h, w)).astype(np.float32)
    r1 = kg.reshape(kg.tensor("x", x.shape), (n, g, c // g, h, w))
    t = kg.transpose(r1, (0, 2, 1, 3, 4))
    r2 = kg.reshape(t, (n, c, h, w))
    out = kg.relu(r2)
    fused = kg.fuse(r1, t, r2, out)
    (got,) = run(backend, fused, x)
    want = np.maximum(x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(x.shape), 0)
    assert_close(got, want)
    if backend in ("opencl", "neon"):
        assert "tile" not in fused.emit(backend, tuning="none").metadata["tunables"]


def test_float16_transposes_point_by_point(backend: str) -> None:
    """The tile's vectors are float32; a float16 block keeps one point per item, and is right."""
    fused, arrays, want = _transpose_add_relu((17, 19), (1, 0), "float16")
    (got,) = run(backend, fused, *(arrays[t.name] for t in fused.inputs))
    assert_close(got, want, "float16")
    if backend in ("opencl", "neon"):
        assert "tile" not in fused.emit(backend, tuning="none").metadata["tunables"]


@pytest.mark.parametrize("options,words", [
    ({"tile": (8, 4)}, r"tile \(w, w\) for w in \["),
    ({"tile": (8, 8), "unroll": (1, 2)}, "give one"),
])
def test_bad_tiles_are_refused_with_the_kernel_named(options: dict, words: str) -> None:
    require("opencl")
    fused, _, _ = _transpose_add_relu((16, 16), (1, 0))
    with pytest.raises(ValueError, match=words) as info:
        fused.emit("opencl", tuning="none", **options)
    assert fused.lower().name in str(info.value)


def test_a_tile_on_contiguous_reads_is_refused() -> None:
    require("opencl")
    x = kg.tensor("x", (16, 16))
    fused = kg.fuse(kg.relu(x))
    with pytest.raises(ValueError, match="has no such read"):
        fused.emit("opencl", tile=(8, 8), tuning="none")
