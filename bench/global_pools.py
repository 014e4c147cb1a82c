"""The global average pools that end ResNet-50, SqueezeNet 1.1, DenseNet-121 (and Inception v1)
and MobileNetV2, and a squeeze-and-excitation block's channel means (MobileNetV3), on OpenCL:
the default kernel (H and W one reduction axis, ``lower.passes.merge_reductions``: on a CPU the
'row' schedule's vectors) round-robin with the kernel before that pass (two nested reduction
loops: 'item'), 'item' over the merged axis, and a copy of the input, against onnxruntime
(2 threads) timed right before and after. Each output is checked against onnxruntime's.

    python bench/global_pools.py [--repeat 100] [--json bench/results/global-pools.json]

With ``--models squeezenet,resnet50``, instead: each model's DNNFusion plan compiled with and
without the pass in one process, whole runs of both round-robin (``scheduling.whole_runs``, 15
rounds, median ms).
"""
from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
from onnx import helper

import kernelgen as kg
from kernelgen.lower import passes

sys.path.insert(0, os.path.dirname(__file__))
from patterns import Pattern, ort_runner  # noqa: E402
from pooling import plans_with_and_without, time_with_copy_and_ort, write_rows  # noqa: E402

# (channels, side, model)
POOLS: tuple[tuple[int, int, str], ...] = (
    (2048, 7, "ResNet-50"), (1000, 13, "SqueezeNet 1.1"), (1024, 7, "DenseNet-121"),
    (1280, 7, "MobileNetV2"), (672, 14, "MobileNetV3 SE"), (96, 56, "MobileNetV3 SE"),
)


# ``merge_reductions`` switched off: the kernels as they were lowered before it
_unmerged = partial(mock.patch.object, passes, "MERGE_REDUCTIONS", False)


def row(c: int, side: int, model: str, *, repeat: int,
        rng: np.random.Generator) -> dict[str, object]:
    shape = (1, c, side, side)
    x = rng.standard_normal(shape).astype(np.float32)
    pool = kg.global_pool("GlobalAveragePool", kg.tensor("x", shape))
    ort_run, ref = ort_runner(Pattern("gap", "GlobalAveragePool", [helper.make_node(
        "GlobalAveragePool", ["x"], ["y"])], [pool], {"x": x}, "y"))
    fused = kg.fuse(pool)
    with _unmerged():
        before = kg.fuse(pool).emit("opencl", tuning="none")
    kernels = {"default": fused.emit("opencl", tuning="none"), "before": before,
               "item": fused.emit("opencl", tuning="none", schedule="item")}
    for kernel in kernels.values():
        np.testing.assert_allclose(kernel(x), ref, rtol=1e-5, atol=1e-6)
    times, ort_ms = time_with_copy_and_ort(kernels, x, ort_run, repeat)
    return {"pool": f"{c}x{side}x{side}", "model": model, "onnxruntime_ms": ort_ms, "ms": times,
            "schedule": kernels["default"].metadata["tunables"]["schedule"],
            "schedule_before": kernels["before"].metadata["tunables"]["schedule"],
            "default_vs_ort": ort_ms / times["default"],
            "before_over_default": times["before"] / times["default"],
            "copy_over_default": times["copy of the input"] / times["default"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", default=None,
                    help="comma-separated light models (squeezenet, resnet50, densenet121)")
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), ("merged", "before"), _unmerged)
        return 0
    rng = np.random.default_rng(0)
    print(f"{'pool':14s} {'model':15s} {'ORT ms':>7s} {'default':>8s} {'before':>7s} "
          f"{'item':>7s} {'copy':>7s} {'vs ORT':>7s} {'before/def':>10s}")
    rows = []
    for c, side, model in POOLS:
        r = row(c, side, model, repeat=args.repeat, rng=rng)
        rows.append(r)
        ms = r["ms"]
        print(f"{r['pool']:14s} {model:15s} {r['onnxruntime_ms']:7.3f} {ms['default']:8.3f} "
              f"{ms['before']:7.3f} {ms['item']:7.3f} {ms['copy of the input']:7.3f} "
              f"{r['default_vs_ort']:6.2f}x {r['before_over_default']:9.2f}x", flush=True)
    gm = {key: float(np.exp(np.mean(np.log([r[key] for r in rows]))))
          for key in ("before_over_default", "default_vs_ort")}
    print(f"geometric mean, before / default: {gm['before_over_default']:.2f}x; default vs "
          f"onnxruntime: {gm['default_vs_ort']:.2f}x")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
