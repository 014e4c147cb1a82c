"""How many rows one work-item (OpenCL 'row') or one iteration (NEON C 'row') of a softmax
should own: masked softmaxes, softmax(x * s + mask) over the last axis, at row lengths from
real models, every valid ``group_rows`` emitted and timed round-robin in one process
(``bench_interleaved``, medians in ms), each checked against NumPy. The default
(``lower/unroll.py: default_group_rows``) is marked.

    python bench/short_rows.py [--backends opencl,neon] [--repeat 60] [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import write_rows  # noqa: E402

# (rows, row length, where from): heads x queries, keys
SHAPES = ((12 * 64, 64, "DistilBERT, 64 tokens"), (12 * 128, 128, "BERT-base, 128 tokens"),
          (4 * 128, 128, "the BERT layer of the model tests"),
          (12 * 197, 197, "ViT-B/16, 197 tokens"), (16 * 384, 384, "BERT-large, 384 tokens"),
          (12 * 512, 512, "BERT-base, 512 tokens"), (1024, 1024, "GPT-2, one head of 1024"),
          (1024, 4096, "a 4096-token row"))


def masked_softmax(rows: int, cols: int) -> tuple[kg.FusedOp, list[np.ndarray], np.ndarray]:
    """The block, its inputs and NumPy's answer in float64."""
    rng = np.random.default_rng(rows + cols)
    x, s, mask = kg.tensor("x", (rows, cols)), kg.tensor("s", (1,)), kg.tensor("mask", (cols,))
    m = kg.mul(x, s)
    a = kg.add(m, mask)
    arrays = [rng.standard_normal((rows, cols)).astype(np.float32) * 4,
              np.array([0.125], np.float32),
              np.where(np.arange(cols) < cols - 7, 0.0, -1e4).astype(np.float32)]
    t = arrays[0].astype(np.float64) * arrays[1] + arrays[2]
    e = np.exp(t - t.max(axis=1, keepdims=True))
    return kg.fuse(m, a, kg.softmax(a, 1)), arrays, e / e.sum(axis=1, keepdims=True)


def measure(rows: int, cols: int, backend: str, repeat: int) -> dict[str, object]:
    fused, arrays, want = masked_softmax(rows, cols)
    default = fused.emit(backend, tuning="none")
    kernels = {}
    for r in range(1, 9):
        try:
            kernels[r] = fused.emit(backend, tuning="none", group_rows=r)
        except ValueError:
            continue  # not a divisor of the rows, or over the staging budget
    for k in kernels.values():
        np.testing.assert_allclose(k(*arrays), want, rtol=1e-5, atol=1e-6)
    ms = {r: t.median_ms for r, t in bench_interleaved(
        {r: (k, arrays) for r, k in kernels.items()}, 3, repeat).items()}
    chosen = default.metadata["tunables"]["group_rows"]
    return {"backend": backend, "shape": [rows, cols],
            "ms": {str(r): round(v, 4) for r, v in ms.items()}, "default": chosen,
            "one_row_over_default": round(ms[1] / ms[chosen], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="opencl,neon")
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--shapes", default=None, help="ROWSxCOLS,... instead of the defaults")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    shapes = [(int(r), int(c), "") for r, c in (s.split("x") for s in args.shapes.split(","))] \
        if args.shapes else SHAPES
    out = []
    for backend in args.backends.split(","):
        for rows, cols, where in shapes:
            r = measure(rows, cols, backend, args.repeat)
            out.append({**r, "from": where})
            cells = "  ".join(f"{k}: {v:.4f}" for k, v in r["ms"].items())  # type: ignore
            print(f"{backend:6s} {rows}x{cols:<5d} {cells}   default {r['default']} "
                  f"(1 row / default {r['one_row_over_default']:.2f})", flush=True)
    write_rows(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
