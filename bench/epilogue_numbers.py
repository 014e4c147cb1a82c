"""Epilogues by numbers, one process: MobileNetV2's 1x1 convolutions with their BatchNormalization
and Clip (ReLU6) fused, compiled as now and as before three changes (``before()``):

- a single-element constant (Clip's bounds, a scale) is read as a literal of the fused body, not
  as a kernel argument (``fusion.fuse._number``);
- Max and Min by a number other than NaN are one ordered compare and a select
  (``backends.printer.spelling``), not a compare, a NaN test, their or and a select;
- BatchNormalization by constants computes x s + t as one multiply-add (``muladd``).

Each block is checked against NumPy, then both are timed round-robin (``bench_interleaved``,
medians of wall times, launch included); with ``--models``, each model's DNNFusion plan compiled
both ways, whole runs of both round-robin and the summed device times of their kernels.

    python bench/epilogue_numbers.py [--repeat 100] [--models mobilenet_v2_112 [--no-blocks]] \
        [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernelgen as kg  # noqa: E402
from kernelgen.backends.c import emitter, vector  # noqa: E402
from kernelgen.cli.model import _feeds  # noqa: E402
from kernelgen.graph.scheduling import whole_runs  # noqa: E402
from kernelgen.ir import expr  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402
from kernelgen.ops import nn  # noqa: E402
from against_commit import model  # noqa: E402
from pooling import gain_line, write_rows  # noqa: E402
from wide_tiles import DeviceTimes  # noqa: E402

LABELS = ("now", "before")
# (input channels, output channels, map side): MobileNetV2's at 112x112, then two of 224x224
SHAPES = ((16, 96, 56), (96, 24, 28), (24, 144, 28), (144, 24, 28), (144, 32, 14),
          (32, 192, 14), (192, 32, 14), (64, 384, 14), (960, 160, 7))
FUSE = sys.modules["kernelgen.fusion.fuse"]  # the module (kernelgen.fusion.fuse is the function)


def _apart(fn: str, *args: Any, **kwargs: Any) -> Any:
    """``expr.call``, with a multiply-add built as a multiply and an add."""
    if fn == "muladd":
        return expr.call("add", expr.call("mul", args[0], args[1]), args[2])
    return expr.call(fn, *args, **kwargs)


@contextlib.contextmanager
def before() -> Iterator[None]:
    """The three changes switched off: constants as arguments, Max/Min in their NaN-testing
    form whatever the operand, BatchNormalization's multiply and add apart."""
    with mock.patch.object(FUSE, "_number", lambda value, reader: None), \
            mock.patch.object(emitter, "spelling", lambda node, table: node.fn), \
            mock.patch.object(vector, "spelling", lambda node, table: node.fn), \
            mock.patch.object(nn, "call", _apart):
        yield


def block(c: int, m: int, side: int, rng: np.random.Generator
          ) -> tuple[kg.FusedOp, np.ndarray, np.ndarray]:
    """conv 1x1 -> BatchNormalization -> Clip(0, 6) by constants, an input, NumPy's output."""
    x = rng.standard_normal((1, c, side, side)).astype(np.float32)
    w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    gamma, var = (rng.uniform(0.5, 1.5, m).astype(np.float32) for _ in range(2))
    beta, mean = (rng.standard_normal(m).astype(np.float32) * 0.1 for _ in range(2))
    conv = kg.conv(kg.tensor("x", x.shape), kg.constant("w", w))
    bn = kg.batch_normalization(conv, *(kg.constant(n, a) for n, a in
                                        (("gamma", gamma), ("beta", beta), ("mean", mean),
                                         ("var", var))))
    clip = kg.clip(bn, kg.constant("lo", np.float32(0)), kg.constant("hi", np.float32(6)))
    per = (-1, 1, 1)
    want = np.clip((np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) - mean.reshape(per))
                   / np.sqrt(var.reshape(per) + 1e-5) * gamma.reshape(per)
                   + beta.reshape(per), 0, 6)
    return kg.fuse(conv, bn, clip), x, want


def blocks(repeat: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for seed, (c, m, side) in enumerate(SHAPES):  # both ways from the same weights and input
        with before():
            fused, x, want = block(c, m, side, np.random.default_rng(seed))
            old = fused.emit("opencl")
        new = block(c, m, side, np.random.default_rng(seed))[0].emit("opencl")
        for k in (old, new):
            np.testing.assert_allclose(k(x), want, rtol=1e-4, atol=1e-4)
        assert "lo[0]" in old.source and "lo[0]" not in new.source
        timed = bench_interleaved({"now": (new, [x]), "before": (old, [x])}, repeat=repeat)
        ms = {label: timed[label].median_ms for label in LABELS}
        name = f"1x1 {c}->{m} @{side} + BN + Clip"
        print(gain_line(name, ms, LABELS), flush=True)
        rows.append({"block": name, **{f"{k}_ms": v for k, v in ms.items()},
                     "gain": ms["before"] / ms["now"]})
    return rows


def models_both_ways(name: str, rounds: int) -> dict[str, object]:
    """The model ``name`` (``against_commit.model``: mobilenet_v2[_SIZE], bert_layer, a light
    model) compiled now and ``before()``: whole runs of both round-robin, and the summed
    device times of their kernels (OpenCL events) in rounds of one run of each, which the
    launches' and the host's noise leaves out."""
    proto, shapes = model(name)
    now = kg.compile_model(proto, backend="opencl", fusion="dnnfusion", input_shapes=shapes)
    with before():
        old = kg.compile_model(proto, backend="opencl", fusion="dnnfusion", input_shapes=shapes)
    wall = whole_runs({"now": now.model, "before": old.model}, rounds=rounds)
    feeds = _feeds(now.graph, None)
    device = DeviceTimes()
    sums: dict[str, list[float]] = {label: [] for label in LABELS}
    for _ in range(rounds):
        for label, session in (("now", now), ("before", old)):
            sums[label].append(device.timed(partial(session.run, None, feeds)))
    kernels = {label: float(np.median(t)) for label, t in sums.items()}
    print(gain_line(f"{name}, whole runs", wall, LABELS), flush=True)
    print(gain_line(f"{name}, its kernels' device times", kernels, LABELS), flush=True)
    return {"model": name, **{f"{k}_ms": v for k, v in wall.items()},
            "gain": wall["before"] / wall["now"],
            **{f"{k}_kernels_ms": v for k, v in kernels.items()},
            "kernels_gain": kernels["before"] / kernels["now"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--models", default="", help="e.g. mobilenet_v2_112,bert_layer: whole runs "
                    "both ways (against_commit.model's names)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-blocks", action="store_true", help="the models only")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [] if args.no_blocks else blocks(args.repeat)
    rows += [models_both_ways(name, args.rounds) for name in filter(None, args.models.split(","))]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
