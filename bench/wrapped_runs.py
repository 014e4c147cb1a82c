"""Padded 'same' convolutions on OpenCL with their vector columns running over the whole output
map (the default: ``columns.vector_plan``'s ``wrap``, each lane testing its own row and column)
against runs along one output row at a time (``columns.WRAP_RUNS`` off, as before), round-robin,
the kernels' device time (median ms). Every convolution of SqueezeNet 1.1, Inception v1 and
MobileNetV2 that runs im2col or an implicit GEMM by default with a map that no tile of columns
divides, plus Inception's 5x5 convolutions at 7x7 and 14x14; each with its bias and ReLU fused,
default tiles, algorithm as ``conv_algorithms.heuristic`` picks it. Each output is checked
against onnxruntime's first (2 threads), whose time is listed beside.

    python bench/wrapped_runs.py [--rounds 100] [--json bench/results/wrapped-runs.json]

With ``--models squeezenet,inception_v1``, instead: each light model's DNNFusion plan compiled
with and without wrapped runs, whole runs of both round-robin (``pooling.both_ways``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl import columns
from kernelgen.measure import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv import conv_relu_session, time_ort  # noqa: E402
from pooling import compared_row, plans_with_and_without, write_rows  # noqa: E402
from wide_tiles import DeviceTimes  # noqa: E402

LABELS = ("wrapped", "rows")
# (input channels, output channels, kernel side, map side, models)
SHAPES = (
    (16, 64, 3, 55, "SqueezeNet 1.1 fire2-3"),
    (32, 128, 3, 27, "SqueezeNet 1.1 fire4-5"),
    (16, 32, 5, 28, "Inception v1 3a"),
    (32, 96, 5, 28, "Inception v1 3b"),
    (16, 48, 5, 14, "Inception v1 4a"),
    (24, 64, 5, 14, "Inception v1 4b-4d"),
    (32, 128, 5, 14, "Inception v1 4e"),
    (32, 128, 5, 7, "Inception v1 5a"),
    (48, 128, 5, 7, "Inception v1 5b"),
    (16, 16, 3, 5, "small map"),
)


def rows_only() -> ContextManager[object]:
    """Vector columns along one output row at a time, as before wrapped runs."""
    return mock.patch.object(columns, "WRAP_RUNS", False)


def row(c: int, m: int, side: int, size: int, models: str, rounds: int,
        timer: DeviceTimes, rng: np.random.Generator) -> dict[str, object]:
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w = (rng.standard_normal((m, c, side, side)) / np.sqrt(c * side * side)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    pads = side // 2
    conv = kg.conv(kg.tensor("x", x.shape), kg.constant("w", w), kg.constant("b", b),
                   pads=[pads] * 4)
    block = kg.fuse(conv, kg.relu(conv))
    kernels = {"wrapped": block.emit("opencl", tuning="none")}
    with rows_only():
        kernels["rows"] = block.emit("opencl", tuning="none")
    ort = conv_relu_session(x.shape, w, b, pads)
    (want,) = ort.run(None, {"x": x})
    for label, kernel in kernels.items():
        np.testing.assert_allclose(kernel(x), want, rtol=1e-4, atol=1e-4, err_msg=label)
    name = f"{side}x{side} {c}->{m} @{size} ({models})"
    # launches bound once on device buffers, as a compiled model runs them; PoCL's workers
    # placed as the first runs fastest (found and timed by its runner), the same for both
    first = runner(kernels["wrapped"], x)
    runs = {"wrapped": first,
            "rows": runner(kernels["rows"], x, placement=first.placement)}  # type: ignore
    out = compared_row(name, runs, LABELS, rounds, timer)
    out["onnxruntime_ms"] = float(np.median(time_ort(lambda: ort.run(None, {"x": x}), 20)))
    out["tunables"] = {label: k.metadata.get("tunables") for label, k in kernels.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--models", help="compare whole models' plans instead (light models)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), LABELS, rows_only)
        return
    timer, rng = DeviceTimes(), np.random.default_rng(0)
    write_rows(args.json, [row(*shape, args.rounds, timer, rng) for shape in SHAPES])


if __name__ == "__main__":
    main()
