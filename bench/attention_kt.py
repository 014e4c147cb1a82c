"""Fused attention with the Transpose of K fused (K as the projections give it, (heads,
sequence, depth)) against the same block given Kᵀ contiguous, (heads, depth, sequence): the
issue's target for a fused transpose is 1.1x the contiguous kernel's time. Both emitted with
the defaults, checked against each other, timed round-robin in one process
(``bench_interleaved``, medians). OpenCL.

    python bench/attention_kt.py [--repeat 30] [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_exp import SHAPES  # noqa: E402
from patterns import attention  # noqa: E402
from pooling import write_rows  # noqa: E402


def contiguous_keys(heads: int, seq: int, depth: int) -> kg.FusedOp:
    """softmax(Q Kᵀ s) V with Kᵀ an input of its own, contiguous along the keys."""
    q, kt, v = (kg.tensor(name, shape) for name, shape in (
        ("q", (heads, seq, depth)), ("kt", (heads, depth, seq)), ("v", (heads, seq, depth))))
    scores = kg.matmul(q, kt)
    scaled = kg.mul(scores, kg.tensor("s", (1,)))
    p = kg.softmax(scaled, 2)
    return kg.fuse(scores, scaled, p, kg.matmul(p, v), force=True)


def row(heads: int, seq: int, depth: int, repeat: int) -> dict[str, object]:
    p = attention(heads, seq, depth)
    args = [p.arrays[name] for name in ("q", "k", "s", "v")]
    fused = kg.fuse(*p.ops, force=True).emit("opencl", tuning="none")
    block = contiguous_keys(heads, seq, depth)
    feeds = {"q": p.arrays["q"], "kt": np.ascontiguousarray(p.arrays["k"].transpose(0, 2, 1)),
             "s": p.arrays["s"], "v": p.arrays["v"]}
    given = [feeds[x.name] for x in block.inputs]
    contiguous = block.emit("opencl", tuning="none")
    np.testing.assert_allclose(contiguous(*given), fused(*args), rtol=1e-4, atol=1e-5)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {"K transposed in the kernel": (fused, args), "Kᵀ given contiguous": (contiguous, given)},
        warmup=3, repeat=repeat).items()}
    return {"block": p.label, "ms": ms,
            "ratio": ms["K transposed in the kernel"] / ms["Kᵀ given contiguous"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30, help="rounds, one run of each a round")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for shape in SHAPES:
        r = row(*shape, repeat=args.repeat)
        rows.append(r)
        print(f"{r['block']:44s} " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in
                                               r["ms"].items()) + f", ratio {r['ratio']:.2f}",
              flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
