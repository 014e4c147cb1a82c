"""Max and Min by a number on OpenCL spelt with the number first (``{1} > {0} ? {1} : {0}``,
one maxps on x86; by 0, then + 0: ``backends/opencl/language.py``) against the spelling before
(``{0} <= {1} ? {1} : {0}``, a compare and a blend): blocks whose ReLU or ReLU6 is read in
(MobileNetV2's strided depthwise convs of the pattern suite, a pooling window) or written out
(a residual add, a transposed bias add, 1x1 convs with BatchNormalization), both compiled in
one process, checked against NumPy, and their kernels' device times (OpenCL events) taken
round-robin; medians in ms.

    python bench/minmax_spelling.py [--rounds 60] [--json FILE]
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
from kernelgen.backends import printer
from kernelgen.backends.c import emitter, vector
from kernelgen.backends.opencl import language
from kernelgen.measure import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import compared_row, write_rows  # noqa: E402
from wide_tiles import DeviceTimes  # noqa: E402

LABELS = ("now", "before")
OLD = {"max_number": "(({0} <= {1}) ? {1} : {0})", "min_number": "(({0} >= {1}) ? {1} : {0})"}


def _old_spelling(node: printer.Call, table: object) -> str:
    """The rule before: ``max_number`` / ``min_number`` by any number but NaN, zero too."""
    key = printer.spelling(node, table)
    return {"max_zero": "max_number", "min_zero": "min_number"}.get(key, key)


@contextlib.contextmanager
def before() -> Iterator[None]:
    """OpenCL's Max and Min by a number spelt as before this change."""
    tables = [language.FLOAT, language.VECTOR.functions]
    with contextlib.ExitStack() as stack:
        for table in tables:
            stack.enter_context(mock.patch.dict(table, OLD))
        stack.enter_context(mock.patch.object(emitter, "spelling", _old_spelling))
        stack.enter_context(mock.patch.object(vector, "spelling", _old_spelling))
        language.vector_syntax.cache_clear()  # its tables are copies of FLOAT
        try:
            yield
        finally:
            language.vector_syntax.cache_clear()


Block = tuple[str, Callable[[], kg.FusedOp], list[np.ndarray], np.ndarray]


def blocks(rng: np.random.Generator) -> list[Block]:
    """(name, the block's builder, its inputs, NumPy's output)."""
    out: list[Block] = []
    for c, side in ((96, 112), (144, 56), (576, 14)):
        x = 4 * rng.standard_normal((1, c, side, side)).astype(np.float32)
        w = (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)
        six = np.pad(np.clip(x, 0, 6), ((0, 0), (0, 0), (1, 1), (1, 1)))
        want = sum(w[None, :, 0, i, j, None, None] * six[:, :, i:i + side:2, j:j + side:2]
                   for i in range(3) for j in range(3))

        def depthwise(c: int = c, side: int = side, w: np.ndarray = w) -> kg.FusedOp:
            clipped = kg.clip(kg.tensor("x", (1, c, side, side)), 0.0, 6.0)
            conv = kg.conv(clipped, kg.constant("w", w), pads=[1, 1, 1, 1], strides=[2, 2],
                           group=c)
            return kg.fuse(clipped, conv)
        out.append((f"depthwise 3x3/2 of relu6, {c}x{side}x{side}", depthwise, [x], want))
    x = rng.standard_normal((1, 64, 112, 112)).astype(np.float32)
    relu = np.pad(np.maximum(x, 0), ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    pooled = np.max([relu[:, :, i:i + 111:2, j:j + 111:2] for i in range(3) for j in range(3)],
                    axis=0)

    def pool(shape: tuple[int, ...] = x.shape) -> kg.FusedOp:
        r = kg.relu(kg.tensor("x", shape))
        return kg.fuse(r, kg.max_pool(r, [3, 3], strides=[2, 2], pads=[0, 0, 1, 1]))
    out.append(("maxpool 3x3/2 of relu, 64x112x112", pool, [x], pooled))
    a, b = (rng.standard_normal((1, 256, 56, 56)).astype(np.float32) for _ in range(2))

    def residual() -> kg.FusedOp:
        total = kg.add(kg.tensor("a", a.shape), kg.tensor("b", b.shape))
        return kg.fuse(total, kg.relu(total))
    out.append(("relu(x + y), 256x56x56", residual, [a, b], np.maximum(a + b, 0)))
    t = rng.standard_normal((3072, 768)).astype(np.float32)
    bias = rng.standard_normal(768).astype(np.float32)

    def transposed() -> kg.FusedOp:
        tr = kg.transpose(kg.tensor("x", t.shape), (1, 0))
        biased = kg.add(tr, kg.tensor("b", (768, 1)))
        return kg.fuse(tr, biased, kg.relu(biased))
    out.append(("relu(transpose(x) + b), 3072x768", transposed, [t, bias.reshape(768, 1)],
                np.maximum(t.T + bias[:, None], 0)))
    for c, m, side in ((16, 96, 56), (24, 144, 28)):
        x = rng.standard_normal((1, c, side, side)).astype(np.float32)
        w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
        scale, shift = rng.uniform(0.5, 1.5, m).astype(np.float32), \
            rng.standard_normal(m).astype(np.float32)
        want = np.clip(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) * scale[:, None, None]
                       + shift[:, None, None], 0, 6)

        def conv(x: np.ndarray = x, w: np.ndarray = w, scale: np.ndarray = scale,
                 shift: np.ndarray = shift) -> kg.FusedOp:
            y = kg.conv(kg.tensor("x", x.shape), kg.constant("w", w))
            bn = kg.batch_normalization(
                y, kg.constant("gamma", scale), kg.constant("beta", shift),
                kg.constant("mean", np.zeros_like(scale)), kg.constant("var", np.ones_like(scale)),
                epsilon=0.0)
            return kg.fuse(y, bn, kg.clip(bn, 0.0, 6.0))
        out.append((f"1x1 {c}->{m} @{side} + BN + ReLU6", conv, [x], want))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    device = DeviceTimes()
    rows: list[dict[str, object]] = []
    for name, build, arrays, want in blocks(np.random.default_rng(0)):
        now = build().emit("opencl", tuning="none")
        with before():
            old = build().emit("opencl", tuning="none")
        assert old.source != now.source, name
        kernels = {"now": now, "before": old}
        for k in kernels.values():
            np.testing.assert_allclose(k(*arrays), want, rtol=1e-4, atol=1e-4)
        runs = {label: runner(k, *arrays) for label, k in kernels.items()}
        rows.append(compared_row(name, runs, LABELS, args.rounds, device))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
