"""Fused attention, softmax(Q transpose(K) s) V, as emitted now against the same block with one
change undone, all timed round-robin on OpenCL in one process (``bench_interleaved``, medians)
and checked against each other:

- 'exp twice': the softmax's exp computed by its sum and again by the weights row, where now
  the exp row is staged once per query and both read it (``lower/staging.py``);
- 'float16': the staged rows in float16 vectors, where a CPU with 16 SIMD registers (AVX2) now
  takes register-wide ones (``backends/opencl/staged.py: staged_row_width``);
- 'before': both undone.

The shapes are the pattern suite's (bench/patterns.py) and the BERT layer's.

    python bench/attention_exp.py [--rounds 5] [--repeat 10] [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl import staged
from kernelgen.lower import staging
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patterns import attention  # noqa: E402
from pooling import write_rows  # noqa: E402

SHAPES = ((8, 256, 64), (12, 128, 64), (4, 512, 64), (4, 128, 64))  # heads, sequence, depth

VARIANTS: dict[str, Callable[[], AbstractContextManager[object]]] = {
    "now": nullcontext,
    "exp twice": partial(mock.patch.object, staging, "SHARE_WITH_ROWS", False),
    "float16": partial(mock.patch.object, staged, "staged_row_width",
                       lambda loop, caps: staged.STAGED_ROW_WIDTH),
}
VARIANTS["before"] = lambda: both(VARIANTS["exp twice"], VARIANTS["float16"])


@contextmanager
def both(*undone: Callable[[], AbstractContextManager[object]]) -> Iterator[None]:
    """Every one of ``undone``'s changes undone at once."""
    with ExitStack() as stack:
        for cm in undone:
            stack.enter_context(cm())
        yield


def variant_row(backend: str, heads: int, seq: int, depth: int,
                variants: dict[str, Callable[[], AbstractContextManager[object]]],
                warmup: int, repeat: int) -> dict[str, object]:
    """The pattern suite's attention emitted on ``backend`` under each of ``variants`` (one
    named 'now'), checked against 'now' and timed round-robin: medians, each variant's time
    over now's ('gain') and tunables."""
    p = attention(heads, seq, depth)
    args = [p.arrays[name] for name in ("q", "k", "s", "v")]
    kernels = {}
    for name, undone in variants.items():
        with undone():
            kernels[name] = kg.fuse(*p.ops, force=True).emit(backend, tuning="none")
    want = kernels["now"](*args)
    for kernel in kernels.values():
        np.testing.assert_allclose(kernel(*args), want, rtol=1e-5, atol=1e-6)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {name: (k, args) for name, k in kernels.items()}, warmup, repeat).items()}
    return {"block": p.label, "ms": ms,
            "gain": {name: ms[name] / ms["now"] for name in variants if name != "now"},
            "tunables": {name: k.metadata["tunables"] for name, k in kernels.items()}}


def report(rows: Iterable[dict[str, Any]], json: Path | None) -> None:
    """Print each row's medians as it comes, then write them all to ``json``."""
    done = []
    for r in rows:
        done.append(r)
        print(f"{r['block']:44s} " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in
                                               r["ms"].items()), flush=True)
    write_rows(json, done)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    report((variant_row("opencl", *shape, VARIANTS, args.rounds, args.repeat)
            for shape in SHAPES), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
