"""Grouped convolutions whose output channels the lowering splits into the group and the
channel within it (``lower/passes.py: split_groups``), against the same blocks lowered as
before (every output channel one axis both operands depend on: one-row tiles), emitted and
timed round-robin on OpenCL in one process (``bench_interleaved``, medians), each checked
against the other. The shapes are ShuffleNet v1's grouped 1x1 convolutions (4 groups, from
onnx's light model) and a 3-group one.

    python bench/grouped_convs.py [--repeat 200] [--json FILE]

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

# (input channels, output channels, map side, groups)
SHAPES = ((272, 272, 14, 4), (136, 136, 28, 4), (112, 136, 28, 4), (544, 544, 7, 4),
          (68, 272, 14, 4), (240, 240, 28, 3))


# lowering without ``split_groups``, as before it
_unsplit = partial(mock.patch.object, passes, "SPLIT_GROUPS", False)


def row(c: int, m: int, side: int, groups: int, repeat: int, rng: np.random.Generator
        ) -> dict[str, object]:
    shape = (1, c, side, side)
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((m, c // groups, 1, 1)) / np.sqrt(c // groups)).astype(np.float32)

    def emit() -> kg.Kernel:
        conv = kg.conv(kg.tensor("x", shape), kg.constant("w", w), group=groups)
        return kg.fuse(conv, kg.relu(conv)).emit("opencl", tuning="none")
    split = emit()
    with _unsplit():
        before = emit()
    np.testing.assert_allclose(split(x), before(x), rtol=1e-4, atol=1e-4)
    ms = {name: t.median_ms for name, t in bench_interleaved(
        {"split": (split, [x]), "before": (before, [x])}, 3, repeat).items()}
    tiles = {name: [k.metadata["schedule"], k.metadata["tunables"].get("tile")]
             for name, k in (("split", split), ("before", before))}
    return {"conv": f"1x1 {c}->{m} @{side}, {groups} groups", "ms": ms, "kernels": tiles,
            "gain": ms["before"] / ms["split"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", default=None, help="comma-separated light models: whole runs")
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), ("groups split", "unsplit"), _unsplit)
        return 0
    rng = np.random.default_rng(0)
    rows = []
    for shape in SHAPES:
        r = row(*shape, repeat=args.repeat, rng=rng)
        rows.append(r)
        ms, kernels = r["ms"], r["kernels"]
        print(f"{r['conv']:28s} split {ms['split']:.3f} ms {kernels['split']}, before "
              f"{ms['before']:.3f} ms {kernels['before']}: {r['gain']:.2f}x", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
