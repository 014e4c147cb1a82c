"""A contraction's epilogue with its column vectors interleaved, one process: the 'tiled'
OpenCL kernel prints each of a tile's column vectors' epilogue on its own and lists them
statement by statement in turn (``printer.interleave``), so that long dependency chains (an
erf, a sigmoid) of the 3-4 vectors overlap; before, each vector's epilogue followed the
other's. Each block emitted both ways (``interleave`` replaced by concatenation for the second
emit), checked against NumPy and timed round-robin (``bench_interleaved``, medians); with
``--models``, the BERT layer's DNNFusion plan compiled both ways and whole runs of both
round-robin (``scheduling.whole_runs``).

    python bench/epilogue_interleave.py [--repeat 100] [--models bert_layer] [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models.model_zoo import bert_layer  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.backends.opencl import emit  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402
from pooling import both_ways, gain_line, write_rows  # noqa: E402

# (rows, reduction, columns, epilogue, where the shape comes from)
BLOCKS = ((128, 256, 1024, "gelu", "BERT layer of the model tests (hidden 256)"),
          (128, 768, 3072, "gelu", "BERT-base FFN"),
          (512, 1024, 1024, "gelu", "issue 20's MatMul + bias + GELU"),
          (256, 512, 2048, "silu", "a SiLU FFN"),
          (128, 768, 3072, "relu", "BERT-base shape, ReLU: a short epilogue"))
_erf = np.vectorize(math.erf, otypes=[np.float64])
LABELS = ("interleaved", "one after another")
MODELS = {"bert_layer": (lambda: bert_layer(hidden=256, heads=4),
                         {"x": (1, 128, 256), "mask": (1, 128)})}


@contextlib.contextmanager
def _one_after_another() -> Iterator[None]:
    """The column vectors' epilogues one after the other, as before ``interleave``."""
    own = emit.interleave
    emit.interleave = lambda blocks: [line for block in blocks for line in block]
    try:
        yield
    finally:
        emit.interleave = own


def _block(m: int, k: int, n: int, epilogue: str, rng: np.random.Generator
           ) -> tuple[kg.FusedOp, np.ndarray, np.ndarray]:
    """MatMul + bias + ``epilogue``, its input and NumPy's result."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
    ops = [mm, kg.add(mm, kg.constant("b", b))]
    h = x.astype(np.float64) @ w + b
    if epilogue == "gelu":
        ops.append(kg.div(ops[-1], kg.constant("sqrt2", np.array(math.sqrt(2), np.float32))))
        ops.append(kg.erf(ops[-1]))
        ops.append(kg.add(ops[-1], kg.constant("one", np.array(1, np.float32))))
        ops.append(kg.mul(ops[1], ops[-1]))
        ops.append(kg.mul(ops[-1], kg.constant("half", np.array(0.5, np.float32))))
        want = 0.5 * h * (1 + _erf(h / math.sqrt(2)))
    elif epilogue == "silu":
        sigmoid = kg.sigmoid(ops[1])
        ops += [sigmoid, kg.mul(ops[1], sigmoid)]
        want = h / (1 + np.exp(-h))
    else:
        ops.append(kg.relu(ops[-1]))
        want = np.maximum(h, 0)
    return kg.fuse(*ops), x, want


def block_row(m: int, k: int, n: int, epilogue: str, source: str, repeat: int,
              rng: np.random.Generator) -> dict[str, object]:
    fused, x, want = _block(m, k, n, epilogue, rng)
    now = fused.emit("opencl")
    with _one_after_another():
        before = fused.emit("opencl")
    assert now.source != before.source, "the two emits printed the same kernel"
    for program in (now, before):
        np.testing.assert_allclose(program(x), want, rtol=1e-3, atol=1e-3)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {LABELS[0]: (now, [x]), LABELS[1]: (before, [x])}, 3, repeat).items()}
    block, tile = f"{epilogue}(x W + b), {m}x{k}x{n}", now.metadata["tunables"].get("tile")
    print(gain_line(f"{block} (tile {tile})", ms, LABELS), flush=True)
    return {"block": block, "from": source, "ms": ms, "tile": tile,
            "gain": ms[LABELS[1]] / ms[LABELS[0]]}


def model_row(name: str, rounds: int) -> dict[str, object]:
    proto, shapes = MODELS[name]
    ms = both_ways(proto(), LABELS, _one_after_another, shapes, rounds)
    print(gain_line(f"{name} (DNNFusion plan, whole runs)", ms, LABELS), flush=True)
    return {"model": name, "ms": ms, "gain": ms[LABELS[1]] / ms[LABELS[0]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--models", default="", help="comma-separated: bert_layer")
    ap.add_argument("--rounds", type=int, default=40, help="whole runs of each model")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = [block_row(m, k, n, epilogue, source, args.repeat, rng)
            for m, k, n, epilogue, source in BLOCKS]
    rows += [model_row(name, args.rounds) for name in filter(None, args.models.split(","))]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
