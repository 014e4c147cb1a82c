"""Special values and call-time indices on every backend (issue 23, probe defects D2 and D3).

NaN propagates through Relu, Clip, Max, Min, ReduceMax, ReduceMin and MaxPool, and Sign(NaN) is
NaN, as NumPy's ufuncs (the references here) and ONNX's reference evaluator say, except for
MaxPool, where ONNX's reference drops NaN and onnxruntime's answer depends on where in the
window the NaN is: kernelgen follows ReduceMax (``ops/nn.py`` says why). ±Inf and -0 behave as
in NumPy (-0 == 0; Clip keeps -0). A Gather index outside [-n, n-1] raises ``ArgumentError`` on
a call; a launch on device buffers, which skips the check, reads a clamped index.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import BACKENDS, require, run
from reference import reference

import kernelgen as kg
from kernelgen.exec import bounds

SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1.0, 1.0, 0.5, -0.5, 3e38, -3e38,
                    1e-45, -2.0], np.float32)
SHAPES = [(1,), (7,), (3, 13)]
EMITTED = [b for b in BACKENDS if b != "interp"]


def _special(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Every special value, shuffled, repeated to fill ``shape``; NaN in the first element."""
    values = np.random.default_rng(seed).permutation(SPECIAL)
    out = np.resize(values, int(np.prod(shape))).reshape(shape)
    out.flat[0] = np.nan
    return out


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, NaN where NaN, exactly (-0 == 0)."""
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    np.testing.assert_array_equal(got, want)


UNARY = {
    "relu": (kg.relu, lambda x: np.maximum(x, np.float32(0))),
    "clip": (lambda t: kg.clip(t, -1.0, 1.0), lambda x: np.clip(x, np.float32(-1), np.float32(1))),
    "clip-min": (lambda t: kg.clip(t, 0.25), lambda x: np.maximum(x, np.float32(0.25))),
    "sign": (kg.sign, np.sign),
    # single-element constants are read as numbers (fusion._number): Max and Min by a number
    # take one compare, by NaN the NaN-testing form; a number first or second
    "clip-constants": (lambda t: kg.clip(t, kg.constant("lo", np.float32(-1)),
                                         kg.constant("hi", np.float32(1))),
                       lambda x: np.clip(x, np.float32(-1), np.float32(1))),
    "max-nan-constant": (lambda t: kg.max(t, kg.constant("nan", np.float32(np.nan))),
                         lambda x: np.maximum(x, np.float32(np.nan))),
    "min-number-first": (lambda t: kg.min(kg.constant("two", np.float32(2)), t),
                         lambda x: np.minimum(np.float32(2), x)),
    # by zeros, whose sign decides between equal operands: NumPy gives the second one
    "min-zero": (lambda t: kg.min(t, kg.constant("zero", np.float32(0))),
                 lambda x: np.minimum(x, np.float32(0))),
    "max-negative-zero": (lambda t: kg.max(t, kg.constant("zero", np.float32(-0.0))),
                          lambda x: np.maximum(x, np.float32(-0.0))),
    "min-negative-zero": (lambda t: kg.min(t, kg.constant("zero", np.float32(-0.0))),
                          lambda x: np.minimum(x, np.float32(-0.0))),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(backend: str, name: str, shape: tuple[int, ...]) -> None:
    build, ref = UNARY[name]
    x = _special(shape)
    (got,) = run(backend, kg.fuse(build(kg.tensor("x", shape))), x)
    want = ref(x)
    _same(got, want)
    zeros = want == 0  # of NumPy's sign: Relu(-0) is +0, Clip keeps -0 inside its bounds
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


def test_unary_matches_onnx_reference(backend: str) -> None:
    """ONNX's reference evaluator agrees with the NumPy references above on NaN and Inf."""
    x = _special((3, 13))
    for build, _ in UNARY.values():
        op = build(kg.tensor("x", (3, 13)))
        (got,) = run(backend, kg.fuse(op), x)
        arrays = (v.value if isinstance(v, kg.Constant) else x for v in op.inputs)
        _same(got, np.asarray(reference(op, *arrays)))


