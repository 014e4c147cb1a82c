"""Fit the polynomial coefficients of kernelgen's float32 math library (``kernelgen/lower/
fastmath.py``) and print them as the Python block that module holds.

    python tools/fastmath_fit.py            # the constants, then each piece's float32 error

Each polynomial is a weighted minimax fit in float64 (Lawson's iteratively reweighted least
squares on Chebyshev nodes, which converges to the equioscillating minimax solution), its
coefficients then rounded to float32 one at a time from the lowest degree, the others refitted
after each rounding so that they absorb its error. The weights make the error that is minimised
the relative error of the function the piece computes:

- ``EXPM1_Q``: expm1(r) = r + r^2 q(r) on |r| <= ln2/2 (exp and expm1 after Cody-Waite
  reduction; exp(r) = 1 + expm1(r));
- ``LOG_P``: log1p(f) = 2s + s R(s^2), s = f / (2 + f), R(z) = z P(z), on |s| <= (sqrt2 - 1) /
  (sqrt2 + 1) (the significand reduced into [sqrt(1/2), sqrt2), as in fdlibm's logf);
- ``ERF_P``: erf(x) = x + x P(x^2) on |x| <= ``ERF_SMALL`` (x P(x^2) is at most 0.13 x, so
  its rounding errors shrink by as much);
- ``ERF_Q``: erf(x) = 1 - exp(Q(x)) on ``ERF_SMALL`` <= x <= ``ERF_ONE``, Q(x) = h(x - c) - x^2
  with h a fit of log(erfc(x)) + x^2 (a mild function, -0.8 to -2.9 here, where log(erfc)
  itself runs to -18: its terms would cancel), weighted by erfc(x) / erf(x) (an error of Q is
  a relative error of erfc).

Afterwards each piece is evaluated in float32 NumPy in the order the IR expansion computes it
and its largest error in float32 ulps printed (the whole functions' errors, over every float32
input, are ``bench/math_accuracy.py``'s).
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Callable

import numpy as np

F32 = np.float32
Array = np.ndarray

# erf(x) rounds to 1 in float32 once erfc(x) < 2^-25; 3.92 is past that (erfc(3.92) = 1.1e-8)
ERF_SMALL = 0.875
ERF_ONE = 3.92
ERF_CENTRE = 2.375  # Q is evaluated in x - ERF_CENTRE: smaller terms, less cancellation
EXP_R = math.log(2) / 2 * 1.002  # |r| after the reduction, with room for k's rounding
LOG_S = (math.sqrt(2) - 1) / (math.sqrt(2) + 1) * 1.002


def chebyshev_nodes(lo: float, hi: float, n: int = 4000) -> Array:
    k = np.arange(n)
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)


def minimax(basis: Array, target: Array, weight: Array, fixed: dict[int, float],
            iterations: int = 300) -> Array:
    """Coefficients c minimising max |weight * (basis @ c - target)|, those in ``fixed`` held
    at their values (Lawson's algorithm: least squares reweighted by the error)."""
    free = [j for j in range(basis.shape[1]) if j not in fixed]
    rest = target - sum(basis[:, j] * v for j, v in fixed.items())
    a, b = basis[:, free] * weight[:, None], rest * weight
    lawson = np.full(len(b), 1.0 / len(b))
    coeffs = np.zeros(len(free))
    for _ in range(iterations):
        sw = np.sqrt(lawson)
        coeffs = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)[0]
        err = np.abs(a @ coeffs - b)
        lawson = lawson * err
        lawson /= lawson.sum()
    out = np.zeros(basis.shape[1])
    out[free] = coeffs
    for j, v in fixed.items():
        out[j] = v
    return out


def fit_f32(basis: Array, target: Array, weight: Array, keep: dict[int, float] | None = None
            ) -> Array:
    """A minimax fit with float32 coefficients, rounded from the lowest degree up."""
    fixed = dict(keep or {})
    for j in range(basis.shape[1]):
        if j in fixed:
            continue
        coeffs = minimax(basis, target, weight, fixed)
        fixed[j] = float(F32(coeffs[j]))
    return np.array([fixed[j] for j in range(basis.shape[1])])


def powers(x: Array, degree: int) -> Array:
    return np.stack([x**j for j in range(degree + 1)], axis=1)


def fit_expm1() -> Array:
    r = chebyshev_nodes(-EXP_R, EXP_R)
    q = (np.expm1(r) - r) / (r * r)
    return fit_f32(powers(r, 4), q, r * r / np.abs(np.expm1(r)))


def fit_log() -> Array:
    z = chebyshev_nodes(0, LOG_S**2)
    series = sum(z**(n - 1) / (2 * n + 1) for n in range(1, 40))  # R(z)/z = 2 sum z^(n-1)/(2n+1)
    # R's error s * z * dP against log1p(f) ~ 2s: relative error z/2 per unit of P's error
    return fit_f32(powers(z, 3), 2 * series, z / 2)


