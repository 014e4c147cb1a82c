"""GEMM fp32 with the register-tiled contraction templates, tiles tuned at each size (checked
against NumPy's product, stored in the Fast-Run database, then read back by a plain ``emit``):
OpenCL/PoCL against NumPy/OpenBLAS with the same thread count, and NEON C (through SIMDe on
x86: 128-bit lanes, nothing to do with ARM speed) against the peak of an FMA microkernel built by
the same toolchain, all measured in one run.

    OPENBLAS_NUM_THREADS=2 python bench/gemm.py [--sizes 1024,2048] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.exec import Program
from kernelgen.measure import bench
from kernelgen.tune import tune


def neon_peak_gflops() -> float:
    """GFLOP/s of bench/peak_fma_neon.c (12 independent FMA chains per thread)."""
    import ctypes

    from kernelgen.backends.neon import runtime as neon

    code = (Path(__file__).parent / "peak_fma_neon.c").read_text()
    key = neon.library_key(code)
    neon.build([(key, code)], code)
    fn = ctypes.CDLL(str(neon.cache_dir() / f"{key}.so")).kg_peak_fma
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_float
    iterations = 20_000_000
    fn(1000)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(iterations)
        best = min(best, time.perf_counter() - t0)
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    return 2 * 4 * 12 * iterations * threads / best / 1e9


def tuned_kernel(n: int, backend: str, a: np.ndarray, b: np.ndarray, want: np.ndarray,
                 budget_s: float = 240.0) -> tuple[kg.Kernel | Program, str]:
    """Tune the n^3 GEMM's tiles on ``backend`` at its own size, with NumPy's product as the
    reference (the interpreter would need n^3 memory), then emit it the default way: the
    template reads the stored tiles from the Fast-Run database."""
    fused = kg.fuse(kg.matmul(kg.tensor("a", (n, n)), kg.tensor("b", (n, n))))
    # tune the contraction the default emit runs: on OpenCL at these sizes one kernel that
    # packs b in panels; a Program would read padded copies of a and b
    # (kernelgen/compile/padding.py) made by its first stages
    first = fused.emit(backend, tuning="none")
    stages = first.kernels if isinstance(first, Program) else [first]
    env = first.bind(a, b) if isinstance(first, Program) else {"a": a, "b": b}
    for stage in stages[:-1]:
        env[stage.loop.outputs[0].name] = stage(*(env[x.name] for x in stage.loop.inputs))
    gemm = stages[-1]
    result = tune(gemm.loop, backend, [env[x.name] for x in gemm.loop.inputs],
                  reference=[want], repeat=3, budget_s=budget_s)
    kernel = fused.emit(backend)
    np.testing.assert_allclose(kernel(a, b), want, rtol=1e-3, atol=1e-3 * np.sqrt(n))
    return kernel, str(result.best)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tune-s", type=float, default=240.0,
                        help="tuning budget per size in seconds")
    parser.add_argument("--opencl-only", action="store_true",
                        help="skip NEON (bench/implementations.py: NEON is the same on each)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    rows = []
    for n in map(int, args.sizes.split(",")):
        rng = np.random.default_rng(n)
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        kernel, tiles = tuned_kernel(n, "opencl", a, b, a @ b, args.tune_s)
        ms = bench(kernel, a, b, repeat=args.repeat, warmup=1).median_ms
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            a @ b
            times.append((time.perf_counter() - t0) * 1e3)
        blas_ms = float(np.median(times))
        flop = 2 * n ** 3
        rows.append({"n": n, "tiles": tiles, "kernelgen_ms": ms,
                     "kernelgen_gflops": flop / ms / 1e6, "openblas_ms": blas_ms,
                     "openblas_gflops": flop / blas_ms / 1e6, "ratio": blas_ms / ms})
        r = rows[-1]
        print(f"{n}^3: kernelgen {r['kernelgen_gflops']:.1f} GFLOP/s (tiles {r['tiles']}), "
              f"OpenBLAS {r['openblas_gflops']:.1f} GFLOP/s (OPENBLAS_NUM_THREADS={threads}), "
              f"ratio {r['ratio']:.3f}")
    peak = neon_peak_gflops()
    neon_rows = []
    for n in [] if args.opencl_only else map(int, args.sizes.split(",")):
        rng = np.random.default_rng(n)
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        kernel, tiles = tuned_kernel(n, "neon", a, b, a @ b)
        ms = bench(kernel, a, b, repeat=args.repeat, warmup=1).median_ms
        gflops = 2 * n ** 3 / ms / 1e6
        neon_rows.append({"n": n, "tiles": tiles, "gflops": gflops,
                          "peak_gflops": peak, "ratio": gflops / peak})
        print(f"{n}^3 NEON via SIMDe: {gflops:.1f} GFLOP/s (tiles {tiles}); FMA microkernel "
              f"peak {peak:.1f} GFLOP/s; ratio {gflops / peak:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"threads": threads, "rows": rows, "neon": neon_rows,
                                         "loadavg": os.getloadavg()[0]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