# subnormals of both signs beside values whose rounding is known (a GPU flushes subnormals to
# zero inside its libdevice functions and approximate square roots, not in plain arithmetic)
SUBNORMAL = np.array([1e-45, -1e-45, 1e-40, -1e-40, -3e-42, 1.1754942e-38, -1.1754942e-38,
                      0.0, -0.0, 0.5, -0.5, 2.5, -2.5, np.nan], np.float32)
FLUSHED = {"floor": (kg.floor, np.floor), "ceil": (kg.ceil, np.ceil),
           "round": (kg.round, np.round), "sqrt": (kg.sqrt, np.sqrt), "sin": (kg.sin, np.sin),
           "tan": (kg.tan, np.tan)}


@pytest.mark.parametrize("name", list(FLUSHED))
def test_subnormals_are_not_flushed(backend: str, name: str) -> None:
    """Floor(-1e-40) is -1, Ceil(1e-40) 1, Sqrt(-1e-45) NaN, Sqrt(1e-45) 3.7e-23 and
    Sin(1e-40) 1e-40, each zero with its sign. On an H100 and an H200, Triton's floor and
    ceil gave -0 and +0, its sqrt -0 and 0 and its sin 0 (libdevice, sqrt.approx and
    sin.approx flush a subnormal to zero first; log(relu(sin(1e-40))) was -inf)."""
    build, ref = FLUSHED[name]
    (got,) = run(backend, kg.fuse(build(kg.tensor("x", SUBNORMAL.shape))), SUBNORMAL)
    with np.errstate(invalid="ignore"):
        want = ref(SUBNORMAL)
    exact = (np.abs(SUBNORMAL) < 1.2e-38) | np.isnan(SUBNORMAL) | (name not in ("sin", "tan"))
    _same(got[exact], want[exact])
    numbers = ~np.isnan(want)  # a NaN's sign bit is not a value (x86 sets it, a GPU not)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))
    np.testing.assert_allclose(got[~exact], want[~exact], rtol=1e-6)


def test_pow_of_subnormals(backend: str) -> None:
    """A negative base to a subnormal, non-integral power is NaN (the fuzzer's finding on an
    H100: Triton's floor flushed the exponent to 0, which made it an integer), and a subnormal
    base's logarithm is finite (-133 for 1e-40; a GPU's log2 flushes the base to 0: -inf)."""
    base = np.array([-3e-42, 3e-42, 1e-45, 1e-40, -1e-40, 1e-40, 2.0, 1e-45], np.float32)
    expo = np.array([-3e-42, 0.5, -0.5, -0.25, 2.0, 0.5, 1e-45, 1e-45], np.float32)
    a, b = kg.tensor("a", base.shape), kg.tensor("b", expo.shape)
    (got,) = run(backend, kg.fuse(kg.pow(a, b)), base, expo)
    with np.errstate(invalid="ignore", under="ignore"):
        want = np.power(base.astype(np.float64), expo.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["max", "min"])
def test_binary_max_min_propagate_nan(backend: str, kind: str, shape: tuple[int, ...]) -> None:
    a, b = _special(shape, 1), _special(shape, 2)
    b.flat[-1] = np.nan  # NaN in the second operand only
    a.flat[-1] = 5.0
    op = getattr(kg, kind)(kg.tensor("a", shape), kg.tensor("b", shape))
    (got,) = run(backend, kg.fuse(op), a, b)
    _same(got, getattr(np, f"{kind}imum")(a, b))


