"""Constant right operands packed once, one process: a contraction whose packed operand reads
only constants (a MatMul's weights, a model's initializers) packs its panels in a first kernel
at the first launch and not again (``schedule.PACK_CONSTANTS_ONCE``, ``Launch.pack_once``);
before, the same block packed at every launch, in the tile (``pack_in_tile``) or in a first
kernel. Each block emitted both ways (the second with the rule switched off), checked against
NumPy on fresh inputs, timed round-robin (``bench_interleaved``, medians); with ``--models``,
the BERT layer's DNNFusion plan compiled both ways and whole runs of both round-robin
(``scheduling.whole_runs``).

With ``--in-place``, instead: the blocks whose weights are smaller than
``schedule.PACK_MIN_BYTES`` (BERT's projections, a classifier, awkward shapes), packed once by
default since constants are packed whatever their size, against the same block compiled with
the rule before (``_in_place``: its weights read in place); with ``--models``, the BERT
layer's plan with and without those packs.

    python bench/packed_weights.py [--repeat 100] [--in-place] [--models bert_layer] \
        [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models.model_zoo import bert_layer  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.backends.opencl import schedule  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402
from pooling import both_ways, gain_line, write_rows  # noqa: E402

LABELS = ("packed once", "every launch")
# (rows, reduction, columns, where the shape comes from): x W + b, then ReLU
BLOCKS = ((128, 256, 1024, "BERT layer of the model tests: FFN up"),
          (128, 1024, 256, "BERT layer of the model tests: FFN down"),
          (128, 768, 3072, "BERT-base FFN up"),
          (128, 3072, 768, "BERT-base FFN down"),
          (384, 1024, 1024, "BERT-large projections, 384 tokens"),
          (37, 301, 1031, "awkward: primes"))
# weights below PACK_MIN_BYTES (read in place by default before)
SMALL_BLOCKS = ((128, 256, 256, "BERT layer of the model tests: Q, K, V, output"),
                (128, 256, 768, "BERT layer of the model tests: Q, K, V merged"),
                (16, 256, 768, "16 tokens: Q, K, V merged"),
                (1, 512, 1000, "a classifier's MatMul, batch 1"),
                (37, 131, 257, "awkward: primes"), (7, 13, 37, "awkward: small primes"))
IN_PLACE_LABELS = ("packed once", "in place")


# constant operands packed at every launch, as before the rule
_packed_every_launch = partial(mock.patch.object, schedule, "PACK_CONSTANTS_ONCE", False)


def _in_place() -> ContextManager[object]:
    """Constant right operands packed only where another operand would be: at least
    ``PACK_MIN_BYTES`` read by ``PACK_MIN_ROW_TILES`` row tiles, or gathered lane by lane."""
    own = schedule._packs_right

    def rule(k, c, pack, tiles_r, packed, *, gathered, constant):  # type: ignore[no-untyped-def]
        return own(k, c, pack, tiles_r, packed, gathered=gathered,
                   constant=constant and gathered)
    return mock.patch.object(schedule, "_packs_right", rule)


def _tunables(program: object) -> dict[str, object]:
    kernel = program.kernels[-1] if hasattr(program, "kernels") else program
    return kernel.metadata["tunables"]  # type: ignore[attr-defined,no-any-return]


def block_row(m: int, k: int, n: int, source: str, repeat: int, rng: np.random.Generator,
              labels: tuple[str, str] = LABELS,
              switched_off: Callable[[], ContextManager[object]] = _packed_every_launch
              ) -> dict[str, object]:
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
    add = kg.add(mm, kg.constant("b", b))
    fused = kg.fuse(mm, add, kg.relu(add))
    now = fused.emit("opencl")
    with switched_off():
        before = fused.emit("opencl")
    for _ in range(2):  # fresh inputs, the weights packed once
        x = rng.standard_normal((m, k)).astype(np.float32)
        want = np.maximum(x.astype(np.float64) @ w + b, 0)
        for program in (now, before):
            np.testing.assert_allclose(program(x), want, rtol=1e-3, atol=1e-3)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {labels[0]: (now, [x]), labels[1]: (before, [x])}, 3, repeat).items()}
    block = f"relu(x W + b), {m}x{k}x{n}"
    print(gain_line(block, ms, labels), flush=True)
    return {"block": block, "from": source, "ms": ms,
            "now": _tunables(now), "before": _tunables(before),
            "gain": ms[labels[1]] / ms[labels[0]]}


def model_row(rounds: int, labels: tuple[str, str] = LABELS,
              switched_off: Callable[[], ContextManager[object]] = _packed_every_launch
              ) -> dict[str, object]:
    ms = both_ways(bert_layer(hidden=256, heads=4), labels, switched_off,
                   {"x": (1, 128, 256), "mask": (1, 128)}, rounds)
    print(gain_line("bert_layer (DNNFusion plan, whole runs)", ms, labels), flush=True)
    return {"model": "bert_layer", "ms": ms, "gain": ms[labels[1]] / ms[labels[0]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--models", default="", help="bert_layer: its whole runs too")
    ap.add_argument("--rounds", type=int, default=40, help="whole runs of the model")
    ap.add_argument("--in-place", action="store_true",
                    help="small weights packed once against read in place")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    blocks, labels, off = (SMALL_BLOCKS, IN_PLACE_LABELS, _in_place) if args.in_place else \
        (BLOCKS, LABELS, _packed_every_launch)
    rows = [block_row(m, k, n, source, args.repeat, rng, labels, off)
            for m, k, n, source in blocks]
    if "bert_layer" in args.models.split(","):
        rows.append(model_row(args.rounds, labels, off))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
