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
from kernelgen.backends.opencl.runtime import device  # noqa: E402
from kernelgen.compile import copy_kernel, unfused  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402


def numpy_time(arrays: dict[str, np.ndarray], repeat: int) -> float:
    out = np.empty_like(arrays["x"])
    numpy_chain(arrays["x"], arrays["scale"], arrays["shift"], out)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        numpy_chain(arrays["x"], arrays["scale"], arrays["shift"], out)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


BACKEND_LABELS = {"opencl": "OpenCL (PoCL, CPU)", "neon": "NEON C via SIMDe on x86 (not ARM)",
                  "triton": "Triton (CUDA GPU)"}


def timeable_backends() -> list[str]:
    """Backends whose timings mean something here: Triton only with a GPU (its interpreter
    costs milliseconds per program)."""
    names = ["opencl", "neon"]
    try:
        import torch
        if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            names.append("triton")
    except ImportError:
        pass
    return names


def run_backend(backend: str, ops: list, arrays: dict[str, np.ndarray], want: np.ndarray,
                repeat: int, rounds: int) -> dict:
    fused_kernel = kg.fuse(*ops).emit(backend)
    got = fused_kernel(*(arrays[b.name] for b in fused_kernel.loop.inputs))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # correctness before speed
    separate = unfused(ops, backend)
    variants = {
        "copy": (copy_kernel(arrays["x"].shape, backend=backend), [arrays["x"]]),
        "fused": (fused_kernel, [arrays[b.name] for b in fused_kernel.loop.inputs]),
        "unfused": (separate, [arrays["x"], arrays["scale"], arrays["shift"]]),
    }
    per_round = [bench_interleaved(variants, repeat=repeat) for _ in range(rounds)]
    ratios = [m["fused"].gbps / m["copy"].gbps for m in per_round]
    speedups = [m["unfused"].median_ms / m["fused"].median_ms for m in per_round]
    mid = sorted(range(rounds), key=lambda k: ratios[k])[rounds // 2]  # the median round
    copy, fused, sep = (per_round[mid][v] for v in ("copy", "fused", "unfused"))
    return {"backend": backend, "label": BACKEND_LABELS[backend],
            "copy_ms": copy.median_ms, "copy_gbps": copy.gbps,
            "fused_ms": fused.median_ms, "fused_gbps": fused.gbps,
            "unfused_ms": sep.median_ms, "unfused_gbps": sep.gbps, "kernels": len(separate),
            "fused_vs_copy": ratios[mid], "fused_vs_copy_rounds": ratios,
            "fused_speedup_vs_unfused": speedups[mid], "speedup_rounds": speedups,
            "loadavg": fused.loadavg}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per round")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds; the round with the median ratio is shown")
    parser.add_argument("--backends", default=",".join(timeable_backends()))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    values, ops = elementwise_chain()
    arrays = inputs(values)
    want = np.empty_like(arrays["x"])
    numpy_chain(arrays["x"], arrays["scale"], arrays["shift"], want)
    np_ms = numpy_time(arrays, max(5, args.repeat // 3))
    useful = sum(a.nbytes for a in arrays.values()) + want.nbytes
    rows = [run_backend(b, ops, arrays, want, args.repeat, args.rounds)
            for b in args.backends.split(",")]
    print(f"OpenCL device: {device().name}; load average {os.getloadavg()[0]:.2f}; "
          f"{args.rounds} rounds of {args.repeat} interleaved runs (copy, fused, unfused), the "
          f"round with the median fused/copy ratio shown; device-resident buffers, 16M float32")
    print(f"{'backend':<36} {'copy GB/s':>9} {'fused ms':>9} {'GB/s':>6} {'vs copy':>8} "
          f"{'unfused ms':>10} {'speed-up':>8}")
    for r in rows:
        print(f"{r['label']:<36} {r['copy_gbps']:>9.1f} {r['fused_ms']:>9.3f} "
              f"{r['fused_gbps']:>6.1f} {r['fused_vs_copy']:>8.2f} {r['unfused_ms']:>10.3f} "
              f"{r['fused_speedup_vs_unfused']:>7.2f}x")
    for r in rows:
        lo, hi = min(r["fused_vs_copy_rounds"]), max(r["fused_vs_copy_rounds"])
        s_lo, s_hi = min(r["speedup_rounds"]), max(r["speedup_rounds"])
        print(f"  {r['backend']}: fused/copy over rounds {lo:.2f}-{hi:.2f}, "
              f"speed-up over unfused {s_lo:.2f}-{s_hi:.2f}x")
    print(f"NumPy, 5 passes with out=: {np_ms:.3f} ms, {useful / np_ms / 1e6:.1f} GB/s effective")
    if "triton" not in args.backends:
        print("Triton: not timed (no CUDA GPU here; its interpreter says nothing about speed)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "opencl_device": device().name, "host": platform.machine(),
            "loadavg": os.getloadavg()[0], "repeat": args.repeat, "rounds": args.rounds,
            "backends": rows,
            "numpy_ms": np_ms}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
