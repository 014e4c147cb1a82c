"""Regression tests for the differential fuzzer's findings (tests/fuzz), on every backend.

References are NumPy (or ``math``) in the block's dtype, written from the operators' definitions.
Where ONNX's reference evaluator disagrees with the definition, the test says so: it rounds a
float64 Erf to float32 and a float attribute (LeakyRelu's alpha) to float32, drops NaN from an
AveragePool window (count_include_pad=0), and dilates a Conv kernel with explicit zeros, so a NaN
between the taps becomes 0 * NaN. kernelgen follows the definition in all four.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run
from reference import reference

import kernelgen as kg

inf, nan = np.inf, np.nan

# rows of 13 (a prime): +Inf among finite values, +Inf and -Inf, all -Inf, NaN, NaN and +Inf,
# huge values (overflow without the max shift), -Inf among finite values, plain values
_LSE_ROWS = [
    [1.0, inf, 2.0], [inf, -inf, 0.0], [-inf], [nan, 1.0], [inf, nan, 0.0],
    [3e38, 3e38, 1.0, -inf], [-3e38, -3e38], [-inf, 1.0, -inf, 2.0], [0.5, -1.5, 2.5, 0.25],
]


def _lse_data(dtype: str) -> np.ndarray:
    """The rows above, each padded to 13 with its own last value (so the row keeps its kind)."""
    return np.array([r + [r[-1]] * (13 - len(r)) for r in _LSE_ROWS], dtype)


def _lse_reference(x: np.ndarray, axis: int) -> np.ndarray:
    # logaddexp is exact for infinities: +Inf in a row gives +Inf, all -Inf gives -Inf
    with np.errstate(all="ignore"):
        return np.logaddexp.reduce(x, axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [1, 0])
def test_reduce_log_sum_exp_of_infinite_rows(backend: str, axis: int, dtype: str) -> None:
    """A row with +Inf sums to +Inf, an all -Inf row to -Inf (no exp(inf - inf) = NaN), NaN
    stays NaN, and 3e38 + 3e38 does not overflow."""
    x = _lse_data(dtype)
    x = x if axis == 1 else np.ascontiguousarray(x.T)
    (got,) = run(backend, kg.fuse(kg.reduce_log_sum_exp(kg.tensor("x", x.shape, dtype),
                                                        axes=[axis])), x)
    want = _lse_reference(x, axis)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0))
    np.testing.assert_array_equal(np.isinf(got) & (got < 0), np.isinf(want) & (want < 0))
    finite = np.isfinite(want)
    rtol = 1e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol)


def test_reduce_log_sum_exp_of_plus_inf_matches_onnx(backend: str) -> None:
    x = _lse_data("float32")[:2]
    op = kg.reduce_log_sum_exp(kg.tensor("x", x.shape), axes=[1])
    (got,) = run(backend, kg.fuse(op), x)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, reference(op, x))  # both rows +Inf


@pytest.mark.parametrize("build", [kg.softmax, kg.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_of_a_plus_inf_row_is_nan(backend: str, build) -> None:
    """exp(inf - inf) is NaN in ONNX's reference and in NumPy's max-shifted formula: a row with
    +Inf is NaN throughout; the other rows are untouched."""
    x = np.array([[1.0, inf, 2.0, -1.0, 0.0, 3.0, 0.5], [1, 2, 3, 4, 5, 6, 7]], np.float32)
    op = build(kg.tensor("x", x.shape), axis=1)
    (got,) = run(backend, kg.fuse(op), x)
    with np.errstate(all="ignore"):
        want = reference(op, x)
    assert np.isnan(got[0]).all() and np.isnan(want[0]).all()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


# float64 operators whose constants are not float32 numbers: a constant rounded to float32
# would be off by about 1e-9 relative (or flip a threshold test at 0.1)
_X64 = np.array([-0.9852532411897584, -1.2504309756852816, 0.1, 0.1000000001, 0.09999999999,
                 0.7000000001, 2.134675433053179, -3.3, 0.0, 0.6999999999, 1e-310], np.float64)
_F64 = {
    "leaky_relu": (lambda t: kg.leaky_relu(t, alpha=0.01), lambda x: np.where(x < 0, 0.01 * x, x)),
    "thresholded_relu": (lambda t: kg.thresholded_relu(t, alpha=0.1),
                         lambda x: np.where(x > 0.1, x, 0.0)),
    "clip": (lambda t: kg.clip(t, 0.1, 0.7), lambda x: np.clip(x, 0.1, 0.7)),
    "hard_sigmoid": (lambda t: kg.hard_sigmoid(t, alpha=0.1, beta=0.3),
                     lambda x: np.clip(0.1 * x + 0.3, 0.0, 1.0)),
    "elu": (lambda t: kg.elu(t, alpha=0.3), lambda x: np.where(x < 0, 0.3 * np.expm1(x), x)),
    # ONNX's reference evaluates Erf with otypes="f": float32 results even for float64
    "erf": (kg.erf, np.vectorize(math.erf, otypes=[np.float64])),
}


@pytest.mark.parametrize("name", list(_F64))
def test_float64_constants_keep_full_precision(backend: str, name: str) -> None:
    build, ref = _F64[name]
    (got,) = run(backend, kg.fuse(build(kg.tensor("x", _X64.shape, "float64"))), _X64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref(_X64), rtol=4e-15, atol=0)


def test_nan_in_a_mean_reaches_the_average_pool(backend: str) -> None:
    """ReduceMean then AveragePool (count_include_pad=0), fused, float64: a NaN in the data makes
    every window over it NaN (ONNX's reference drops NaN from such windows instead)."""
    x = np.random.default_rng(3).standard_normal((7, 13, 5))
    x[1, 4, 2] = nan  # under all three windows of its row
    x[5, 0, 1] = inf
    src = kg.tensor("x", (2, 7, 13, 5), "float64")
    mean = kg.reduce_mean(src, axes=[0, 2], keepdims=1)
    pool = kg.average_pool(mean, kernel_shape=[1, 3], pads=[0, 0, 0, 0], strides=[2, 1])
    data = np.ascontiguousarray(np.broadcast_to(x, (2, 7, 13, 5)))
    (got,) = run(backend, kg.fuse(mean, pool, outputs=[pool], force=True), data)
    m = data.mean(axis=(0, 2), keepdims=True)
    want = np.lib.stride_tricks.sliding_window_view(m, 3, axis=3).mean(axis=-1)
    assert np.isnan(want).sum() == 3 and np.isinf(want).sum() == 2
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-13)


