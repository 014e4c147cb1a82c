"""How many output rows a work-item of OpenCL's 'window' schedule should own: MobileNetV2's
depthwise convolutions (ReLU6 read in, 3x3, bias), every valid ``window_rows`` emitted and
timed round-robin in one process, with the default (``backends/opencl/window.py``) and the
rule it replaced (the largest divisor of the output height up to 4) named per shape. Each
sample is 20 launches queued back to back, then one wait; the table gives medians over the
rounds. Every variant's output is checked against the first's.

    python bench/window_rows.py [--rounds 9] [--shapes 576x14x2,960x7x1] \
        [--json bench/results/window-rows.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl.window import WINDOW_ROWS, opencl_window

# (channels, input side, stride): MobileNetV2's at 224x224, and one 128-channel map at 56
SHAPES = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
          (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1), (128, 56, 1)]
QUEUED = 20


def measure(c: int, hw: int, stride: int, rounds: int) -> dict[str, object]:
    rng = np.random.default_rng(c + hw + stride)
    x = kg.tensor("x", (1, c, hw, hw))
    six = kg.clip(x, 0.0, 6.0)
    conv = kg.conv(six, kg.tensor("w", (c, 1, 3, 3)), kg.tensor("b", (c,)), pads=[1, 1, 1, 1],
                   strides=[stride, stride], group=c)
    fused = kg.fuse(six, conv)
    arrays = [4 * rng.standard_normal((1, c, hw, hw)).astype(np.float32),
              (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32),
              rng.standard_normal(c).astype(np.float32)]
    plan = opencl_window(fused.lower(), backends.get("opencl").caps.vector_widths)
    assert plan is not None, "not a 'window' block on this device"
    kernels = {r: fused.emit("opencl", tuning="none", schedule="window", window_rows=r)
               for r in plan.row_choices}
    want = kernels[plan.row_choices[0]](*arrays)
    handles = {}
    for r, k in kernels.items():
        np.testing.assert_allclose(k(*arrays), want, rtol=1e-5, atol=1e-5)
        handles[r] = [k.runtime.device_array(a) for a in arrays] + \
            [k.runtime.device_empty(k.loop.outputs[0])]
    times: dict[int, list[float]] = {r: [] for r in kernels}
    for _ in range(rounds):
        for r, k in kernels.items():
            k.launch(*handles[r])
            t0 = time.perf_counter()
            for _ in range(QUEUED):
                k.launch(*handles[r], wait=False)
            k.runtime.sync()
            times[r].append((time.perf_counter() - t0) / QUEUED * 1e3)
    ms = {r: round(float(np.median(t)), 3) for r, t in times.items()}
    old = max(r for r in plan.row_choices if r <= WINDOW_ROWS)
    default = plan.default_rows(backends.get("opencl").caps)
    row = {"block": f"{c}x{hw}x{hw} stride {stride}", "default": default,
           "before": old, "ms": ms, "before_over_default": round(ms[old] / ms[default],
                                                                 2)}
    print(f"{row['block']}: default {default} rows {ms[default]} ms, "
          f"before {old} rows {ms[old]} ms (x{row['before_over_default']}); "
          + ", ".join(f"{r}: {t}" for r, t in ms.items()), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shapes", default=None,
                        help="channels x input side x stride, comma-separated (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    shapes = SHAPES if args.shapes is None else \
        [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [measure(*shape, args.rounds) for shape in shapes]
    if args.json:
        args.json.write_text(json.dumps({"device": backends.get("opencl").device_identity(),
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
