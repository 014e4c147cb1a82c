"""1x1 convolutions, the GEMMs of real models: every pointwise convolution of ResNet-50 and
MobileNetV2 (224x224, batch 1), ShuffleNet v2's branch convolutions and two of SqueezeNet 1.1,
each with its ReLU fused (BN folds into the weights in a model compile), on OpenCL with the
default schedule (what a model compiled without tuning runs) against onnxruntime (2 threads)
timed just before and after the rounds. Round-robin beside the default: the other operand order
(lanes along output channels or along pixels, ``swap_operands``), a few other register tiles
(how far the default is from the best of them) and, where the reduction is short enough for
the rule before it, the default tile with its reduction loop unrolled completely
(``schedule.UNROLL_K_MAX_FMAS`` raised for that one emit) and, on a device with 16 SIMD
registers (AVX2), the tiles AVX-512 takes (``_avx512_tiles``: the default before the tiles
followed the register file) and, where the default's work-groups hold column tiles
(``group_columns``), the same kernel in groups of row tiles. Each output is checked against
onnxruntime's first.

    python bench/conv1x1.py [--repeat 200] [--only 16->96] [--orders-only] \
        [--json bench/results/conv1x1.json]

With ``--models squeezenet,resnet50`` on such a device, instead: each light model's DNNFusion
plan compiled with the device's register tiles and with AVX-512's, whole runs of both
round-robin (``bench/pooling.py: plans_with_and_without``); with ``--models ... --switch
row-groups``, compiled as it is and with every contraction in work-groups of row tiles (no
``group_columns`` by default); with ``--switch operand-order``, as it is and with no operands
exchanged by default (``swap_operands``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import schedule as opencl_schedule
from kernelgen.backends.opencl.columns import few_registers
from kernelgen.measure import round_robin, runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv import ort_session  # noqa: E402
from pooling import plans_with_and_without  # noqa: E402

# (input channels, output channels, map side, stride, model)
SHAPES = (
    (64, 64, 56, 1, "ResNet-50"), (64, 256, 56, 1, "ResNet-50"), (256, 64, 56, 1, "ResNet-50"),
    (256, 128, 56, 1, "ResNet-50"), (256, 512, 56, 2, "ResNet-50"),
    (128, 512, 28, 1, "ResNet-50"), (512, 128, 28, 1, "ResNet-50"),
    (256, 1024, 14, 1, "ResNet-50"), (1024, 256, 14, 1, "ResNet-50"),
    (512, 2048, 7, 1, "ResNet-50"), (2048, 512, 7, 1, "ResNet-50"),
    (32, 16, 112, 1, "MobileNetV2"), (16, 96, 112, 1, "MobileNetV2"),
    (24, 144, 56, 1, "MobileNetV2"), (144, 24, 56, 1, "MobileNetV2"),
    (32, 192, 28, 1, "MobileNetV2"), (192, 32, 28, 1, "MobileNetV2"),
    (64, 384, 14, 1, "MobileNetV2"), (384, 64, 14, 1, "MobileNetV2"),
    (96, 576, 14, 1, "MobileNetV2"), (576, 96, 14, 1, "MobileNetV2"),
    (160, 960, 7, 1, "MobileNetV2"), (960, 160, 7, 1, "MobileNetV2"),
    (320, 1280, 7, 1, "MobileNetV2"),
    (116, 116, 28, 1, "ShuffleNet v2"), (232, 232, 14, 1, "ShuffleNet v2"),
    (464, 464, 7, 1, "ShuffleNet v2"),
    (512, 64, 13, 1, "SqueezeNet 1.1"), (512, 1000, 13, 1, "SqueezeNet 1.1"),
)
OTHER_TILES = ((8, 32), (4, 64), (6, 64))
NARROW_OTHER_TILES = ((6, 16), (4, 24), (3, 32))  # with 16 registers, in 8-lane vectors
ORT = "onnxruntime"
UNROLLED = '_Pragma("unroll") for (int kg_k'  # the GEMM's reduction loop, unrolled


def variants(fused: kg.FusedOp, x: np.ndarray, ref: np.ndarray, orders_only: bool = False
             ) -> dict[str, tuple]:
    """The default emit, the other operand order (``swap_operands``), the other tiles and
    (where it differs) the unrolled reduction, each checked against ``ref``; with
    ``orders_only``, the default and the other order alone."""
    out = {"default": fused.emit("opencl")}
    if not hasattr(out["default"], "kernels"):  # not a program (a gather, then the GEMM)
        swapped = bool(out["default"].metadata["tunables"].get("swap_operands"))
        try:
            out["pixel vectors" if swapped else "channel vectors"] = \
                fused.emit("opencl", swap_operands=not swapped)
        except ValueError:  # a stride-2 conv reading its patches in place: only one order
            pass
    if orders_only:
        return _checked(out, x, ref)
    narrow = few_registers(backends.get("opencl").caps)
    if narrow:  # the default before the tiles followed the register file
        with _avx512_tiles():
            out["AVX-512 tiles"] = fused.emit("opencl")
    # a strided 1x1 convolution is a program (its gather, then the GEMM): one tile would not
    # fit both stages
    for tile in (NARROW_OTHER_TILES if narrow else OTHER_TILES) \
            if not hasattr(out["default"], "kernels") else ():
        program = fused.emit("opencl", tile=tile)
        if _tile(program) != _tile(out["default"]):
            out[f"tile {tile[0]}x{tile[1]}"] = program
    if _tunables(out["default"]).get("group_columns"):  # as before that rule
        out["groups of row tiles"] = fused.emit("opencl", group_columns=False)
    with mock.patch.object(opencl_schedule, "UNROLL_K_MAX_FMAS", 1 << 30):
        unrolled = fused.emit("opencl")
    if UNROLLED in unrolled.source and UNROLLED not in out["default"].source:
        out["default, reduction unrolled"] = unrolled
    return _checked(out, x, ref)


def _checked(programs: dict[str, object], x: np.ndarray, ref: np.ndarray) -> dict[str, tuple]:
    for program in programs.values():
        np.testing.assert_allclose(program(x), ref, rtol=1e-3, atol=1e-3)
    return {name: (program, [x]) for name, program in programs.items()}


def _tunables(program) -> dict[str, object]:
    """The GEMM's tunables (a program's last kernel)."""
    kernel = program.kernels[-1] if hasattr(program, "kernels") else program
    return kernel.metadata["tunables"]


def _tile(program) -> list[int] | None:
    """The GEMM's register tile."""
    return _tunables(program).get("tile")


