"""What a call from NumPy costs beside the kernel: ``kernel(x)`` (host arrays in, a new host
array out), ``kernel(x, out=y)`` and the device-resident launch (``kg.bench``'s way), timed
round-robin in one process, as medians and as ratios to the launch.

    python bench/call_overhead.py [--repeat 20] [--json bench/results/call_overhead.json]

``kernel(aligned x)`` passes inputs allocated by ``kernelgen.hostmem`` (page-aligned).
Kernels: ``abs`` over 16M float32 (64 MiB in, 64 MiB out), a 5-op chain with two broadcast
vectors, and a MatMul with constant weights (``kg.constant``: a call passes only x) and a
bias-ReLU epilogue. Run it on each OpenCL implementation with ``KERNELGEN_OPENCL_DEVICE``
('pocl 3.1', 'intel', ...); ``--backend neon`` times NEON C (via SIMDe on x86).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from chains import elementwise_chain  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen import hostmem  # noqa: E402
from kernelgen.measure import runner  # noqa: E402

N = 4096


def cases(rng: np.random.Generator) -> dict[str, tuple[kg.FusedOp, list[np.ndarray]]]:
    x = kg.tensor("x", (N, N))
    out: dict[str, tuple[kg.FusedOp, list[np.ndarray]]] = {}
    xa = rng.standard_normal((N, N)).astype(np.float32)
    out["abs 16M"] = (kg.fuse(kg.abs(x)), [xa])
    values, ops = elementwise_chain(N)
    arrays = [rng.standard_normal(v.shape).astype(np.float32) for v in values]
    out["5-op chain 16M"] = (kg.fuse(*ops), arrays)
    a = kg.tensor("a", (512, 1024))
    w = kg.constant("w", rng.standard_normal((1024, 1024)).astype(np.float32) / 32)
    b = kg.constant("b", rng.standard_normal(1024).astype(np.float32))
    mm = kg.matmul(a, w)
    bias = kg.add(mm, b)
    out["matmul 512x1024x1024, constant weights"] = (
        kg.fuse(mm, bias, kg.relu(bias)), [rng.standard_normal((512, 1024)).astype(np.float32)])
    return out


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def measure(kernel: Any, arrays: list[np.ndarray], repeat: int) -> dict[str, float]:
    launch = runner(kernel, *arrays)
    out = kernel(*arrays)  # builds it; the pool then holds a block of the output's size
    aligned = [hostmem.copy(a) for a in arrays]
    variants: dict[str, Callable[[], Any]] = {
        "launch (device-resident)": launch,
        "kernel(x)": lambda: kernel(*arrays),
        "kernel(x, out=y)": lambda: kernel(*arrays, out=out),
        # inputs from kernelgen.hostmem (page-aligned): what a device that copies host memory
        # missing its base alignment (Intel's CPU runtime) needs to use them in place
        "kernel(aligned x)": lambda: kernel(*aligned),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):
        for fn in variants.values():
            fn()
    for _ in range(repeat):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--backend", default="opencl", choices=["opencl", "neon"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    results = []
    for name, (fused, arrays) in cases(rng).items():
        kernel = fused.emit(args.backend)
        got = kernel(*arrays)
        given = iter(arrays)
        full = [kernel.constants[b.name] if b.name in kernel.constants else next(given)
                for b in kernel.loop.inputs]
        want = kg.interpret(kernel.loop, *full)[0]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)  # right before fast
        ms = measure(kernel, arrays, args.repeat)
        base = ms["launch (device-resident)"]
        row = {"case": name, **{k: round(v, 3) for k, v in ms.items()},
               **{f"{k} / launch": round(v / base, 2) for k, v in ms.items() if k[0] == "k"}}
        results.append(row)
        print(f"{name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items()) +
              f"; kernel(x) {ms['kernel(x)'] / base:.2f}x the launch, out= "
              f"{ms['kernel(x, out=y)'] / base:.2f}x")
    info: dict[str, Any] = {"backend": args.backend, "host": platform.machine(),
                            "loadavg": os.getloadavg()[0], "repeat": args.repeat,
                            "device": "NEON C via SIMDe on x86 (not ARM)", "results": results}
    if args.backend == "opencl":
        from kernelgen.backends.opencl.runtime import device as opencl_device
        info["device"] = opencl_device().info.describe()
    print(f"device: {info['device']}, load average {info['loadavg']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
