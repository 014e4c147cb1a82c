"""The attention pattern softmax(Q K * scale) V fused into one kernel (AGO's intensive fusion
with the score row staged once per query, ``kernelgen/lower/staging.py``) against the same block
inlined (every reduction recomputes the scores it reads), the three kernels run separately
(MatMul, scale + Softmax, MatMul) and NumPy, timed round-robin in one run.

    python bench/attention.py [--repeat 10] [--backends opencl,neon] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.lower.staging import unstage
from kernelgen.measure import bench_interleaved

SHAPES = {"256 queries x 256 keys, d 64": (256, 64, 256, 64),
          "64 queries x 1024 keys, d 64": (64, 64, 1024, 64)}


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: np.ndarray
                    ) -> np.ndarray:
    s = q @ k * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def row(name: str, m: int, d: int, n: int, dv: int, backends: list[str], repeat: int
        ) -> dict[str, object]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((m, d), (d, n), (n, dv)))
    scale = np.array([d ** -0.5], np.float32)
    s = kg.matmul(kg.tensor("q", q.shape), kg.tensor("k", k.shape))
    scaled = kg.mul(s, kg.tensor("scale", (1,)))
    p = kg.softmax(scaled, 1)
    o = kg.matmul(p, kg.tensor("v", v.shape))
    fused = kg.fuse(s, scaled, p, o, force=True)
    want = numpy_attention(q, k, v, scale)
    arrays = [{"q": q, "k": k, "v": v, "scale": scale}[b.name] for b in fused.inputs]
    out: dict[str, object] = {"block": name}
    # arithmetic counted on the IR: the staged kernel (every backend, Triton included) against
    # the inlined form, which recomputes the score row in every reduction that reads it
    out["flops_staged"] = fused.lower().flops()
    out["flops_inlined"] = unstage(fused.lower()).flops()
    t0 = time.perf_counter()
    for _ in range(repeat):
        numpy_attention(q, k, v, scale)
    out["numpy_ms"] = (time.perf_counter() - t0) / repeat * 1e3
    for backend in backends:
        staged = fused.emit(backend, tuning="none")
        inlined = kg.compile_loop(unstage(fused.lower()), backend)
        separate = [kg.fuse(s).emit(backend, tuning="none"),
                    kg.fuse(scaled, p).emit(backend, tuning="none"),
                    kg.fuse(o).emit(backend, tuning="none")]
        for kernel in (staged, inlined):
            np.testing.assert_allclose(kernel(*arrays), want, rtol=1e-3, atol=1e-4)
        times = bench_interleaved({"staged": (staged, arrays), "inlined": (inlined, arrays),
                                   "separate": (separate, [q, k, scale, v])},
                                  warmup=1, repeat=repeat)
        for variant, m_ in times.items():
            out[f"{backend}_{variant}_ms"] = round(m_.median_ms, 3)
        out[f"{backend}_schedule"] = staged.metadata["schedule"]
        print(f"{name} {backend}: " + ", ".join(
            f"{v_} {m_.median_ms:.3f} ms" for v_, m_ in times.items()), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--backends", default="opencl,neon")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = [row(name, *shape, args.backends.split(","), args.repeat)
            for name, shape in SHAPES.items()]
    print(json.dumps(rows, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
