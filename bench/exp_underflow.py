"""exp clamped below at -176, where both its 2^k factors are +0 (``lower/fastmath.py: exp``),
against the expansion before, which clamped x at -104 and computed a product rounding to 0
from below the normals (a microcode assist a vector on Intel's CPUs): softmax rows with a
padding mask of -1e4 (the pattern suite's), the same rows unmasked and at -90 (results in the
subnormals, which both expansions compute), fused attention and SiLU (no lane underflows),
both built in one process, checked against NumPy, and their kernels' device times (OpenCL
events) taken round-robin; medians in ms.

    python bench/exp_underflow.py [--rounds 60] [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.ir.expr import Expr, call
from kernelgen.lower import fastmath
from kernelgen.measure import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import patterns  # noqa: E402
from pooling import compared_row, write_rows  # noqa: E402
from wide_tiles import DeviceTimes  # noqa: E402

LABELS = ("now", "before")


def _clamped_exp(x: Expr) -> Expr:
    """exp as it was: x clamped to [-104, 88.8]."""
    k_ = fastmath._k
    xc = fastmath._clamp_below(fastmath._clamp_above(x, fastmath.EXP_OVERFLOW),
                               fastmath.EXP_UNDERFLOW)
    k, r = fastmath._reduce_ln2(xc)
    y = fastmath._add(k_(1.0, x), fastmath._expm1_poly(r))
    k1 = fastmath._round_product(k, 0.5)
    return fastmath._mul(fastmath._mul(y, call("exp2i", k1)),
                         call("exp2i", fastmath._sub(k, k1)))


@contextlib.contextmanager
def before() -> Iterator[None]:
    with mock.patch.dict(fastmath.EXPANSIONS, {"exp": _clamped_exp}):
        yield


Built = tuple[list[kg.Op], dict[str, np.ndarray]]  # the block's operators and its inputs
Case = tuple[str, Callable[[], Built], Callable[..., np.ndarray]]


def _softmax_case(rows: int, cols: int, masked: float | None) -> Case:
    def build() -> Built:
        p = patterns.masked_softmax(rows, cols)
        if masked is not None:
            p.arrays["mask"] = np.where(np.arange(cols) < cols - 7, 0.0, masked).astype(np.float32)
        return p.ops, p.arrays

    def want(x: np.ndarray, s: np.ndarray, mask: np.ndarray) -> np.ndarray:
        z = x * s + mask
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    label = "" if masked is None else f", mask {masked:g}"
    return (f"softmax(x * s + mask), {rows}x{cols}" + (label or ", mask -1e4"), build, want)


def _attention_case() -> Case:
    def build() -> Built:
        p = patterns.attention(12, 128, 64)
        return p.ops, p.arrays

    def want(q: np.ndarray, k: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
        sc = np.einsum("hid,hjd->hij", q, k) * s
        e = np.exp(sc - sc.max(-1, keepdims=True))
        return np.einsum("hij,hjd->hid", e / e.sum(-1, keepdims=True), v)
    return ("attention, 12 heads x 128 x 64", build, want)


def _silu_case() -> Case:
    shape = (1, 256, 56, 56)

    def build() -> Built:
        x = kg.tensor("x", shape)
        sig = kg.ops.unary("Sigmoid", x)
        rng = np.random.default_rng(7)
        return [sig, kg.mul(x, sig)], {"x": 3 * rng.standard_normal(shape).astype(np.float32)}

    def want(x: np.ndarray) -> np.ndarray:
        return x / (1 + np.exp(-x))
    return ("x * sigmoid(x), 1x256x56x56", build, want)


CASES: list[Case] = [_softmax_case(1536, 128, None), _softmax_case(1536, 128, 0.0),
                     _softmax_case(1536, 128, -90.0), _softmax_case(4096, 1024, None),
                     _attention_case(), _silu_case()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    device = DeviceTimes()
    rows: list[dict[str, object]] = []
    for name, build, want_of in CASES:
        ops, arrays = build()
        now = kg.fuse(*ops, force=True).emit("opencl")
        with before():
            old = kg.fuse(*build()[0], force=True).emit("opencl")
        assert old.source != now.source, name
        runs = {}
        for label, k in {"now": now, "before": old}.items():
            inputs = [arrays[a["name"]] for a in k.metadata["args"] if a["role"] == "input"]
            np.testing.assert_allclose(k(*inputs), want_of(*inputs), rtol=2e-4, atol=1e-6)
            runs[label] = runner(k, *inputs)
        rows.append(compared_row(name, runs, LABELS, args.rounds, device))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
