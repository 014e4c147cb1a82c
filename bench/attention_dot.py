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
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from unittest import mock

from kernelgen.backends.c import vector
from kernelgen.backends.opencl import emit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_exp import SHAPES, both, report, variant_row  # noqa: E402


@contextmanager
def _separate_multiply_adds() -> Iterator[None]:
    with mock.patch.object(emit.OpenCLPrinter, "vector", replace(emit.VECTOR, fma="")), \
            mock.patch.object(emit, "vector_syntax",
                              lambda width: replace(emit.vector_syntax(width), fma="")):
        yield


TILES = partial(mock.patch.object, vector, "dot_product_ok", lambda *args, **kw: False)
VARIANTS: dict[str, dict[str, Callable[[], AbstractContextManager[object]]]] = {
    "opencl": {"now": nullcontext, "transposed tiles": TILES,
               "separate multiply-adds": _separate_multiply_adds,
               "before": partial(both, TILES, _separate_multiply_adds)},
    "neon": {"now": nullcontext, "one key at a time": TILES},
}


def row(backend: str, heads: int, seq: int, depth: int, repeat: int) -> dict[str, object]:
    """Each of ``backend``'s variants (``VARIANTS``), 3 rounds of warm-up, ``repeat`` timed."""
    return {"backend": backend,
            **variant_row(backend, heads, seq, depth, VARIANTS[backend], 3, repeat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=sorted(VARIANTS), default="opencl")
    ap.add_argument("--repeat", type=int, default=30, help="rounds, one run of each a round")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    report((row(args.backend, *shape, repeat=args.repeat) for shape in SHAPES), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
