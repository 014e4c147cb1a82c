"""The largest error, in float32 ulps, of exp, expm1, log, log1p, tanh and erf on each backend
over every float32 bit pattern (2^32 inputs, in chunks), against float64 references (NumPy;
``math.erf`` where erf needs it), and the inputs whose result is a special value (±0, ±Inf,
NaN) that differs from the float64 result rounded to float32 (-0 for +0 counts).

    python bench/math_accuracy.py [--backends opencl,neon] [--functions exp,erf]
                                  [--stride 1] [--min-x X]
                                  [--json bench/results/math_accuracy.json]

An ulp is the float32 spacing at the float64 result (2^-149 for subnormal and zero results).
OpenCL and NEON run kernelgen's own math library (``kernelgen/lower/fastmath.py``); 'interp'
interprets its expansion in NumPy float32 (no fused multiply-adds) and is slow (about an hour
for all six); Triton prints the same expansion (on a GPU too), which 'interp' measures. Every
pattern, six functions, OpenCL and NEON: about 40 minutes on this 2-core
machine; ``--stride 64`` (every 64th pattern) takes under a minute.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl.runtime import device
from kernelgen.ir.expr import call
from kernelgen.lower import fastmath
from kernelgen.ops.common import broadcast_read, make_op

F32 = np.float32
CHUNK = 1 << 24
ALL = 1 << 32
LABELS = {"opencl": "OpenCL (PoCL, CPU)", "neon": "NEON C via SIMDe on x86 (not ARM)",
          "interp": "the expansion interpreted (NumPy float32)"}


def erf64(x: np.ndarray) -> np.ndarray:
    """erf in float64: the series where |x| < 2^-12 (exact to double there), ±1 from 6 (erf is
    1 in double), ``math.erf`` in between."""
    out = np.full(x.shape, np.nan)
    a = np.abs(x)
    small, big = a < 2.0**-12, a >= 6
    t = x[small]
    out[small] = 2 / math.sqrt(math.pi) * t * (1 - t * t / 3 + t**4 / 10)
    out[big] = np.sign(x[big])
    middle = ~small & ~big & ~np.isnan(x)
    out[middle] = np.frompyfunc(math.erf, 1, 1)(x[middle]).astype(np.float64)
    return out


def _erfc64(x: np.ndarray) -> np.ndarray:
    """erfc in float64 without 1 - erf's cancellation (GELU's exact value for x < 0)."""
    out = np.full(x.shape, np.nan)
    ok = ~np.isnan(x)
    out[ok] = np.frompyfunc(math.erfc, 1, 1)(x[ok]).astype(np.float64)
    return out


def _softplus64(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


REFERENCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
    "erf": erf64}
# operators built on the library against their exact values in float64 (GELU's ONNX formula,
# 1 + erf(x / sqrt2), cancels in float32 for negative x: its error in ulps there is the formula's)
def _silu(v: kg.Value) -> list[kg.Op]:
    s = kg.sigmoid(v)
    return [s, kg.mul(v, s)]


COMPOSITES: dict[str, tuple[Callable[[kg.Value], list[kg.Op]],
                            Callable[[np.ndarray], np.ndarray]]] = {
    "sigmoid": (lambda v: [kg.sigmoid(v)], lambda x: 1 / (1 + np.exp(-x))),
    "softplus": (lambda v: [kg.softplus(v)], _softplus64),
    "silu": (_silu, lambda x: x / (1 + np.exp(-x))),
    "mish": (lambda v: [kg.mish(v)], lambda x: x * np.tanh(_softplus64(x))),
    "gelu": (lambda v: [kg.gelu(v)], lambda x: 0.5 * x * _erfc64(-x / math.sqrt(2))),
    # 0.5 (1 + tanh(u)) as 1 / (1 + exp(-2u)): 1 + tanh(u) cancels even in float64
    "gelu_tanh": (lambda v: [kg.gelu(v, approximate="tanh")], lambda x: x / (1 + np.exp(
        -2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
}


def kernel(fn: str, backend: str, n: int) -> Callable[[np.ndarray], np.ndarray]:
    """``fn`` over n float32 values on ``backend``."""
    x = kg.tensor("x", (n,))
    if fn in COMPOSITES:
        fused = kg.fuse(*COMPOSITES[fn][0](x))
    else:
        fused = kg.fuse(make_op(fn, [x], (n,), x.dtype, call(fn, broadcast_read(0, x, (n,)))))
    if backend == "interp":
        loop = fastmath.expand(fused.lower(), fastmath.FUNCTIONS)
        return lambda values: kg.interpret(loop, values)[0]
    compiled = fused.emit(backend, tuning="none")
    out = np.empty(n, F32)
    return lambda values: np.asarray(compiled(values, out=out))


class Tally:
    """The largest error seen so far, where, and the special-value mismatches."""

    def __init__(self) -> None:
        self.max_ulp, self.at, self.got, self.want = 0.0, 0, 0.0, 0.0
        self.max_ulp_normal, self.max_abs = 0.0, 0.0  # where the result is normal; absolute
        self.special_mismatches, self.examples = 0, []

    def add(self, bits: np.ndarray, got: np.ndarray, want: np.ndarray) -> None:
        got64 = got.astype(np.float64)
        with np.errstate(over="ignore"):
            rounded = want.astype(F32).astype(np.float64)
        special = ~np.isfinite(rounded) | ~np.isfinite(got64) | (want == 0)
        same = (got64 == rounded) | (np.isnan(got64) & np.isnan(rounded))
        same &= (want != 0) | (np.signbit(got64) == np.signbit(want))
        wrong = special & ~same
        self.special_mismatches += int(wrong.sum())
        self.examples += [f"{b:#010x}" for b in bits[wrong][:4 - len(self.examples)]]
        finite = ~special
        _, e = np.frexp(np.abs(want[finite]))
        err = np.abs(got64[finite] - want[finite]) / np.maximum(np.ldexp(1.0, e - 24), 2.0**-149)
        normal = np.abs(want[finite]) >= 2.0**-126  # results that are normal floats
        if err[normal].size:
            self.max_ulp_normal = max(self.max_ulp_normal, float(err[normal].max()))
        if err.size:
            self.max_abs = max(self.max_abs, float(np.abs(got64[finite] - want[finite]).max()))
        if err.size and err.max() > self.max_ulp:
            k = int(err.argmax())
            self.max_ulp = float(err[k])
            self.at = int(bits[finite][k])
            self.got, self.want = float(got64[finite][k]), float(want[finite][k])

    def as_dict(self) -> dict:
        return {"max_ulp": round(self.max_ulp, 3),
                "max_ulp_normal_results": round(self.max_ulp_normal, 3),
                "max_abs_error": self.max_abs, "at_bits": f"{self.at:#010x}",
                "at": float(np.uint32(self.at).view(F32)), "got": self.got, "want": self.want,
                "special_mismatches": self.special_mismatches, "examples": self.examples}


def measure(fn: str, backends: list[str], stride: int, min_x: float | None = None
            ) -> dict[str, Tally]:
    """Every ``stride``-th float32 bit pattern (from ``min_x`` up, NaN kept, if given)."""
    n = min(CHUNK, -(-ALL // stride))
    runs = {b: kernel(fn, b, n) for b in backends}
    tallies = {b: Tally() for b in backends}
    for start in range(0, ALL, n * stride):
        bits = np.arange(start, min(start + n * stride, ALL), stride, dtype=np.uint64)
        bits = bits.astype(np.uint32)
        if bits.size < n:  # the last chunk of a stride that does not divide 2^32: pad it
            bits = np.resize(bits, n)
        x = bits.view(F32)
        with np.errstate(all="ignore"):
            want = (COMPOSITES[fn][1] if fn in COMPOSITES else REFERENCE[fn])(
                x.astype(np.float64))
        keep = slice(None) if min_x is None else ~(x < min_x)
        for b in backends:
            tallies[b].add(bits[keep], runs[b](x)[keep], want[keep])
    return tallies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="opencl,neon")
    parser.add_argument("--functions", default=",".join(REFERENCE),
                        help=f"any of {', '.join([*REFERENCE, *COMPOSITES])}")
    parser.add_argument("--stride", type=int, default=1,
                        help="measure every stride-th bit pattern (1: all 2^32)")
    parser.add_argument("--min-x", type=float, default=None,
                        help="only inputs from this value up (the rest are not counted)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    backends = args.backends.split(",")
    results: dict[str, dict] = {}
    started = time.time()
    for fn in args.functions.split(","):
        t0 = time.time()
        tallies = measure(fn, backends, args.stride, args.min_x)
        results[fn] = {b: t.as_dict() for b, t in tallies.items()}
        cells = "  ".join(f"{b} {t.max_ulp:5.2f} ulp ({t.max_ulp_normal:.2f} on normal results, "
                          f"{t.special_mismatches} special wrong)" for b, t in tallies.items())
        print(f"{fn:<6} {cells}   [{time.time() - t0:.0f} s]", flush=True)
    patterns = -(-ALL // args.stride)
    print(f"{patterns} inputs per function; {time.time() - started:.0f} s in all")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "patterns": patterns, "stride": args.stride, "min_x": args.min_x,
            "seconds": round(time.time() - started),
            "opencl_device": device().name if "opencl" in backends else None,
            "host": platform.machine(), "loadavg": os.getloadavg()[0],
            "labels": {b: LABELS[b] for b in backends}, "functions": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
