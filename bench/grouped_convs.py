"""Grouped convolutions whose output channels the lowering splits into the group and the
channel within it (``lower/passes.py: split_groups``), against the same blocks lowered as
before (every output channel one axis both operands depend on: one-row tiles), emitted and
timed round-robin on OpenCL in one process (``bench_interleaved``, medians), each checked
against the other. The shapes are ShuffleNet v1's grouped 1x1 convolutions (4 groups, from
onnx's light model) and a 3-group one; with ``--windows``, grouped convolutions that sum over
a window too: AlexNet's (2 groups of 128 to 192 channels, 5x5 and 3x3) and narrower groups
(8 to 20 channels), which stay unsplit (``passes.SPLIT_WINDOW_MIN_CHANNELS``), timed split
and unsplit all the same.

    python bench/grouped_convs.py [--repeat 200] [--windows] [--json FILE]

With ``--models shufflenet``, instead: the model's DNNFusion plan compiled with the split and
without it, whole runs of both round-robin (``pooling.plans_with_and_without``).
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.lower import passes
from kernelgen.measure import bench_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import plans_with_and_without, write_rows  # noqa: E402

# (input channels, output channels, map side, groups[, window side])
SHAPES = ((272, 272, 14, 4), (136, 136, 28, 4), (112, 136, 28, 4), (544, 544, 7, 4),
          (68, 272, 14, 4), (240, 240, 28, 3))
WINDOWS = ((96, 256, 27, 2, 5), (384, 384, 13, 2, 3), (384, 256, 13, 2, 3),
           (256, 256, 28, 32, 3), (128, 128, 56, 16, 3), (64, 64, 17, 8, 3), (48, 40, 11, 2, 5))


# lowering without ``split_groups``, as before it
_unsplit = partial(mock.patch.object, passes, "SPLIT_GROUPS", False)


def row(c: int, m: int, side: int, groups: int, k: int = 1, *, repeat: int,
        rng: np.random.Generator) -> dict[str, object]:
    shape = (1, c, side, side)
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((m, c // groups, k, k))
         / np.sqrt(c // groups * k * k)).astype(np.float32)

    def emit(split: bool) -> kg.Kernel:
        conv = kg.conv(kg.tensor("x", shape), kg.constant("w", w), group=groups,
                       pads=[k // 2] * 4)
        # a narrow windowed group is split only when asked to, to time it both ways
        with mock.patch.object(passes, "SPLIT_WINDOW_MIN_CHANNELS", 8 if split else 10**9):
            return kg.fuse(conv, kg.relu(conv)).emit("opencl", tuning="none")
    split = emit(True)
    with _unsplit():
        before = emit(False)
    np.testing.assert_allclose(split(x), before(x), rtol=1e-4, atol=1e-4)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {"split": (split, [x]), "before": (before, [x])}, 3, repeat).items()}
    tiles = {name: [kern.metadata["schedule"], kern.metadata.get("tunables", {}).get("tile")]
             for name, kern in (("split", split), ("before", before))}
    return {"conv": f"{k}x{k} {c}->{m} @{side}, {groups} groups", "ms": ms, "kernels": tiles,
            "gain": ms["before"] / ms["split"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", default=None, help="comma-separated light models: whole runs")
    ap.add_argument("--windows", action="store_true",
                    help="grouped convolutions over a window (AlexNet's and narrower ones)")
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), ("groups split", "unsplit"), _unsplit)
        return 0
    rng = np.random.default_rng(0)
    rows = []
    for shape in WINDOWS if args.windows else SHAPES:
        r = row(*shape, repeat=args.repeat, rng=rng)
        rows.append(r)
        ms, kernels = r["ms"], r["kernels"]
        print(f"{r['conv']:28s} split {ms['split']:.3f} ms {kernels['split']}, before "
              f"{ms['before']:.3f} ms {kernels['before']}: {r['gain']:.2f}x", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
