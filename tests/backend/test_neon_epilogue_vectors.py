"""NEON's tiled contraction runs its epilogue as float32x4 vectors along a tile row's columns
(``ContractionEmitter._vector_epilogue``) where the output's innermost axis allows: GELU's
erf, a sigmoid over a residual, a head split's stores. Checked against NumPy (float64) on rows
no multiple of the tile, column counts that end inside a tile, NaN and Inf in the input; and
left scalar where a vector would cross a run (a prime width, heads of 6) or read a strided
operand (a transposed residual), still right there."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import require

import kernelgen as kg

rng = np.random.default_rng(17)
_erf = np.vectorize(math.erf)


def _source(program: object) -> str:
    kernels = getattr(program, "kernels", None)
    return kernels[-1].source if kernels else program.source  # type: ignore[attr-defined]


def _x(m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[1, 3], x[min(5, m - 1), 0] = np.nan, np.inf  # a NaN row and an Inf row of outputs
    return x


def _check(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("m, k, n", [(13, 37, 44), (4, 16, 64), (31, 5, 12)])
def test_gelu_epilogue_as_vectors(m: int, k: int, n: int) -> None:
    require("neon")
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
    a = kg.add(mm, kg.constant("b", b))
    program = kg.fuse(mm, a, kg.gelu(a)).emit("neon", tuning="none")
    assert "kg_acc_v" in _source(program)
    x = _x(m, k)
    with np.errstate(invalid="ignore"):
        y = x.astype(np.float64) @ w + b
        _check(program(x), 0.5 * y * (1 + _erf(y / math.sqrt(2))))


def test_sigmoid_of_a_residual_as_vectors_and_a_transposed_one_lane_by_lane() -> None:
    require("neon")
    m, k, n = 9, 23, 20
    w = rng.standard_normal((k, n)).astype(np.float32)
    for transposed in (False, True):
        r = kg.tensor("r", (n, m) if transposed else (m, n))
        mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
        read = kg.transpose(r, [1, 0]) if transposed else r
        ops = [mm, *([read] if transposed else []), kg.add(mm, read)]
        program = kg.fuse(*ops, kg.sigmoid(ops[-1])).emit("neon", tuning="none")
        assert ("kg_acc_v" in _source(program)) is not transposed
        x = _x(m, k)
        res = rng.standard_normal((n, m) if transposed else (m, n)).astype(np.float32)
        y = x.astype(np.float64) @ w + (res.T if transposed else res)
        with np.errstate(invalid="ignore", over="ignore"):
            _check(program(x, res), 1 / (1 + np.exp(-y)))


@pytest.mark.parametrize("heads, depth, vectors", [(3, 16, True), (4, 6, False)])
def test_head_split_stores(heads: int, depth: int, vectors: bool) -> None:
    """Heads of 16 store whole vectors at each head's place; heads of 6 would have a vector
    cross two heads, so they store lane by lane."""
    require("neon")
    s, hidden = 11, 24
    w = rng.standard_normal((hidden, heads * depth)).astype(np.float32)
    b = rng.standard_normal(heads * depth).astype(np.float32)
    mm = kg.matmul(kg.tensor("x", (1, s, hidden)), kg.constant("w", w))
    a = kg.add(mm, kg.constant("b", b))
    split = kg.reshape(a, [1, s, heads, depth])
    program = kg.fuse(mm, a, split, kg.transpose(split, [0, 2, 1, 3])).emit("neon",
                                                                           tuning="none")
    assert ("kg_acc_v" in _source(program)) is vectors
    x = _x(s, hidden).reshape(1, s, hidden)
    want = (x.astype(np.float64) @ w + b).reshape(1, s, heads, depth).transpose(0, 2, 1, 3)
    _check(program(x), want)


@pytest.mark.parametrize("kernel, shape", [(1, (13, 7, 7)), (3, (5, 9, 11))])
def test_conv_epilogue_along_its_merged_pixels(kernel: int, shape: tuple[int, ...]) -> None:
    """A convolution's columns are its pixels, (OH, OW) merged: the lanes run along the flat
    pixel even where a row of 7 or 11 is no multiple of four."""
    require("neon")
    c, h, w = shape
    x = rng.standard_normal((1, *shape)).astype(np.float32)
    x[0, 0, 1, 2] = np.nan
    weights = rng.standard_normal((6, c, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    pad = kernel // 2
    conv = kg.conv(kg.tensor("x", x.shape), kg.constant("w", weights), kg.constant("b", bias),
                   pads=[pad] * 4)
    program = kg.fuse(conv, kg.sigmoid(conv)).emit("neon", tuning="none")
    assert "kg_acc_v" in _source(program)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((1, 6, h, w))
    for i in range(kernel):
        for j in range(kernel):
            y += np.einsum("oc,nchw->nohw", weights[:, :, i, j], padded[:, :, i:i + h, j:j + w])
    with np.errstate(invalid="ignore", over="ignore"):
        _check(program(x), 1 / (1 + np.exp(-(y + bias[None, :, None, None]))))