def _erf(x: Array) -> Array:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _erfc(x: Array) -> Array:
    return np.vectorize(math.erfc, otypes=[np.float64])(x)


def fit_erf_small() -> Array:
    x = chebyshev_nodes(1e-4, ERF_SMALL)
    p = _erf(x) / x
    return fit_f32(powers(x * x, 5), p - 1, 1 / p)


def fit_erf_middle(degree: int = 6) -> Array:
    x = chebyshev_nodes(ERF_SMALL, ERF_ONE)
    return fit_f32(powers(x - ERF_CENTRE, degree), np.log(_erfc(x)) + x * x,
                   _erfc(x) / _erf(x))


# --- float32 checks: each piece evaluated as the expansion evaluates it ------------------------

def horner(coeffs: Array, x: Array) -> Array:
    acc = np.full_like(x, F32(coeffs[-1]))
    for c in coeffs[-2::-1]:
        acc = acc * x + F32(c)
    return acc


def ulps(got: Array, want: Array) -> float:
    """The largest |got - want| in units of the float32 spacing at ``want``."""
    want = np.asarray(want, np.float64)
    spacing = np.spacing(np.abs(want).astype(F32)).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - want) / spacing))


def _grid(lo: float, hi: float, n: int = 1 << 20) -> Array:
    return np.linspace(lo, hi, n).astype(F32)


def check_expm1(q: Array) -> float:
    r = _grid(-EXP_R, EXP_R)
    r = r[r != 0]
    return ulps(r + r * r * horner(q, r), np.expm1(r.astype(np.float64)))


def check_log(p: Array) -> float:
    f = _grid(math.sqrt(0.5) - 1, math.sqrt(2) - 1)
    f = f[f != 0]
    s = f / (F32(2) + f)
    z = s * s
    hfsq = F32(0.5) * f * f
    got = f - (hfsq - s * (hfsq + z * horner(p, z)))
    return ulps(got, np.log1p(f.astype(np.float64)))


def check_erf_small(p: Array) -> float:
    x = _grid(0, ERF_SMALL)
    x = x[x != 0]
    return ulps(x + x * horner(p, x * x), _erf(x.astype(np.float64)))


def check_erf_middle(q: Array) -> float:
    """With exp computed exactly (float64) and rounded: the fit's share of the error."""
    x = _grid(ERF_SMALL, ERF_ONE, 1 << 18)
    e = np.exp((horner(q, x - F32(ERF_CENTRE)) - x * x).astype(np.float64)).astype(F32)
    return ulps(F32(1) - e, _erf(x.astype(np.float64)))


def constants() -> dict[str, float]:
    """The reduction constants: ln2 split so that k * LN2_HI is exact for |k| < 2^9."""
    ln2_hi = float(np.frombuffer(np.array([math.log(2)], F32).tobytes(), np.uint32)[0]
                   & np.uint32(0xFFFFF000))
    ln2_hi = float(np.frombuffer(np.uint32(int(ln2_hi)).tobytes(), F32)[0])
    return {"LOG2E": float(F32(1 / math.log(2))), "LN2_HI": ln2_hi,
            "LN2_LO": float(F32(math.log(2) - ln2_hi)), "SQRT2": float(F32(math.sqrt(2)))}


def _block(name: str, coeffs: Array) -> str:
    """A tuple of coefficients as fastmath.py holds it (lines of at most 94 characters)."""
    body = textwrap.wrap(", ".join(repr(float(c)) for c in coeffs), width=90)
    return "\n".join([f"{name} = (  # lowest degree first", *("    " + b for b in body), ")"])


def main() -> None:
    fits: dict[str, tuple[Callable[[], Array], Callable[[Array], float]]] = {
        "EXPM1_Q": (fit_expm1, check_expm1), "LOG_P": (fit_log, check_log),
        "ERF_P": (fit_erf_small, check_erf_small), "ERF_Q": (fit_erf_middle, check_erf_middle)}
    results = {name: fit() for name, (fit, _) in fits.items()}
    print("# --- produced by tools/fastmath_fit.py ---")
    for name, value in constants().items():
        print(f"{name} = {value!r}")
    print(f"ERF_SMALL, ERF_ONE, ERF_CENTRE = {ERF_SMALL}, {ERF_ONE}, {ERF_CENTRE}")
    for name, coeffs in results.items():
        print(_block(name, coeffs))
    print("# --- end ---\n")
    for name, (_, check) in fits.items():
        print(f"{name}: largest error of its piece in float32: {check(results[name]):.2f} ulp")


if __name__ == "__main__":
    main()
