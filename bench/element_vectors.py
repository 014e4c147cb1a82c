"""Elementwise kernels as a vector of points a work-item (``vectors=True``,
``backends/opencl/element_vectors.py``) against one point a work-item (``vectors=False``) on
this process's OpenCL device: the pattern suite's elementwise blocks that neither transpose nor
interleave (residual adds, SE scaling, depth-to-space's neighbours excluded) and the
elementwise chain, both built in one process, checked against each other, and their kernels'
device times (OpenCL events) taken round-robin; medians in ms. Which of the two the device
takes by default is printed first (``probe.elementwise_gain``).

    python bench/element_vectors.py [--rounds 60] [--json FILE]
    KERNELGEN_OPENCL_DEVICE=intel python bench/element_vectors.py
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl.runtime import device
from kernelgen.measure import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import patterns  # noqa: E402
from pooling import compared_row, write_rows  # noqa: E402
from wide_tiles import DeviceTimes  # noqa: E402

LABELS = ("vectors", "points")


def blocks() -> list[patterns.Pattern]:
    out = [patterns.residual(256, 56), patterns.residual(512, 28), patterns.residual(2048, 7),
           patterns.se_scale(144, 56), patterns.se_scale(240, 28), patterns.se_scale(672, 14)]
    rng = np.random.default_rng(9)
    x = kg.tensor("x", (1024, 1024))
    scale, shift = kg.tensor("scale", (1024,)), kg.tensor("shift", (1024,))
    m = kg.mul(x, scale)
    a = kg.add(m, shift)
    r = kg.relu(a)
    d = kg.sub(r, shift)
    out.append(patterns.Pattern(
        "chain", "clip(relu(x * scale + shift) - shift, -1, 6), 1024x1024", [],
        [m, a, r, d, kg.clip(d, -1.0, 6.0)],
        {"x": rng.standard_normal((1024, 1024)).astype(np.float32),
         "scale": rng.standard_normal(1024).astype(np.float32),
         "shift": rng.standard_normal(1024).astype(np.float32)}, ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    info = device().info
    print(f"{info.name}: elementwise kernels take "
          f"{'vectors' if info.explicit_elementwise else 'points'} by default", flush=True)
    timer = DeviceTimes()
    rows: list[dict[str, object]] = []
    for p in blocks():
        fused = kg.fuse(*p.ops, force=True)
        kernels = {label: fused.emit("opencl", tuning="none", vectors=label == "vectors")
                   for label in LABELS}
        inputs = [p.arrays[a["name"]] for a in kernels["points"].metadata["args"]
                  if a["role"] == "input"]
        np.testing.assert_allclose(kernels["vectors"](*inputs), kernels["points"](*inputs),
                                   rtol=1e-6, atol=1e-6)
        runs = {label: runner(k, *inputs) for label, k in kernels.items()}
        rows.append(compared_row(p.label, runs, LABELS, args.rounds, timer))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
