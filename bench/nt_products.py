"""NT products on OpenCL: contractions whose right operand runs along the reduction, not along
the output's columns (attention's Q·Kᵀ with K's Transpose fused, a Gemm with ``transB=1``).
The vector template reads such an operand a lane at a time; by default it now packs it into
panels first (in the tile, or once for constant weights: ``schedule._packs_right``). Per block,
in one process, round-robin (``bench_interleaved``), medians in ms:

- ``packed``: the default;
- ``gathered``: the same kernel with ``pack=False`` (the default before);
- ``split``: for the scores, the block cut at its yellow edge, a transpose kernel and then
  the product (``compile_split``, what the planner's yellow-cell measurement times against
  it); a Gemm is one operator, with no split;
- ``contiguous``: the same product handed the operand already transposed (the floor).

Each variant is checked against NumPy first.

    python bench/nt_products.py [--repeat 30] [--json bench/results/nt-products.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.compile import compile_split
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import write_rows  # noqa: E402

# attention scores (heads, sequence, depth): BERT-base, 8x256, BERT-large at 384, the model
# tests' BERT layer
SCORES = ((12, 128, 64), (8, 256, 64), (16, 384, 64), (4, 128, 64))
# x Wᵀ with constant W (rows, reduction, columns): a classifier's last Gemm, BERT-base's
# projections and FFN as exported with Gemm transB=1, and primes
GEMMS = ((1, 1024, 1000), (128, 768, 768), (128, 768, 3072), (37, 301, 1031))
VARIANTS = ("packed", "gathered", "split", "contiguous")


def _row(block: str, fused: kg.FusedBlock, args: list[np.ndarray], floor: object,
         floor_args: list[np.ndarray], want: np.ndarray, repeat: int) -> dict[str, object]:
    variants = {"packed": (fused.emit("opencl"), args),
                "gathered": (fused.emit("opencl", pack=False), args)}
    if len(fused.ops) > 1:
        variants["split"] = (compile_split(fused, "opencl"), args)
    variants["contiguous"] = (floor, floor_args)
    for name, (kernel, arrays) in variants.items():
        np.testing.assert_allclose(kernel(*arrays), want, rtol=1e-3, atol=1e-3,  # type: ignore[operator]
                                   err_msg=f"{block}, {name}")
    ms = {name: t.median_ms for name, t in bench_interleaved(variants, 3, repeat).items()}
    line = ", ".join(f"{name} {ms[name]:.3f}" for name in VARIANTS if name in ms)
    print(f"{block}: {line} ms; gathered/packed {ms['gathered'] / ms['packed']:.2f}x, "
          f"packed/contiguous {ms['packed'] / ms['contiguous']:.2f}x", flush=True)
    tunables = variants["packed"][0].metadata.get("tunables")  # type: ignore[attr-defined]
    return {"block": block, "ms": ms, "packed": tunables}


def scores_row(heads: int, seq: int, depth: int, repeat: int, rng: np.random.Generator
               ) -> dict[str, object]:
    shape = (heads, seq, depth)
    q, k = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    scale = np.array([depth ** -0.5], np.float32)
    kt = kg.transpose(kg.tensor("k", shape), (0, 2, 1))
    mm = kg.matmul(kg.tensor("q", shape), kt)
    fused = kg.fuse(kt, mm, kg.mul(mm, kg.tensor("scale", (1,))), force=True)
    nn = kg.matmul(kg.tensor("q", shape), kg.tensor("kt", (heads, depth, seq)))
    floor = kg.fuse(nn, kg.mul(nn, kg.tensor("scale", (1,)))).emit("opencl")
    want = (q @ k.transpose(0, 2, 1)) * scale
    return _row(f"Q·Kᵀ·s, {heads}x{seq}x{depth}", fused, [q, k, scale], floor,
                [q, np.ascontiguousarray(k.transpose(0, 2, 1)), scale], want, repeat)


def gemm_row(m: int, k: int, n: int, repeat: int, rng: np.random.Generator
             ) -> dict[str, object]:
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fused = kg.fuse(kg.gemm(kg.tensor("x", (m, k)), kg.constant("w", w), kg.constant("b", b),
                            transB=1))
    floor = kg.fuse(kg.gemm(kg.tensor("x", (m, k)), kg.constant("wt", np.ascontiguousarray(w.T)),
                            kg.constant("b", b))).emit("opencl")
    want = x @ w.T + b
    return _row(f"Gemm transB, {m}x{k}x{n}", fused, [x], floor, [x], want, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = [scores_row(*shape, args.repeat, rng) for shape in SCORES]
    rows += [gemm_row(*shape, args.repeat, rng) for shape in GEMMS]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