def _rows() -> np.ndarray:
    """(4, 13) rows: NaN among numbers (in the vector part, in the tail), ±inf without NaN,
    all -inf, all NaN."""
    rows = np.tile(np.arange(13, dtype=np.float32) - 6, (4, 1))
    rows[0, 2] = np.nan
    rows[1, 12] = np.nan
    rows[2, 3], rows[2, 9] = np.inf, -np.inf
    rows[3] = np.nan
    return np.concatenate([rows, np.full((1, 13), -np.inf, np.float32),
                           np.full((1, 13), -0.0, np.float32)])


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_reductions_propagate_nan(backend: str, kind: str, axis: int) -> None:
    x = _rows() if axis == 1 else np.ascontiguousarray(_rows().T)
    op = getattr(kg, f"reduce_{kind}")(kg.tensor("x", x.shape), axes=[axis])
    (got,) = run(backend, kg.fuse(op), x)
    _same(got, getattr(np, kind)(x, axis=axis, keepdims=True))
    _same(got, np.asarray(reference(op, x)))


@pytest.mark.parametrize("shape", [(1,), (7,)], ids=str)
def test_reduce_max_of_one_axis(backend: str, shape: tuple[int, ...]) -> None:
    x = _special(shape)
    (got,) = run(backend, kg.fuse(kg.reduce_max(kg.tensor("x", shape), axes=[0])), x)
    _same(got, np.max(x, keepdims=True))


def _pool_reference(x: np.ndarray, k: int, pad: int) -> np.ndarray:
    """Max over each k x k window (stride 1) of x padded with -inf: NaN when the window holds
    one (NumPy's max)."""
    p = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    h, w = p.shape[2] - k + 1, p.shape[3] - k + 1
    out = np.empty(x.shape[:2] + (h, w), x.dtype)
    for i in range(h):
        for j in range(w):
            out[:, :, i, j] = p[:, :, i:i + k, j:j + k].max(axis=(2, 3))
    return out


@pytest.mark.parametrize("k,pad", [(2, 0), (3, 1)])
def test_max_pool_propagates_nan(backend: str, k: int, pad: int) -> None:
    x = np.arange(2 * 7 * 7, dtype=np.float32).reshape(1, 2, 7, 7) - 40
    x[0, 0, 1, 1] = x[0, 0, 6, 6] = x[0, 1, 3, 5] = np.nan  # a corner: partial windows
    x[0, 1, 0, 0], x[0, 1, 4, 2], x[0, 0, 3, 3] = np.inf, -np.inf, -0.0
    op = kg.max_pool(kg.tensor("x", x.shape), kernel_shape=[k, k], pads=[pad] * 4)
    (got,) = run(backend, kg.fuse(op), x)
    _same(got, _pool_reference(x, k, pad))


def test_max_pool_2x2_of_one_window(backend: str) -> None:
    """The probe's case: [1, NaN, 3, 4] gives NaN wherever the NaN is (onnxruntime gives 4,
    4 and NaN for the three positions tried, ONNX's reference 4: neither is a definition)."""
    for pos in range(4):
        x = np.array([1, 2, 3, 4], np.float32).reshape(1, 1, 2, 2)
        x.flat[pos] = np.nan
        op = kg.max_pool(kg.tensor("x", (1, 1, 2, 2)), kernel_shape=[2, 2])
        (got,) = run(backend, kg.fuse(op), x)
        assert np.isnan(got).all(), (pos, got)


