"""The math library's polynomial steps as multiply-adds (``muladd``: one expression, which
OpenCL C contracts into an FMA where the device has a fast one) against the same expansions
with a separate multiply and add (as before), emitted and timed round-robin on OpenCL in one
process (``bench_interleaved``, medians), each checked against the other: the functions over
1M floats, masked softmax rows, and a GELU feed-forward GEMM.

    python bench/math_fma.py [--rounds 5] [--repeat 30] [--json FILE]

With ``--models bert_layer``, instead: the BERT-style layer's DNNFusion plan (hidden 256,
4 heads, sequence 128) compiled both ways, whole runs of both round-robin.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.ir.expr import Expr, call
from kernelgen.lower import fastmath
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from models.model_zoo import bert_layer  # noqa: E402
from patterns import masked_softmax  # noqa: E402
from pooling import both_ways, gain_line, write_rows  # noqa: E402


def _twice_rounded(a: Expr, b: Expr, c: Expr) -> Expr:
    return call("add", call("mul", a, b), c)


# the expansions as before the multiply-adds: a multiply, then an add
_plain = partial(mock.patch.object, fastmath, "_muladd", _twice_rounded)

Case = tuple[str, Callable[[], kg.FusedOp], list[np.ndarray]]


def cases(rng: np.random.Generator) -> Iterator[Case]:
    n = 1 << 20
    x, xs = kg.tensor("x", (n,)), (3 * rng.standard_normal(n)).astype(np.float32)
    unary = {"exp": kg.exp, "erf": kg.erf, "tanh": kg.tanh, "sigmoid": kg.sigmoid,
             "gelu (erf)": kg.gelu}
    for name, op in unary.items():
        yield f"{name}, 1M", partial(lambda op: kg.fuse(op(x)), op), [xs]
    yield "log(|x|), 1M", lambda: kg.fuse(a := kg.abs(x), kg.log(a)), [xs]
    for rows, cols in ((1536, 128), (4096, 1024)):
        p = masked_softmax(rows, cols)
        yield (p.label, partial(lambda p: kg.fuse(*p.ops), p),
               [p.arrays[k] for k in ("x", "s", "mask")])
    m, k, n_out = 128, 256, 1024  # the BERT layer's first feed-forward MatMul
    w = (rng.standard_normal((k, n_out)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)

    def ffn() -> kg.FusedOp:
        mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
        biased = kg.add(mm, kg.constant("b", b))
        return kg.fuse(mm, biased, kg.gelu(biased))
    yield f"gelu(x W + b), {m}x{k}x{n_out}", ffn, [rng.standard_normal((m, k)).astype(np.float32)]


def row(case: Case, rounds: int, repeat: int) -> dict[str, object]:
    label, build, args = case
    fused = build().emit("opencl", tuning="none")
    with _plain():
        plain = build().emit("opencl", tuning="none")
    np.testing.assert_allclose(fused(*args), plain(*args), rtol=1e-5, atol=1e-6)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {"muladd": (fused, args), "plain": (plain, args)}, rounds, repeat).items()}
    return {"block": label, "ms": ms, "gain": ms["plain"] / ms["muladd"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", default=None, help="'bert_layer': whole runs")
    args = ap.parse_args()
    if args.models:
        labels = ("multiply-adds", "plain")
        shapes = {"x": (1, 128, 256), "mask": (1, 128)}
        ms = both_ways(bert_layer(hidden=256, heads=4), labels, _plain, shapes, rounds=40)
        print(gain_line("bert_layer", ms, labels))
        return 0
    rows = []
    for case in cases(np.random.default_rng(0)):
        r = row(case, args.rounds, args.repeat)
        rows.append(r)
        ms = r["ms"]
        print(f"{r['block']:36s} multiply-adds {ms['muladd']:.3f} ms, plain {ms['plain']:.3f} "
              f"ms: {r['gain']:.2f}x", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
