"""The OpenCL contraction's wide register tile, 6 rows x 4 vectors (``columns.WIDE_TILE``),
against the 4 x 4 it replaced, on the blocks that take it by default on a CPU with 32 SIMD
registers: the 1x1 convolutions of ResNet-50, MobileNetV2 and ShuffleNet over maps of 28x28
and more (each with its ReLU) and the BERT layers' MatMuls (bias and ReLU). Device time of the
kernels from their OpenCL events (no host copies, no launch overhead), both variants
round-robin, medians in ms; each output is checked against NumPy first.

    python bench/wide_tiles.py [--rounds 60] [--json bench/results/wide-tiles.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyopencl as cl

import kernelgen as kg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv1x1 import SHAPES  # noqa: E402

OLD_TILE = (4, 64)
MATMULS = ((128, 256, 1024, "BERT layer, FFN up"), (128, 1024, 256, "BERT layer, FFN down"),
           (128, 256, 768, "BERT layer, Q K V merged"), (128, 256, 256, "BERT layer, output"),
           (128, 768, 3072, "BERT-base, FFN up"), (384, 1024, 1024, "BERT-large, projection"))


class DeviceTimes:
    """Every kernel launch's OpenCL event while active: ``timed(f)`` calls ``f`` and returns
    the device milliseconds of the launches it made (the queue has profiling enabled)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._enqueue = cl.enqueue_nd_range_kernel

        def recorded(*args: Any, **kwargs: Any) -> Any:
            event = self._enqueue(*args, **kwargs)
            self.events.append(event)
            return event
        cl.enqueue_nd_range_kernel = recorded

    def timed(self, f: Callable[[], object]) -> float:
        self.events.clear()
        f()
        for e in self.events:
            e.wait()
        return sum(e.profile.end - e.profile.start for e in self.events) * 1e-6


def blocks(rng: np.random.Generator) -> list[tuple[str, kg.FusedOp, np.ndarray, np.ndarray]]:
    """(name, block, input, NumPy's output) of every block the wide tile takes."""
    out = []
    for c, m, side, stride, model in SHAPES:
        if -(-side // stride) < 28:
            continue
        x = rng.standard_normal((1, c, side, side)).astype(np.float32)
        w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
        conv = kg.conv(kg.tensor("x", x.shape), kg.constant("w", w), strides=[stride, stride])
        sub = x[:, :, ::stride, ::stride]
        ref = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], sub), 0)
        name = f"1x1 {c}->{m} @{side}" + (f" stride {stride}" if stride > 1 else "")
        out.append((f"{name} ({model})", kg.fuse(conv, kg.relu(conv)), x, ref))
    for m, k, n, model in MATMULS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
        biased = kg.add(mm, kg.constant("b", b))
        out.append((f"{m}x{k}x{n} ({model})", kg.fuse(mm, biased, kg.relu(biased)), x,
                    np.maximum(x @ w + b, 0)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    device = DeviceTimes()
    rows = []
    print(f"{'block':48s} {'4x64':>7s} {'default':>8s} {'tile':>6s} {'gain':>6s}")
    for name, fused, x, ref in blocks(np.random.default_rng(0)):
        default = fused.emit("opencl")
        tile = default.metadata["tunables"]["tile"]
        if tuple(tile) == OLD_TILE or tile[1] != OLD_TILE[1]:  # not a 6-row wide tile
            print(f"{name:48s} default tile {tile[0]}x{tile[1]}: not compared")
            continue
        kernels = {"default": default, "4x64": fused.emit("opencl", tile=OLD_TILE)}
        for kernel in kernels.values():
            np.testing.assert_allclose(kernel(x), ref, rtol=1e-3, atol=1e-3)
        times: dict[str, list[float]] = {label: [] for label in kernels}
        for _ in range(args.rounds):
            for label, kernel in kernels.items():
                times[label].append(device.timed(lambda k=kernel, x=x: k(x)))
        new, old = (float(np.median(times[label])) for label in ("default", "4x64"))
        rows.append({"block": name, "old_tile_ms": old, "default_ms": new,
                     "default_tile": list(tile), "gain": old / new})
        print(f"{name:48s} {old:7.3f} {new:8.3f} {tile[0]}x{tile[1]:<3d} {old / new:5.2f}x",
              flush=True)
    gains = [r["gain"] for r in rows]
    print(f"geometric mean gain {np.exp(np.mean(np.log(gains))):.2f}x over {len(gains)} blocks")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rounds": args.rounds,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
