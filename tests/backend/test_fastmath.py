"""The float32 math library (``kernelgen/lower/fastmath.py``) on every backend, against float64
references (NumPy, ``math.erf``): within ``MAX_ULP`` float32 ulps over a stratified sample of
the whole float range (every exponent, subnormals, both signs, the thresholds and the
polynomials' breakpoints with their neighbours), and exact on ±0, ±Inf and NaN; in elementwise
kernels (vector loops), short ones (NEON's scalar tails), float16 blocks, 'row' kernels with
explicit vectors (softmax, log-softmax, LayerNorm with GELU), with float64 keeping the library's
functions; the three bit-level primitives exactly; and pow's constant exponents reduced with
pow's special values.

On 'interp' the expanded loop itself is interpreted (NumPy float32 arithmetic): the library
as written, without the backends' fused multiply-adds. Triton prints the same expansion (its
built-ins on a GPU were up to 63 ulps off and flushed subnormals: docs/fastmath.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from conftest import opencl_caps, prebuild, require

import kernelgen as kg
from kernelgen.ir.expr import Call, call, const, walk
from kernelgen.lower import fastmath
from kernelgen.ops.common import broadcast_read, make_op
from kernelgen.ops.reduce import reduce_op
from kernelgen.ops.shape import pad

MAX_ULP = 4.0
F32 = np.float32
_erf64 = np.vectorize(math.erf, otypes=[np.float64])
REFERENCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
    "erf": _erf64}
FUNCTIONS = tuple(REFERENCE)
TAILS = (1, 3, 7, 17, 1031)  # NEON: scalar only, tails of 3 and 1, one vector and more
EDGES: dict[str, list[float]] = {
    # overflow / FLT_MIN / underflow thresholds, the clamps, rint's k boundaries near 0 and at
    # the ends, where the result enters the subnormals and the smallest subnormal
    "exp": [88.72283935546875, 88.7228390520683, -87.33654475, -103.97208, -103.2789,
            fastmath.EXP_OVERFLOW, fastmath.EXP_UNDERFLOW, fastmath.EXP_ZERO,
            *(math.log(2) * (j + 0.5) for j in (-254, -253, -150, -127, -2, -1, 0, 1, 126))],
    "expm1": [88.72283935546875, -17.328679, fastmath.EXPM1_MINUS_ONE, 2.0**-25, 2.0**-12,
              *(math.log(2) * (j + 0.5) for j in (-2, -1, 0, 1, 127))],
    "log": [1.0, fastmath.SQRT2, math.sqrt(0.5), 2.0**-126, 2.0**-149, 2.0**-127, 2.0,
            0.5, math.e, 3.4028234663852886e38],
    "log1p": [-1.0, -0.5, -0.29289, 0.41421, 2.0**-24, 2.0**-12, 1.0, 2.0**24, 2.0**-149,
              3.4028234663852886e38],
    "tanh": [fastmath.TANH_ONE, 9.01, 2.0**-13, 0.55, math.log(2) / 4, math.log(2) * 0.75],
    "erf": [fastmath.ERF_SMALL, fastmath.ERF_ONE, 3.85, 2.0**-13, 1e-40, 6.0],
}


# --- samples and the error measure -----------------------------------------------------------

def _around(values: list[float], n: int = 3) -> np.ndarray:
    """Each value, as float32, with ``n`` float32 neighbours on each side, in both signs."""
    out = []
    for v in np.array(values, F32):
        up, down = v, v
        out.append(v)
        for _ in range(n):
            with np.errstate(over="ignore"):  # past the largest float: Inf
                up, down = np.nextafter(up, F32(np.inf)), np.nextafter(down, F32(-np.inf))
            out += [up, down]
    got = np.array(out, F32)
    return np.concatenate([got, -got])


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45,
                    -1e-45, 1.1754944e-38, -1.1754944e-38, 1.0, -1.0, 0.5, -2.0], F32)


def stratified(fn: str, per_binade: int = 40, seed: int = 0) -> np.ndarray:
    """Random significands in every exponent (the subnormals' too), both signs, the special
    values and ``fn``'s edges with their neighbours."""
    rng = np.random.default_rng(seed)
    exponents = np.repeat(np.arange(255, dtype=np.uint32), per_binade)
    bits = (exponents << 23) | rng.integers(0, 1 << 23, exponents.size, dtype=np.uint32)
    positive = bits.view(F32)
    return np.concatenate([SPECIAL, _around(EDGES[fn]), positive, -positive])


def ulp_of(want: np.ndarray) -> np.ndarray:
    """The float32 spacing at each float64 value: 2^(floor(log2|w|) - 23), 2^-149 in the
    subnormal range (also for results that round to 0)."""
    _, e = np.frexp(np.abs(want))
    return np.maximum(np.ldexp(1.0, e - 24), 2.0**-149)


def check_ulps(x: np.ndarray, got: np.ndarray, want: np.ndarray, max_ulp: float,
               what: str) -> float:
    """``got`` (float32) against the float64 ``want``: Inf, NaN and signed zeros exactly (as
    ``want`` rounds to float32), every other value within ``max_ulp``; returns the largest
    error in ulps."""
    got = np.asarray(got).astype(np.float64)
    with np.errstate(over="ignore"):
        rounded = want.astype(F32).astype(np.float64)
    special = ~np.isfinite(rounded) | ~np.isfinite(got)
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    wrong = special & ~same
    assert not wrong.any(), (f"{what}: special values differ at x = {x[wrong][:6]}: got "
                             f"{got[wrong][:6]}, want {rounded[wrong][:6]}")
    zero = want == 0
    sign = zero & (np.signbit(got) != np.signbit(want))
    assert not sign.any(), f"{what}: zero of the wrong sign at x = {x[sign][:6]}"
    finite = ~special
    err = np.abs(got[finite] - want[finite]) / ulp_of(want[finite])
    worst = int(np.argmax(err)) if err.size else 0
    assert not err.size or err[worst] <= max_ulp, (
        f"{what}: {err[worst]:.2f} ulp at x = {x[finite][worst]!r} (got {got[finite][worst]!r}, "
        f"want {want[finite][worst]!r})")
    return float(err.max()) if err.size else 0.0


def reference(fn: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REFERENCE[fn](x.astype(np.float64))


# --- kernels -----------------------------------------------------------------------------------

def unary(fn: str, shape: tuple[int, ...], dtype: str = "float32",
          exponent: float | None = None) -> kg.FusedOp:
    """One primitive call over a tensor (expm1, log1p and the bit-level primitives have no ONNX
    operator); with ``exponent``, pow(x, exponent) with the exponent a constant."""
    x = kg.tensor("x", shape, dtype)
    read = broadcast_read(0, x, shape)
    body = call(fn, read) if exponent is None else call(fn, read, const(exponent, read.dtype))
    return kg.fuse(make_op(fn, [x], shape, x.dtype, body))


def run_on(backend: str, fused: kg.FusedOp, *arrays: np.ndarray) -> np.ndarray:
    """The kernel's output; on 'interp' the expanded loop, interpreted."""
    if backend == "interp":
        loop = fastmath.expand(fused.lower(), fastmath.EXPANDABLE)
        return kg.interpret(loop, *arrays)[0]
    return np.asarray(fused.emit(backend, tuning="none")(*arrays))


def _blocks() -> list[kg.FusedOp]:
    out = [unary(fn, (stratified(fn).size,)) for fn in FUNCTIONS]
    out += [unary(fn, (n,)) for fn in FUNCTIONS for n in TAILS]
    out += [unary(fn, (65536,), "float16") for fn in FUNCTIONS]
    return out + [build() for build in ROWS.values()]


@pytest.fixture(scope="module", autouse=True)
def _neon_batch(request: pytest.FixtureRequest) -> None:
    prebuild(request, _blocks)


# --- each function over the whole range --------------------------------------------------------

@pytest.mark.parametrize("fn", FUNCTIONS)
def test_function_over_the_float_range(backend: str, fn: str) -> None:
    x = stratified(fn)
    got = run_on(backend, unary(fn, x.shape), x)
    check_ulps(x, got, reference(fn, x), MAX_ULP, f"{fn} on {backend}")


@pytest.mark.parametrize("n", TAILS)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_short_kernels_take_the_scalar_path(backend: str, fn: str, n: int) -> None:
    """Lengths below, at and past a vector: NEON's vector loop and its scalar tail."""
    rng = np.random.default_rng(n)
    pool = stratified(fn)
    x = np.concatenate([SPECIAL, rng.permutation(pool)])[:n]
    x = rng.permutation(x)
    got = run_on(backend, unary(fn, (n,)), x)
    check_ulps(x, got, reference(fn, x), MAX_ULP, f"{fn}[{n}] on {backend}")


def _float16_values() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_float16_blocks_compute_in_float32(backend: str, fn: str) -> None:
    """Every float16 value: within one float16 ulp of the float64 result (the float32 result
    rounded again), special values exact."""
    x = _float16_values()
    got = run_on(backend, unary(fn, x.shape, "float16"), x).astype(np.float64)
    want = reference(fn, x)
    with np.errstate(over="ignore"):
        rounded = want.astype(np.float16).astype(np.float64)
    special = ~np.isfinite(rounded) | ~np.isfinite(got)
    assert np.array_equal(got[special], rounded[special], equal_nan=True), fn
    _, e = np.frexp(np.abs(want[~special]))
    spacing = np.maximum(np.ldexp(1.0, e - 11), 2.0**-24)
    err = np.abs(got[~special] - want[~special]) / spacing
    assert err.max() <= 1.0, f"{fn}: {err.max():.2f} float16 ulp at {x[~special][err.argmax()]}"


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_float64_keeps_the_library(backend: str, fn: str) -> None:
    """float64 calls are not expanded: double precision, far beyond a float32 polynomial."""
    x = np.random.default_rng(1).uniform(-0.9, 30.0, 101)
    fused = unary(fn, x.shape, "float64")
    assert fastmath.expand(fused.lower(), fastmath.EXPANDABLE) is fused.lower()
    if backend == "interp":
        got = kg.interpret(fused.lower(), x)[0]
    else:
        got = np.asarray(fused.emit(backend, tuning="none")(x))
    np.testing.assert_allclose(got, reference(fn, x), rtol=1e-13, atol=1e-300)


# --- explicit vector code: 'row' kernels -------------------------------------------------------

ROW_SHAPE = (2, 3, 1031)  # two outer axes: merged into one, each reduction's copies too


def _layer_norm_gelu() -> kg.FusedOp:
    x, s, b = kg.tensor("x", ROW_SHAPE), kg.tensor("s", ROW_SHAPE[-1:]), \
        kg.tensor("b", ROW_SHAPE[-1:])
    n = kg.layer_normalization(x, s, b)
    return kg.fuse(n, kg.gelu(n))


def _softplus_mean() -> kg.FusedOp:
    """A hoisted reduction over an expansion holding NaN constants (log1p's), whose copy in
    the store must still be found as the hoisted value."""
    sp = kg.softplus(kg.tensor("x", ROW_SHAPE))
    return kg.fuse(sp, kg.reduce_mean(sp, [2], 0))


ROWS: dict[str, Callable[[], kg.FusedOp]] = {
    "softmax": lambda: kg.fuse(kg.softmax(kg.tensor("x", ROW_SHAPE), 2)),
    "log_softmax": lambda: kg.fuse(kg.log_softmax(kg.tensor("x", ROW_SHAPE), 2)),
    "layer_norm_gelu": _layer_norm_gelu,
    "softplus_mean": _softplus_mean,
}


def _row_reference(name: str, x: np.ndarray, s: np.ndarray, b: np.ndarray) -> np.ndarray:
    if name in ("softmax", "log_softmax"):
        shifted = x - x.max(axis=-1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        return np.exp(shifted - log_sum) if name == "softmax" else shifted - log_sum
    if name == "softplus_mean":
        return np.logaddexp(0, x).mean(axis=-1)
    n = (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
    n = n * s + b
    return 0.5 * n * (1 + _erf64(n / math.sqrt(2)))


@pytest.mark.parametrize("name", list(ROWS))
def test_row_kernels_with_explicit_vectors(backend: str, name: str) -> None:
    """Wide rows (scores from -300 to 300: exp underflows to subnormals and 0 in places) on
    the 'row' schedule, whose hoisted reductions and stores run as explicit vectors (NEON; an
    OpenCL CPU device: a GPU reduces a row across a work-group instead)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(ROW_SHAPE) * 60).astype(F32)
    s, b = rng.standard_normal(1031).astype(F32), rng.standard_normal(1031).astype(F32)
    fused = ROWS[name]()
    arrays = [x, s, b][:len(fused.inputs)]
    if backend == "interp":
        got = kg.interpret(fastmath.expand(fused.lower(), fastmath.EXPANDABLE), *arrays)[-1]
    else:
        kernel = fused.emit(backend, tuning="none")
        if backend == "neon" or backend == "opencl" and opencl_caps().simd_within_work_item:
            assert kernel.metadata["schedule"] == "row"
        out = kernel(*arrays)
        got = out[-1] if isinstance(out, tuple) else out
    want = _row_reference(name, *(a.astype(np.float64) for a in (x, s, b)))
    # absolute: softmax's subnormal probabilities; log-softmax's shift (x - max) cancels
    atol = 1e-37 if name == "softmax" else 1e-6
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=3e-5, atol=atol)


# --- the pieces ----------------------------------------------------------------------------------

def _normal_floats() -> np.ndarray:
    rng = np.random.default_rng(5)
    exponents = np.repeat(np.arange(1, 255, dtype=np.uint32), 3)
    bits = (exponents << 23) | rng.integers(0, 1 << 23, exponents.size, dtype=np.uint32)
    return np.concatenate([bits.view(F32), -bits.view(F32)])


PRIMITIVES = {
    "exp2i": (lambda: np.arange(-126, 128, dtype=F32),
              lambda k: np.ldexp(np.float64(1), k.astype(np.int64))),
    "logb": (_normal_floats, lambda x: np.frexp(x.astype(np.float64))[1] - 1.0),
    "significand": (_normal_floats, lambda x: np.frexp(x.astype(np.float64))[0] * 2),
}


@pytest.mark.parametrize("fn", list(PRIMITIVES))
def test_bit_level_primitives(backend: str, fn: str) -> None:
    """exp2i, logb and significand exactly, as vectors and in the scalar tail (254 values)."""
    values, want = PRIMITIVES[fn]
    x = values()
    got = run_on(backend, unary(fn, x.shape), x)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want(x))


@pytest.mark.parametrize("n", [1, 37, 4099])
def test_muladd_rounds_once_or_twice(backend: str, n: int) -> None:
    """The polynomial steps' a * b + c: per element either the product rounded and then the
    sum (interp, a device without FMA, NEON's scalar tail) or one rounding of the exact value
    (an FMA), and nothing else; the inputs make the two differ on most elements."""
    rng = np.random.default_rng(n)
    a, b = (rng.uniform(1, 2, n).astype(F32) for _ in "ab")
    c = -(a.astype(np.float64) * b).astype(F32)  # cancels the product to its rounding error
    # and to a sum of 50 bits at most, which float64 holds: ``once`` below is rounded once
    c[1::3] = (rng.choice([-1, 1], c[1::3].size) * rng.uniform(0.5, 4, c[1::3].size)).astype(F32)
    reads = [kg.tensor(name, (n,)) for name in "abc"]
    body = call("muladd", *(broadcast_read(k, t, (n,)) for k, t in enumerate(reads)))
    got = run_on(backend, kg.fuse(make_op("muladd", reads, (n,), reads[0].dtype, body)), a, b, c)
    twice = a * b + c  # float32 NumPy: two roundings
    once = (a.astype(np.float64) * b + c).astype(F32)  # the product is exact in float64
    assert np.all((got == twice) | (got == once)), np.flatnonzero((got != twice) & (got != once))
    assert np.count_nonzero(once != twice) > n // 2


POW_REDUCED = (0.0, 1.0, 2.0, 3.0, -1.0, 0.5, -0.5, 0.25, 0.75, 1.5)


@pytest.mark.parametrize("exponent", POW_REDUCED)
def test_pow_constant_exponents(backend: str, exponent: float) -> None:
    """pow(x, c) reduced to multiplies, a division or square roots: pow's value on ±0, ±Inf,
    NaN and negatives (sqrt(-0) is -0 and sqrt(-Inf) NaN, pow's +0 and +Inf), within 2 ulps
    elsewhere (3 for 0.75: sqrt(x) * sqrt(sqrt(x)) rounds three times; 2.1 measured)."""
    x = np.concatenate([SPECIAL, stratified("exp", per_binade=4)])
    fused = unary("pow", x.shape, exponent=exponent)
    expanded = fastmath.expand(fused.lower(), fastmath.EXPANDABLE)
    assert not any(isinstance(n, Call) and n.fn == "pow" for n in walk(expanded.stores[0].value))
    got = run_on(backend, fused, x)
    with np.errstate(all="ignore"):  # an array exponent: C's pow (a scalar 0.5 is sqrt)
        want = np.power(x.astype(np.float64), np.full(x.shape, exponent))
    check_ulps(x, got, want, 3.0 if exponent == 0.75 else 2.0, f"pow(x, {exponent}) on {backend}")


@pytest.mark.parametrize("exponent", [-2.0, 0.3, 4.0])
def test_pow_other_exponents_stay_calls(exponent: float) -> None:
    fused = unary("pow", (5,), exponent=exponent)
    expanded = fastmath.expand(fused.lower(), fastmath.EXPANDABLE)
    assert any(isinstance(n, Call) and n.fn == "pow" for n in walk(expanded.stores[0].value))


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
def test_the_schedule_holds_the_expanded_loop(backend_name: str) -> None:
    """What a backend decides on and prints is the loop with its ``fast_math`` functions
    expanded: every backend expands all six."""
    require(backend_name)
    backend = kg.backends.get(backend_name)
    loop = kg.fuse(kg.gelu(kg.tensor("x", (7, 33)))).lower()
    printed = {n.fn for n in walk(backend.choose(loop, {}).loop.stores[0].value)
               if isinstance(n, Call)}
    assert fastmath.FUNCTIONS <= backend.caps.fast_math
    assert "erf" not in printed and "exp2i" in printed


def test_interpreter_keeps_the_reference_calls() -> None:
    """The interpreter is the reference: it computes the unexpanded call (double-rounded
    NumPy float32 at worst), and a loop holds its calls until a backend expands them."""
    fused = unary("erf", (3,))
    assert any(isinstance(n, Call) and n.fn == "erf" for n in walk(fused.lower().stores[0].value))
    x = np.array([0.5, -2.0, 3.0], F32)
    np.testing.assert_array_equal(kg.interpret(fused.lower(), x)[0],
                                  _erf64(x.astype(np.float64)).astype(F32))


def test_vector_epilogues_name_their_calls() -> None:
    """A tile's and a window's vector epilogues are printed from trees rewritten for their
    columns (a bias read along them) and rows; each expansion still ends in a comment naming
    the call it computes."""
    caps = opencl_caps()
    rng = np.random.default_rng(3)
    m = kg.matmul(kg.tensor("a", (29, 40)), kg.constant("w", rng.standard_normal((40, 48), F32)))
    biased = kg.add(m, kg.tensor("b", (48,)))
    e = kg.erf(biased)
    kernel = kg.fuse(m, biased, e, kg.mul(e, biased)).emit("opencl")
    tunables = kernel.metadata["tunables"]
    assert kernel.metadata["schedule"] == "tiled"
    if caps.vector_widths:  # one erf a column vector of the tile, on the biased sums
        tile_n, width = tunables["tile"][1], tunables["vector_width"]
        # and one a vector the last tile, shifted back over its neighbour, stores lanes of
        shift = -(-48 // tile_n) * tile_n - 48
        shifted = sum((j + 1) * width > shift for j in range(tile_n // width)) if shift else 0
        assert kernel.source.count("  // erf(v") == tile_n // width + shifted
    conv = kg.conv(kg.tensor("x", (1, 3, 9, 21)), kg.constant("k", np.ones((3, 1, 3, 3), F32)),
                   group=3, pads=[1, 1, 1, 1])
    residual = kg.add(conv, kg.tensor("r", conv.shape))  # read along the rows and columns
    kernel = kg.fuse(conv, residual, kg.tanh(residual)).emit("opencl", tuning="none")
    if caps.simd_within_work_item:  # a window on a CPU: one tanh a vector of a row
        assert kernel.metadata["schedule"] == "window"
        assert kernel.source.count("  // tanh(v") >= 2


def test_window_rows_whose_epilogue_folds_to_a_constant(backend: str) -> None:
    """tanh(pad(sum(pad(x)))): the window's second row is all padding, so its tanh folds to a
    tree over a constant, whose argument the rewrite for the row no longer holds. The comment
    naming the call had made the printer compute that argument there, with index symbols the
    row does not have (a build failure found by the random blocks on pip's PoCL)."""
    x = kg.tensor("x", (1, 2))
    padded = pad(x, [0, 0, 1, 1], constant_value=0.25)
    summed = reduce_op("ReduceSum", padded, [0], keepdims=1)
    outer = pad(summed, [0, 0, 1, 1], constant_value=0.25)
    fused = kg.fuse(padded, summed, outer, kg.tanh(outer))
    xs = np.array([[0.3, -0.7]], F32)
    inner = np.pad(xs, [(0, 1), (0, 1)], constant_values=0.25).sum(0, keepdims=True)
    want = np.tanh(np.pad(inner, [(0, 1), (0, 1)], constant_values=0.25))
    np.testing.assert_allclose(run_on(backend, fused, xs), want, rtol=1e-6)
