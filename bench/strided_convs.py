"""Stride-2 convolutions (group 1) of real models on OpenCL: each with its bias and ReLU fused,
compiled the default way (the 'tiled' contraction reading every second float of the patches
as vectors where the output rows take 16-lane vectors, ``columns.column_plan``) and with that
read switched off (a patch matrix written by one kernel and a GEMM in a second: im2col's
two-kernel form), timed round-robin, with onnxruntime (2 threads, Conv then Relu) just before
and after the rounds (``measure.round_robin``'s ``apart``). Each output is checked against
onnxruntime's first. The shapes are every distinct strided conv of ResNet-50, SqueezeNet 1.1,
ShuffleNet, MobileNetV2 and Inception v1 at 224x224.

    python bench/strided_convs.py [--repeat 100] [--json bench/results/strided-convs.json]

With ``--models squeezenet,resnet50``, instead: each light model's DNNFusion plan compiled
with and without the strided reads, whole runs of both round-robin
(``bench/pooling.py: plans_with_and_without``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl import columns, schedule
from kernelgen.measure import round_robin, runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv import conv_relu_session  # noqa: E402
from pooling import plans_with_and_without, write_rows  # noqa: E402

ORT = "onnxruntime"
# (input NCHW, weight MCkk, pads, models)
SHAPES = (
    ((1, 3, 224, 224), (64, 3, 3, 3), 0, "SqueezeNet 1.1 stem"),
    ((1, 3, 224, 224), (64, 3, 7, 7), 3, "ResNet-50, Inception v1 stem"),
    ((1, 3, 224, 224), (24, 3, 3, 3), 1, "ShuffleNet stem"),
    ((1, 3, 224, 224), (32, 3, 3, 3), 1, "MobileNetV2 stem"),
    ((1, 256, 56, 56), (512, 256, 1, 1), 0, "ResNet-50 shortcut"),
    ((1, 128, 56, 56), (128, 128, 3, 3), 1, "ResNet-50 block"),
    ((1, 512, 28, 28), (1024, 512, 1, 1), 0, "ResNet-50 shortcut"),
    ((1, 256, 28, 28), (256, 256, 3, 3), 1, "ResNet-50 block"),
    ((1, 1024, 14, 14), (2048, 1024, 1, 1), 0, "ResNet-50 shortcut"),
    ((1, 512, 14, 14), (512, 512, 3, 3), 1, "ResNet-50 block"),
)


def contiguous_runs_only() -> ContextManager[object]:
    """The contraction's columns read contiguously or lane by lane, as before stride-2 runs."""
    return mock.patch.object(
        schedule, "column_plan",
        lambda k, c, tile, full, widths, caps: columns.vector_plan(k, c, tile, full, widths))


def _form(program: object) -> str:
    """The kernels' schedules, '+'-joined (two kernels: the patch matrix and the GEMM)."""
    kernels = getattr(program, "kernels", [program])
    return "+".join(k.metadata["schedule"] for k in kernels)


def row(x_shape: tuple[int, ...], w_shape: tuple[int, ...], pads: int, models: str,
        repeat: int, rng: np.random.Generator) -> dict[str, object]:
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    conv = kg.conv(kg.tensor("x", x_shape), kg.constant("w", w), kg.constant("b", b),
                   strides=[2, 2], pads=[pads] * 4)
    fused = kg.fuse(conv, kg.relu(conv))
    sess = conv_relu_session(x_shape, w, b, pads, strides=2)
    ref = sess.run(None, {"x": x})[0]
    default = fused.emit("opencl", tuning="none")
    with contiguous_runs_only():
        before = fused.emit("opencl", tuning="none")
    programs = {"default": default, "patch matrix": before}
    for program in programs.values():
        np.testing.assert_allclose(program(x), ref, rtol=1e-3, atol=1e-3)
    calls = {name: runner(p, x) for name, p in programs.items()}
    times = {name: float(np.median(t)) for name, t in round_robin(
        calls, 1, repeat, apart={ORT: lambda: sess.run(None, {"x": x})}).items()}
    return {"conv": f"{w_shape[2]}x{w_shape[3]}/2 {w_shape[1]}->{w_shape[0]} @{x_shape[2]}",
            "models": models, "onnxruntime_ms": times[ORT], "default_ms": times["default"],
            "patch_matrix_ms": times["patch matrix"], "default_form": _form(default),
            "before_form": _form(before), "gain": times["patch matrix"] / times["default"],
            "default_vs_ort": times[ORT] / times["default"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--models", default=None,
                    help="comma-separated light models: whole runs with and without")
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), ("stride-2 runs", "patch matrices"),
                               contiguous_runs_only)
        return 0
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'conv':24s} {'ORT':>7s} {'default':>8s} {'before':>8s} {'gain':>6s} {'vs ORT':>7s}"
          f"  forms")
    for x_shape, w_shape, pads, models in SHAPES:
        r = row(x_shape, w_shape, pads, models, args.repeat, rng)
        rows.append(r)
        print(f"{r['conv']:24s} {r['onnxruntime_ms']:7.3f} {r['default_ms']:8.3f} "
              f"{r['patch_matrix_ms']:8.3f} {r['gain']:5.2f}x {r['default_vs_ort']:6.2f}x  "
              f"{r['default_form']} / {r['before_form']}  ({models})", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
