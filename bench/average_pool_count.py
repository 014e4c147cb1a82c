"""An AveragePool whose padded border windows count fewer taps (ONNX's default,
count_include_pad=0), one process: the divisor written tap by tap on the output index
(``ops/nn.py: _window_count``, one sum per output) in the default schedule (the pooling
window, its count's conditions on the column as lane masks) and in 'item', against a second
reduction counting the valid taps (the form before it, ``COUNT_UNROLLED_TAPS`` set to 0 for
that emit; 'item'), each checked against ONNX's reference and timed round-robin on OpenCL
(``bench_interleaved``, medians). The shapes are ShuffleNet v1's shortcut pools (3x3, stride 2,
pad 1).

    python bench/average_pool_count.py [--repeat 200] [--json FILE]

With ``--models shufflenet``, instead: the model's DNNFusion plan compiled with its padded
AveragePools as pooling windows (the default) and as 'item' kernels (the window's epilogue
refusing lane masks), whole runs of both round-robin (``pooling.plans_with_and_without``).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import evaluate_chain  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.backends.opencl import columns, window  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402
from kernelgen.ops import nn  # noqa: E402
from pooling import plans_with_and_without, write_rows  # noqa: E402

SHAPES = ((1, 24, 56, 56), (1, 136, 28, 28), (1, 272, 14, 14), (1, 544, 7, 7))


@contextlib.contextmanager
def _unmasked_epilogues() -> Iterator[None]:
    """The pooling window's epilogue without lane masks, as before: padded AveragePools,
    whose count tests the column, run 'item'."""
    window.vector_epilogue = lambda k, c, plan, masks=False: columns.vector_epilogue(k, c, plan)
    window.opencl_window.cache_clear()
    try:
        yield
    finally:
        window.vector_epilogue = columns.vector_epilogue
        window.opencl_window.cache_clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", default=None, help="comma-separated light models: whole runs")
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), ("AveragePools as windows", "as 'item'"),
                               _unmasked_epilogues)
        return 0
    rows = []
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        variants = {}
        for name, taps in (("count tap by tap", nn.COUNT_UNROLLED_TAPS), ("count reduced", 0)):
            before, nn.COUNT_UNROLLED_TAPS = nn.COUNT_UNROLLED_TAPS, taps
            try:
                pool = kg.average_pool(kg.tensor("x", shape), [3, 3], strides=[2, 2],
                                       pads=[1, 1, 1, 1])
            finally:
                nn.COUNT_UNROLLED_TAPS = before
            want = evaluate_chain([pool], {"x": x})[pool.name]
            schedules = (None, "item") if taps else ("item",)
            for schedule in schedules:
                kernel = kg.fuse(pool).emit("opencl", schedule=schedule)
                np.testing.assert_allclose(kernel(x), want, rtol=1e-5, atol=1e-6)
                variants[f"{kernel.metadata['schedule']}, {name}"] = (kernel, [x])
        ms = {n: t.median_ms for n, t in bench_interleaved(variants, 3, args.repeat).items()}
        default, item, reduced = ms
        gain, window_gain = ms[reduced] / ms[item], ms[item] / ms[default]
        print(f"AveragePool 3x3/2 over {'x'.join(map(str, shape[1:]))}: "
              + "; ".join(f"{n} {t:.3f} ms" for n, t in ms.items())
              + f". Tap by tap {gain:.2f}x the reduction ('item'), the default "
              f"({default.split(',')[0]}) {window_gain:.2f}x 'item'", flush=True)
        rows.append({"shape": list(shape), "default": default, "ms": ms, "gain": gain,
                     "default_over_item": window_gain})
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
