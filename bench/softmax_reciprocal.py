"""Softmax multiplying its exps by the sum's reciprocal, one division a row
(``ops/reduce.py: softmax``), against the division per element before: the pattern suite's
masked softmax rows and its fused attention (``bench/patterns.py``), both built in one process,
checked against NumPy, and their kernels' device times (OpenCL events) taken round-robin;
medians in ms.

    python bench/softmax_reciprocal.py [--rounds 60] [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np

import kernelgen as kg
from kernelgen.ir.expr import call
from kernelgen.ops import reduce
from kernelgen.ops.common import check_value, make_op, normalize_axis
from kernelgen.measure import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import patterns  # noqa: E402
from pooling import compared_row, write_rows  # noqa: E402
from wide_tiles import DeviceTimes  # noqa: E402

LABELS = ("now", "before")


def _dividing_softmax(x: kg.Value, axis: int = -1) -> kg.Op:
    """Softmax as it was: each exp divided by the row's sum."""
    x = check_value("Softmax", x, "input")
    here, peak, total = reduce._softmax_parts(x, normalize_axis("Softmax", x, axis))
    body = call("div", call("exp", call("sub", here, peak)), total)
    return make_op("Softmax", [x], x.shape, x.dtype, body, {"axis": axis})


@contextlib.contextmanager
def before() -> Iterator[None]:
    with mock.patch.object(kg, "softmax", _dividing_softmax):
        yield


def _numpy(p: patterns.Pattern) -> np.ndarray:
    """The pattern's output by NumPy, from its ONNX nodes' meaning."""
    a = p.arrays
    if p.family == "softmax":
        z = a["x"] * a["s"] + a["mask"]
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    scores = np.einsum("hid,hjd->hij", a["q"], a["k"]) * a["s"]
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("hij,hjd->hid", e / e.sum(-1, keepdims=True), a["v"])


BUILDERS: list[Callable[[], patterns.Pattern]] = [
    lambda: patterns.masked_softmax(4096, 1024), lambda: patterns.masked_softmax(12 * 128, 128),
    lambda: patterns.masked_softmax(1024, 4096), lambda: patterns.attention(8, 256, 64),
    lambda: patterns.attention(12, 128, 64), lambda: patterns.attention(4, 512, 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    device = DeviceTimes()
    rows: list[dict[str, object]] = []
    for build in BUILDERS:
        p = build()
        with before():
            old_p = build()
        kernels = {"now": kg.fuse(*p.ops, force=True).emit("opencl"),
                   "before": kg.fuse(*old_p.ops, force=True).emit("opencl")}
        assert kernels["now"].source != kernels["before"].source, p.label
        want = _numpy(p)
        runs = {}
        for label, k in kernels.items():
            inputs = [p.arrays[a["name"]] for a in k.metadata["args"] if a["role"] == "input"]
            np.testing.assert_allclose(k(*inputs), want, rtol=2e-4, atol=2e-6)
            runs[label] = runner(k, *inputs)
        rows.append(compared_row(p.label, runs, LABELS, args.rounds, device))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
