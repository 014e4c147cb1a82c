"""Waiting for brief kernels by polling (``backends/opencl/waiting.py``) against sleeping in
``clFinish`` for every wait, as before: one fused kernel launched and waited for (on
device-resident buffers, as ``kg.bench`` and ``bench/patterns.py`` time them) and called on
NumPy arrays, from the pattern suite's shapes that ran at PoCL's launch floor to longer kernels
that must not lose by the rule. The two ways run in blocks of ``--block`` back-to-back calls
(the state a loop of calls leaves the threads in is what is measured), alternating over
``--rounds`` rounds; the table gives the median of the blocks' mean times. Each output is
checked against NumPy first.

    python bench/brief_waits.py [--rounds 30] [--block 20] [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl import waiting

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import gain_line, write_rows  # noqa: E402

LABELS = ("polled", "slept")
Block = tuple[str, kg.FusedOp, list[np.ndarray], np.ndarray]


def blocks(rng: np.random.Generator) -> list[Block]:
    """(name, fused block, inputs, NumPy's output) from the pattern suite and beyond."""
    out: list[Block] = []
    for c, hw in ((116, 28), (232, 14), (464, 7)):
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        r1 = kg.reshape(kg.tensor("x", x.shape), (1, 2, c // 2, hw, hw))
        t = kg.transpose(r1, (0, 2, 1, 3, 4))
        r2 = kg.reshape(t, x.shape)
        want = x.reshape(2, c // 2, hw, hw).transpose(1, 0, 2, 3).reshape(x.shape)
        out.append((f"channel shuffle {c}x{hw}x{hw}", kg.fuse(r1, t, r2), [x], want))
    for c, hw in ((2048, 7), (512, 28), (256, 56)):
        x, y = (rng.standard_normal((1, c, hw, hw)).astype(np.float32) for _ in range(2))
        a = kg.add(kg.tensor("x", x.shape), kg.tensor("y", y.shape))
        out.append((f"relu(x + y) {c}x{hw}x{hw}", kg.fuse(a, kg.relu(a)), [x, y],
                    np.maximum(x + y, 0)))
    for c, hw in ((672, 14), (144, 56)):
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        g = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
        sg = kg.sigmoid(kg.tensor("g", g.shape))
        out.append((f"x * sigmoid(s) {c}x{hw}x{hw}", kg.fuse(sg, kg.mul(kg.tensor("x", x.shape),
                                                                       sg)),
                    [x, g], x / (1 + np.exp(-g))))
    m, k, n = 256, 512, 512
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    mm = kg.matmul(kg.tensor("a", a.shape), kg.tensor("b", b.shape))
    out.append((f"matmul {m}x{k}x{n}", kg.fuse(mm), [a, b], a @ b))
    return out


def timed(calls: dict[str, Callable[[], object]], rounds: int, block: int
          ) -> dict[str, float]:
    """The median over ``rounds`` of each call's mean time (ms) in a block of ``block`` calls
    after one untimed; the calls' blocks alternate."""
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            call()
            start = time.perf_counter()
            for _ in range(block):
                call()
            times[label].append((time.perf_counter() - start) / block * 1e3)
    return {label: float(np.median(t)) for label, t in times.items()}


def ways(call: Callable[[], object]) -> dict[str, Callable[[], object]]:
    """``call`` as it runs now, and with every wait sleeping (no kernel counts as brief)."""
    def slept() -> object:
        with mock.patch.object(waiting, "POLL_BELOW_S", 0.0):
            return call()
    return {"polled": call, "slept": slept}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    for name, fused, arrays, want in blocks(np.random.default_rng(0)):
        kernel = fused.emit("opencl")
        np.testing.assert_allclose(kernel(*arrays), want, rtol=1e-4, atol=1e-4)
        rt = kernel.runtime
        handles = [rt.device_array(a) for a in arrays] + \
            [rt.device_empty(b) for b in kernel.loop.outputs]
        launched = timed(ways(partial(kernel.launch, *handles)), args.rounds, args.block)
        called = timed(ways(partial(kernel, *arrays)), args.rounds, args.block)
        print(gain_line(f"{name}, launch and wait", launched, LABELS), flush=True)
        print(gain_line(f"{name}, call on NumPy arrays", called, LABELS), flush=True)
        rows.append({"block": name, **{f"launch_{k}_ms": v for k, v in launched.items()},
                     **{f"call_{k}_ms": v for k, v in called.items()},
                     "launch_gain": launched["slept"] / launched["polled"],
                     "call_gain": called["slept"] / called["polled"]})
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
