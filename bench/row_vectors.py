"""Vectors of a staged row a step (``row_vectors``, ``lower/unroll.py: ROW_VECTORS``): the
'row' schedule of a staged kernel computing 1, 2 or 3 vectors of its row per step, on the
staged rows that sum products of their own: a projection under its LayerNorm,
LayerNorm(x W + b + r) (the DNNFusion planner's intensive pair in a transformer layer), and
softmax(Q K) with the keys read along the row. Each variant's output is checked against NumPy
first; then all are timed round-robin in one process, medians in ms: OpenCL by the kernels'
device time (their events' counters), NEON C by wall time (one call each, SIMDe on x86).

    python bench/row_vectors.py [--backends opencl,neon] [--rounds 40] \\
        [--json bench/results/row-vectors.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import kernelgen as kg
from kernelgen.measure import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import write_rows  # noqa: E402

VECTORS = (1, 2, 3)
PROJECTIONS = ((128, 256, 256, "BERT layer (hidden 256), output projection"),
               (128, 1024, 256, "BERT layer (hidden 256), FFN down"),
               (128, 768, 768, "BERT-base, output projection"),
               (37, 64, 48, "awkward"))
SCORES = ((4, 128, 64, 128), (1, 128, 64, 128), (1, 256, 32, 512))


def projection(m: int, k: int, n: int, rng: np.random.Generator
               ) -> tuple[kg.FusedOp, list[np.ndarray], np.ndarray]:
    """LayerNorm(x W + b + r) over rows of ``n``, its inputs and NumPy's output."""
    x, r = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (m, n)))
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b, g, beta = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
    biased = kg.add(mm, kg.constant("b", b))
    residual = kg.add(biased, kg.tensor("r", (m, n)))
    y = kg.layer_normalization(residual, kg.constant("g", g), kg.constant("beta", beta))
    h = x.astype(np.float64) @ w + b + r
    centred = h - h.mean(axis=1, keepdims=True)
    want = centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + 1e-5) * g + beta
    return kg.fuse(mm, biased, residual, y, force=True), [x, r], want


def scores(batch: int, m: int, d: int, n: int, rng: np.random.Generator
           ) -> tuple[kg.FusedOp, list[np.ndarray], np.ndarray]:
    """softmax(Q K) with K as (depth, keys): the score row read along the keys."""
    q = rng.standard_normal((batch, m, d)).astype(np.float32)
    k = (rng.standard_normal((batch, d, n)) / np.sqrt(d)).astype(np.float32)
    s = kg.matmul(kg.tensor("q", q.shape), kg.tensor("k", k.shape))
    p = kg.softmax(s, 2)
    ref = q.astype(np.float64) @ k
    e = np.exp(ref - ref.max(axis=2, keepdims=True))
    return kg.fuse(s, p, force=True), [q, k], e / e.sum(axis=2, keepdims=True)


def timed(backend: str, fused: kg.FusedOp, arrays: list[np.ndarray], want: np.ndarray,
          rounds: int) -> dict[int, float]:
    """Each ``row_vectors`` variant's median over ``rounds`` round-robin rounds (ms)."""
    calls: dict[int, Any] = {}
    for v in VECTORS:
        kernel = fused.emit(backend, tuning="none", row_vectors=v)
        assert kernel.metadata["schedule"] == "row" and kernel.metadata["staged_rows"]
        np.testing.assert_allclose(kernel(*arrays), want, rtol=1e-3, atol=1e-4)
        calls[v] = (kernel, runner(kernel, *arrays))
    times: dict[int, list[float]] = {v: [] for v in VECTORS}
    for k in range(rounds + 3):
        for v, (kernel, run) in calls.items():
            if backend == "opencl":
                ms = kernel.runtime.device_ms(run)
            else:
                start = time.perf_counter()
                run()
                ms = (time.perf_counter() - start) * 1e3
            if k >= 3 and ms is not None:
                times[v].append(ms)
    return {v: statistics.median(t) for v, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="opencl,neon")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = [(f"LayerNorm(x W + b + r) {m}x{k}x{n} ({what})", projection(m, k, n, rng))
             for m, k, n, what in PROJECTIONS]
    cases += [(f"softmax(Q K) {'x'.join(map(str, s))}", scores(*s, rng)) for s in SCORES]
    rows = []
    for backend in args.backends.split(","):
        for name, (fused, arrays, want) in cases:
            ms = timed(backend, fused, arrays, want, args.rounds)
            row = {"block": name, "backend": backend,
                   **{f"row_vectors_{v}_ms": t for v, t in ms.items()},
                   "two_over_one": ms[1] / ms[2]}
            rows.append(row)
            print(f"{backend:6s} {name:64s} " +
                  "  ".join(f"{v}: {t:.4f}" for v, t in ms.items()) +
                  f"  one / two {ms[1] / ms[2]:.2f}", flush=True)
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
