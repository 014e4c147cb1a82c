"""Fused 5-op elementwise chain over 16M float32 vs the same ops as separate kernels vs NumPy,
as effective GB/s (inputs read once + output written once) and as a ratio to a plain copy kernel
of the same backend measured in the same run.

    python bench/elementwise_chain.py [--repeat 30] [--json bench/results/elementwise_chain.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from chains import elementwise_chain, inputs, numpy_chain  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.measure import bench, copy_kernel, unfused  # noqa: E402
from kernelgen.runtime.opencl import device  # noqa: E402


def numpy_time(arrays: dict[str, np.ndarray], repeat: int) -> float:
    out = np.empty_like(arrays["x"])
    numpy_chain(arrays["x"], arrays["scale"], arrays["shift"], out)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        numpy_chain(arrays["x"], arrays["scale"], arrays["shift"], out)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    values, ops = elementwise_chain()
    arrays = inputs(values)
    fused_kernel = kg.fuse(*ops).emit("opencl")
    # correctness first: the fused kernel against NumPy
    want = np.empty_like(arrays["x"])
    numpy_chain(arrays["x"], arrays["scale"], arrays["shift"], want)
    got = fused_kernel(*(arrays[b.name] for b in fused_kernel.loop.inputs))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    copy = bench(copy_kernel(arrays["x"].shape), arrays["x"], repeat=args.repeat)
    fused = bench(fused_kernel, *(arrays[b.name] for b in fused_kernel.loop.inputs),
                  repeat=args.repeat)
    separate = unfused(ops)
    sep = bench(separate, arrays["x"], arrays["scale"], arrays["shift"], repeat=args.repeat)
    np_ms = numpy_time(arrays, max(5, args.repeat // 3))
    useful = fused.bytes_moved
    rows = [("copy kernel (roofline)", copy.median_ms, copy.bytes_moved / copy.median_ms / 1e6),
            ("kernelgen fused (1 kernel)", fused.median_ms, fused.gbps),
            (f"kernelgen unfused ({len(separate)} kernels)", sep.median_ms, sep.gbps),
            ("NumPy (5 passes, out=)", np_ms, useful / np_ms / 1e6)]
    copy_gbps = rows[0][2]
    print(f"device: {device().name}; load average {os.getloadavg()[0]:.2f}; "
          f"medians of {args.repeat} runs, device-resident buffers")
    print(f"{'variant':<32} {'median ms':>10} {'GB/s':>8} {'vs copy':>8}")
    for name, ms, gbps in rows:
        print(f"{name:<32} {ms:>10.3f} {gbps:>8.1f} {gbps / copy_gbps:>8.2f}")
    print(f"fused / copy bandwidth: {fused.gbps / copy_gbps:.2f} (target >= 0.85); "
          f"fused speed-up over unfused: {sep.median_ms / fused.median_ms:.2f}x (target >= 3); "
          f"over NumPy: {np_ms / fused.median_ms:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "device": device().name, "host": platform.processor() or platform.machine(),
            "loadavg": os.getloadavg()[0], "repeat": args.repeat,
            "rows": [{"variant": n, "median_ms": m, "gbps": g, "vs_copy": g / copy_gbps}
                     for n, m, g in rows],
            "fused_vs_copy": fused.gbps / copy_gbps,
            "fused_speedup_vs_unfused": sep.median_ms / fused.median_ms,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
