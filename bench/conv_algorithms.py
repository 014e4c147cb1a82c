"""Which convolution algorithm, shape by shape: every algorithm but ``direct`` (a sliding window
per output element, 29-90x slower than the best on four of these shapes) timed round-robin on
the convolutions of ResNet-50, Inception v1 and SqueezeNet (Conv + ReLU, the pattern they fuse
to), with onnxruntime (2 threads) timed right before and after, and the pick of
``conv_algorithms.heuristic`` -- what a model compiled without tuning runs -- beside the
fastest. Each output is checked against onnxruntime's first. Default tiles (no tuning), as a
model compile uses them.

    python bench/conv_algorithms.py [--backends opencl,neon] [--repeat 10] \\
        [--shapes "48,192,3,13,1;16,64,3,55,1"] [--json bench/results/conv_algorithms.json]

``--shapes``: only these (input channels, output channels, kernel side, map side, stride).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen import backends as kg_backends
from kernelgen.compile.conv_algorithms import applicable, heuristic
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv import ort_session, time_ort  # noqa: E402

# (input channels, output channels, kernel side, map side, stride): padding keeps the map
SHAPES = (
    (64, 64, 3, 56, 1), (128, 128, 3, 28, 1), (256, 256, 3, 14, 1), (512, 512, 3, 7, 1),
    (128, 128, 3, 56, 2), (256, 256, 3, 28, 2), (512, 512, 3, 14, 2),
    (64, 64, 1, 56, 1), (1024, 256, 1, 14, 1), (2048, 512, 1, 7, 1),
    (64, 192, 3, 55, 1), (96, 128, 3, 13, 1), (144, 288, 3, 13, 1), (160, 320, 3, 6, 1),
    (16, 48, 5, 13, 1), (32, 128, 5, 13, 1), (32, 128, 5, 6, 1), (480, 192, 1, 13, 1),
    (3, 64, 3, 224, 2), (16, 64, 3, 55, 1), (32, 128, 3, 27, 1), (48, 192, 3, 13, 1),
    (16, 16, 3, 5, 1), (3, 4, 3, 7, 1),
)


def row(backend: str, c: int, m: int, k: int, side: int, stride: int, repeat: int,
        rng: np.random.Generator) -> dict[str, object]:
    xs, ws = (1, c, side, side), (m, c, k, k)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.05).astype(np.float32)
    conv = kg.conv(kg.tensor("x", xs), kg.constant("w", w), pads=[k // 2] * 4,
                   strides=[stride, stride])
    fused = kg.fuse(conv, kg.relu(conv))
    sess = ort_session(xs, w, k // 2, 1, strides=stride)

    def ort_run() -> list[np.ndarray]:
        return sess.run(None, {"x": x})
    ref = np.maximum(ort_run()[0], 0)
    variants = {}
    for algorithm, why in applicable(fused).items():
        if why is None and algorithm != "direct":
            program = fused.emit(backend, algorithm=algorithm)
            np.testing.assert_allclose(program(x), ref, rtol=1e-3, atol=1e-3)
            variants[algorithm] = (program, [x])
    before = time_ort(ort_run, repeat)
    times = {a: t.median_ms for a, t in bench_interleaved(variants, 1, repeat).items()}
    ort_ms = float(np.median(before + time_ort(ort_run, repeat)))
    pick = heuristic(fused, kg_backends.get(backend).caps)
    best = min(times, key=times.__getitem__)
    return {"backend": backend, "conv": f"{k}x{k} {c}->{m} @{side}" + (
        f" stride {stride}" if stride > 1 else ""), "onnxruntime_ms": ort_ms, "ms": times,
        "heuristic": pick, "heuristic_ms": times.get(pick), "best": best,
        "best_ms": times[best]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backends", default="opencl,neon")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--shapes", default="", help="semicolon-separated c,m,k,side,stride "
                    "(default: every shape of SHAPES)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";") if s] or \
        list(SHAPES)
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'backend':7s} {'conv':24s} {'ORT':>7s} {'heuristic':>24s} {'fastest':>24s}")
    for backend in args.backends.split(","):
        for shape in shapes:
            r = row(backend, *shape, args.repeat, rng)
            rows.append(r)
            print(f"{backend:7s} {r['conv']:24s} {r['onnxruntime_ms']:7.3f} "
                  f"{r['heuristic']:>14s} {r['heuristic_ms']:9.3f} "
                  f"{r['best']:>14s} {r['best_ms']:9.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python bench/conv_algorithms.py " + " ".join(sys.argv[1:]),
            "rows": rows, "loadavg": os.getloadavg()[0]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