def _row_groups() -> ContextManager[object]:
    """Every contraction's work-groups of row tiles, as before ``group_columns``."""
    return mock.patch.object(opencl_schedule, "GROUP_COLUMNS_MIN_RATIO", 1 << 62)


def _pixel_vectors() -> ContextManager[object]:
    """No contraction's operands exchanged by default (``swap_operands``): a 1x1
    convolution's lanes along its pixels, as before that rule."""
    return mock.patch.object(opencl_schedule, "swaps_by_default", lambda *args: False)


def _avx512_tiles() -> ContextManager[object]:
    """Every contraction tiled as on a CPU with 32 registers of 16 lanes."""
    own = opencl_schedule.register_tiles
    return mock.patch.object(opencl_schedule, "register_tiles",
                             lambda caps: own(replace(caps, vector_registers=32)))


def row(c: int, m: int, side: int, stride: int, model: str, repeat: int,
        rng: np.random.Generator, orders_only: bool = False) -> dict[str, object]:
    xs = (1, c, side, side)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    conv = kg.conv(kg.tensor("x", xs), kg.constant("w", w), strides=[stride, stride])
    fused = kg.fuse(conv, kg.relu(conv))
    sess = ort_session(xs, w, 0, 1, strides=stride)

    def ort_run() -> list[np.ndarray]:
        return sess.run(None, {"x": x})
    ref = np.maximum(ort_run()[0], 0)
    timed = variants(fused, x, ref, orders_only)
    # onnxruntime just before and after the rounds: its spinning pool would slow the call after it
    calls = {name: runner(program, *arrays) for name, (program, arrays) in timed.items()}
    times = {name: float(np.median(t)) for name, t in
             round_robin(calls, 1, repeat, apart={ORT: ort_run}).items()}
    ort_ms = times.pop(ORT)
    best = min(times, key=times.__getitem__)
    side_out = -(-side // stride)
    flop = 2 * c * m * side_out * side_out
    return {"conv": f"1x1 {c}->{m} @{side}" + (f" stride {stride}" if stride > 1 else ""),
            "model": model, "onnxruntime_ms": ort_ms, "ms": times,
            "tile": _tile(timed["default"][0]),
            "default_vs_ort": ort_ms / times["default"], "best": best,
            "default_gflops": flop / times["default"] / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--only", default=None, help="run the shapes whose name contains this")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--orders-only", action="store_true",
                    help="time the default and the other operand order alone")
    ap.add_argument("--models", default=None,
                    help="comma-separated light models: whole runs, these tiles and AVX-512's")
    ap.add_argument("--switch", choices=("avx512", "row-groups", "operand-order"),
                    default="avx512",
                    help="with --models: what the second compile switches off")
    args = ap.parse_args()
    if args.models:
        if args.switch == "avx512":
            plans_with_and_without(args.models.split(","), ("own tiles", "AVX-512 tiles"),
                                   _avx512_tiles)
        elif args.switch == "row-groups":
            plans_with_and_without(args.models.split(","),
                                   ("column-tile groups", "row-tile groups"), _row_groups)
        else:
            plans_with_and_without(args.models.split(","),
                                   ("default order", "pixel vectors"), _pixel_vectors)
        return 0
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'conv':24s} {'ORT':>7s} {'default':>8s} {'vs ORT':>7s} {'GFLOP/s':>8s}  others")
    for c, m, side, stride, model in SHAPES:
        name = f"{c}->{m} @{side}"
        if args.only and args.only not in name:
            continue
        r = row(c, m, side, stride, model, args.repeat, rng, args.orders_only)
        rows.append(r)
        others = ", ".join(f"{k} {v:.3f}" for k, v in r["ms"].items() if k != "default")
        print(f"{r['conv']:24s} {r['onnxruntime_ms']:7.3f} {r['ms']['default']:8.3f} "
              f"{r['default_vs_ort']:6.2f}x {r['default_gflops']:8.1f}  {others}", flush=True)
    ratios = [r["default_vs_ort"] for r in rows]
    if ratios:
        print(f"geometric mean of default vs onnxruntime: "
              f"{float(np.exp(np.mean(np.log(ratios)))):.2f}x over {len(ratios)} convolutions")
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python bench/conv1x1.py " + " ".join(sys.argv[1:]),
            "rows": rows, "loadavg": os.getloadavg()[0]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