def _conv(x: np.ndarray, w: np.ndarray, pad: int, stride: int, dilation: int, group: int
          ) -> np.ndarray:
    """Conv from the definition: sum over the taps only, zero padding (N, C, *spatial)."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pad, pad)] * nd)
    span = [(k - 1) * dilation + 1 for k in w.shape[2:]]
    out_sp = [(n - s) // stride + 1 for n, s in zip(xp.shape[2:], span)]
    cin, cout = w.shape[1], w.shape[0]
    out = np.zeros((x.shape[0], cout, *out_sp))
    for oc in range(cout):
        g = oc // (cout // group)
        for o in np.ndindex(*out_sp):
            for tap in np.ndindex(*w.shape[2:]):
                at = tuple(oi * stride + ti * dilation for oi, ti in zip(o, tap))
                v = xp[(slice(None), slice(g * cin, (g + 1) * cin), *at)]
                out[(slice(None), oc, *o)] += (v * w[(oc, slice(None), *tap)]).sum(axis=1)
    return out


def test_relu_nan_survives_a_padded_conv_prologue(backend: str) -> None:
    """Conv(Relu(x)) fused with zero padding: a NaN pixel, inside or on the border, makes every
    output whose window covers it NaN; the padding zeros do not turn it into 0."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 5, 6))
    x[0, 0, 2, 3] = nan
    x[0, 1, 0, 5] = nan
    w = rng.standard_normal((3, 2, 3, 3))
    act = kg.relu(kg.tensor("x", x.shape, "float64"))
    conv = kg.conv(act, kg.tensor("w", w.shape, "float64"), pads=[1] * 4)
    (got,) = run(backend, kg.fuse(act, conv), x, w)
    with np.errstate(invalid="ignore"):
        want = _conv(np.maximum(x, 0), w, pad=1, stride=1, dilation=1, group=1)
    assert 0 < np.isnan(want).sum() < want.size
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_nan_between_dilated_taps_is_not_read(backend: str) -> None:
    """Stride 2, dilation 2, padding 1: the even pixels are never under a tap, so a NaN there
    leaves the output finite. (ONNX's reference dilates the kernel with zeros: 0 * NaN.)"""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 2, 7))
    x[1, 1, 4] = nan  # between taps
    x[0, 0, 3] = nan  # under a tap
    w = rng.standard_normal((4, 1, 2))
    act = kg.relu(kg.tensor("x", x.shape, "float64"))
    conv = kg.conv(act, kg.tensor("w", w.shape, "float64"), pads=[1, 1], strides=[2],
                   dilations=[2], group=2)
    (got,) = run(backend, kg.fuse(act, conv), x, w)
    with np.errstate(invalid="ignore"):
        want = _conv(np.maximum(x, 0), w, pad=1, stride=2, dilation=2, group=2)
    assert np.isnan(want[0]).any() and not np.isnan(want[1]).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