def _softmax_rows(n: int = 37) -> np.ndarray:
    """Rows of ``n``: normal numbers with a padding mask of -1e4; a row whose max is 0 and whose
    other entries' exps lie in the subnormals (-90, -103.5), round to 0 (-104.5, -150: below
    exp's zero, -200: below its clamp at -176) or are 0 (-inf); then +inf among numbers, NaN,
    all -inf (NaN rows)."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((6, n)).astype(np.float32)
    rows[0, -7:] = -1e4
    rows[1] = -30.0  # a sum of 1 (to float32's precision): exps below the normals stay there
    rows[1, [0, 1, 5, 17, 29, 33, 36]] = [0, -90, -103.5, -104.5, -150, -200, -np.inf]
    rows[2, 11] = np.inf
    rows[3, 20] = np.nan
    rows[4] = -np.inf
    return rows


def test_softmax_masks_underflow_and_specials(backend: str) -> None:
    """A softmax multiplies its exps by the sum's reciprocal, and exp clamps x at -176 where both
    its 2^k factors are +0: masked and underflowing entries are exactly +0, subnormal ones
    within two of their ulps, and rows with +inf, NaN or nothing but -inf are NaN, as in NumPy
    (float64, rounded)."""
    x = _softmax_rows()
    (got,) = run(backend, kg.fuse(kg.softmax(kg.tensor("x", x.shape), 1)), x)
    with np.errstate(invalid="ignore"):
        z = x.astype(np.float64) - x.max(1, keepdims=True)
        e = np.exp(z)
        want = (e / e.sum(1, keepdims=True)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    np.testing.assert_array_equal(got[want == 0], 0.0)
    assert not np.signbit(got[want == 0]).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=3e-45)
    assert (got[1, [1, 5]] > 0).all()  # subnormal, not flushed


# --- Gather indices ----------------------------------------------------------------------

N = 5


def _gather(axis: int = 0, dtype: str = "int64") -> tuple[kg.FusedOp, np.ndarray]:
    data = np.arange(N * 4, dtype=np.float32).reshape((N, 4) if axis == 0 else (4, N))
    op = kg.gather(kg.tensor("d", data.shape), kg.tensor("i", (3,), dtype), axis=axis)
    return kg.fuse(op), data


def _call(backend: str, fused: kg.FusedOp, *arrays: np.ndarray) -> np.ndarray:
    if backend == "interp":
        return kg.interpret(fused.lower(), *arrays)[0]
    return fused.emit(backend)(*arrays)


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_indices_in_range(backend: str, axis: int) -> None:
    fused, data = _gather(axis)
    for v in (N - 1, -N, 0, -1):
        idx = np.array([0, v, 2])
        _same(_call(backend, fused, data, idx), np.take(data, idx, axis=axis))


@pytest.mark.parametrize("v", [N, -N - 1, 10**8, -10**8])
def test_gather_index_out_of_range_raises(backend: str, v: int) -> None:
    fused, data = _gather()
    idx = np.array([0, v, 2])
    with pytest.raises(kg.ArgumentError) as err:
        _call(backend, fused, data, idx)
    message = str(err.value)
    assert "fused_gather" in message and "'i'" in message and str(v) in message
    assert f"[{-N}, {N - 1}]" in message


def test_int32_indices_checked_through_the_widening_cast(backend: str) -> None:
    fused, data = _gather(dtype="int32")
    idx = np.array([1, -N, N - 1], np.int32)
    _same(_call(backend, fused, data, idx), np.take(data, idx, axis=0))
    with pytest.raises(kg.ArgumentError, match="holds -6"):
        _call(backend, fused, data, np.array([0, -N - 1, 1], np.int32))


def test_check_indices_directly() -> None:
    fused, data = _gather()
    loop = fused.lower()
    plan = bounds.index_checks(loop)
    assert [(c.name, c.extent, c.positions) for c in plan.direct] == [("i", N, None)]
    assert not plan.computed
    bounds.check_indices("k", loop, [data, np.array([N - 1, -N, 0])])
    for v in (N, -N - 1, 10**8):
        with pytest.raises(kg.ArgumentError, match=rf"kernel 'k': index input 'i' holds {v}, "
                                                    rf"outside \[-5, 4\]"):
            bounds.check_indices("k", loop, [data, np.array([0, 1, v])], plan)
    x = kg.tensor("x", (3,))
    assert not bounds.index_checks(kg.fuse(kg.relu(x)).lower())


def test_check_indices_only_where_the_kernel_reads(backend: str) -> None:
    """Indices sliced inside the block: only the elements read must be in range."""
    idx_t = kg.tensor("i", (5,), "int64")
    part = kg.slice(idx_t, [1], [4])
    gather = kg.gather(kg.tensor("d", (N, 4)), part)
    fused = kg.fuse(part, gather)
    data = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    loop = fused.lower()
    plan = bounds.index_checks(loop)
    assert [list(c.positions) for c in plan.direct] == [[1, 2, 3]]
    feeds = {"d": data}
    idx = np.array([99, 1, -N, 4, -99])  # out of range only where the slice skips
    feeds["i"] = idx
    arrays = [feeds[v.name] for v in fused.inputs]
    _same(_call(backend, fused, *arrays), np.take(data, idx[1:4], axis=0))
    feeds["i"] = np.array([0, 1, 7, 4, 0])
    with pytest.raises(kg.ArgumentError, match="holds 7"):
        _call(backend, fused, *[feeds[v.name] for v in fused.inputs])


def test_computed_indices_are_evaluated_on_the_host(backend: str) -> None:
    """An index computed inside the block from two inputs (i + j) is checked by evaluating it,
    not by its inputs' values."""
    i, j = kg.tensor("i", (3,), "int64"), kg.tensor("j", (3,), "int64")
    total = kg.add(i, j)
    gather = kg.gather(kg.tensor("d", (N, 4)), total)
    fused = kg.fuse(total, gather)
    assert bounds.index_checks(fused.lower()).computed
    data = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    feeds = {"d": data, "i": np.array([-7, 2, -20]), "j": np.array([2, 0, 19])}  # in range
    got = _call(backend, fused, *[feeds[v.name] for v in fused.inputs])
    _same(got, np.take(data, feeds["i"] + feeds["j"], axis=0))
    feeds["i"] = np.array([0, 3, 1])  # 3 + 2 = 5: out of range
    feeds["j"] = np.array([0, 2, 1])
    with pytest.raises(kg.ArgumentError, match=r"holds 5, outside \[-5, 4\]"):
        _call(backend, fused, *[feeds[v.name] for v in fused.inputs])


