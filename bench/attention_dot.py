"""Fused attention, softmax(Q transpose(K) s) V, as emitted now against the same block with
one change undone, all timed round-robin in one process (``bench_interleaved``, medians) and
checked against each other:

- 'transposed tiles': each score row read the keys as tiles transposed in registers (one lane
  move per multiply-add), where now each score is a dot product of a query's row and a key's
  row along the depth, its lanes folded by pair sums (``backends/c/dots.py``); on NEON C,
  which has no transposed tiles, the score row then runs one key at a time;
- 'separate multiply-adds' (OpenCL): the vector sums' products and additions as two
  statements, which OpenCL C does not contract into FMAs, where now each is one expression;
- 'before': both undone.

The shapes are the pattern suite's (bench/patterns.py) and the BERT layer's.

    python bench/attention_dot.py [--backend opencl|neon] [--repeat 30] [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.backends.c import vector
from kernelgen.backends.opencl import emit
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patterns import attention  # noqa: E402
from pooling import write_rows  # noqa: E402

SHAPES = ((8, 256, 64), (12, 128, 64), (4, 512, 64), (4, 128, 64))  # heads, sequence, depth


@contextmanager
def _separate_multiply_adds() -> Iterator[None]:
    with mock.patch.object(emit.OpenCLPrinter, "vector", replace(emit.VECTOR, fma="")), \
            mock.patch.object(emit, "vector_syntax",
                              lambda width: replace(emit.vector_syntax(width), fma="")):
        yield


@contextmanager
def _both(*undone: Callable[[], AbstractContextManager[object]]) -> Iterator[None]:
    with ExitStack() as stack:
        for cm in undone:
            stack.enter_context(cm())
        yield


TILES = partial(mock.patch.object, vector, "dot_product_ok", lambda *args, **kw: False)
VARIANTS: dict[str, dict[str, Callable[[], AbstractContextManager[object]]]] = {
    "opencl": {"now": nullcontext, "transposed tiles": TILES,
               "separate multiply-adds": _separate_multiply_adds,
               "before": partial(_both, TILES, _separate_multiply_adds)},
    "neon": {"now": nullcontext, "one key at a time": TILES},
}


def row(backend: str, heads: int, seq: int, depth: int, repeat: int) -> dict[str, object]:
    p = attention(heads, seq, depth)
    args = [p.arrays[name] for name in ("q", "k", "s", "v")]
    variants = VARIANTS[backend]
    kernels = {}
    for name, undone in variants.items():
        with undone():
            kernels[name] = kg.fuse(*p.ops, force=True).emit(backend, tuning="none")
    want = kernels["now"](*args)
    for kernel in kernels.values():
        np.testing.assert_allclose(kernel(*args), want, rtol=1e-5, atol=1e-6)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {name: (k, args) for name, k in kernels.items()}, warmup=3, repeat=repeat).items()}
    return {"backend": backend, "block": p.label, "ms": ms,
            "gain": {name: ms[name] / ms["now"] for name in variants if name != "now"},
            "tunables": {name: k.metadata["tunables"] for name, k in kernels.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=sorted(VARIANTS), default="opencl")
    ap.add_argument("--repeat", type=int, default=30, help="rounds, one run of each a round")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for shape in SHAPES:
        r = row(args.backend, *shape, repeat=args.repeat)
        rows.append(r)
        print(f"{r['block']:44s} " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in
                                               r["ms"].items()), flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