@pytest.mark.parametrize("backend_name", EMITTED)
def test_launch_with_bad_indices_reads_clamped(backend_name: str) -> None:
    """``launch`` skips the host check: far indices must not crash, and read inside ``d``."""
    require(backend_name)
    fused, data = _gather()
    kernel = fused.emit(backend_name)
    runtime = kernel.runtime
    idx = np.array([10**8, -10**8, N, -N - 1, 2, -1])
    for start in (0, 3):
        part = idx[start:start + 3]
        out = runtime.device_empty(kernel.loop.outputs[0])
        kernel.launch(runtime.device_array(data), runtime.device_array(part), out)
        got = np.empty((3, 4), np.float32)
        runtime.to_host(out, got)
        wrapped = np.where(part < 0, part + N, part)
        _same(got, data[np.clip(wrapped, 0, N - 1)])


def test_nan_semantics_on_aarch64(tmp_path: Path) -> None:
    """Real AArch64 instructions (qemu): vmaxq/vmaxvq propagate NaN as SIMDe's stand-ins do."""
    require("aarch64")
    from kernelgen.backends.neon import aarch64

    rows = _rows()
    x = rows.reshape(-1)[:64].reshape(1, 1, 8, 8)
    special = _special((3, 13))
    cases = [
        (kg.relu(kg.tensor("x", (3, 13))), special, np.maximum(special, np.float32(0))),
        (kg.clip(kg.tensor("x", (3, 13)), -1.0, 1.0), special, np.clip(special, -1, 1)),
        (kg.reduce_max(kg.tensor("x", rows.shape), axes=[1]), rows, rows.max(1, keepdims=True)),
        (kg.reduce_min(kg.tensor("x", rows.shape), axes=[1]), rows, rows.min(1, keepdims=True)),
        (kg.max_pool(kg.tensor("x", x.shape), kernel_shape=[3, 3], pads=[1] * 4), x,
         _pool_reference(x, 3, 1)),
    ]
    kernels = [kg.fuse(op).emit("neon") for op, _, _ in cases]
    exe = aarch64.build_harness(kernels, tmp_path)
    results = aarch64.run(exe, kernels, [[a] for _, a, _ in cases], tmp_path, cpu="cortex-a53")
    for (op, _, want), (got,) in zip(cases, results):
        try:
            _same(got, want.astype(np.float32))
        except AssertionError as exc:
            raise AssertionError(f"{op.name} on AArch64:\n{exc}") from None
