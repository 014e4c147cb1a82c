"""The operator chains the benchmarks time, shared by the script and the pytest-benchmark file."""
from __future__ import annotations

import numpy as np

import kernelgen as kg

N = 4096  # 4096 x 4096 = 16M float32 = 64 MiB in, 64 MiB out


def elementwise_chain(n: int = N) -> tuple[list[kg.Value], list[kg.Op]]:
    """scale, shift, ReLU, re-centre, clip: five elementwise operators, two broadcast vectors."""
    x, scale, shift = kg.tensor("x", (n, n)), kg.tensor("scale", (n,)), kg.tensor("shift", (n,))
    a = kg.mul(x, scale)
    b = kg.add(a, shift)
    c = kg.relu(b)
    d = kg.sub(c, shift)
    e = kg.clip(d, -1.0, 6.0)
    return [x, scale, shift], [a, b, c, d, e]


def numpy_chain(x: np.ndarray, scale: np.ndarray, shift: np.ndarray, out: np.ndarray) -> None:
    """The same five operators in NumPy, one pass each, into a preallocated output."""
    np.multiply(x, scale, out=out)
    np.add(out, shift, out=out)
    np.maximum(out, 0, out=out)
    np.subtract(out, shift, out=out)
    np.clip(out, -1.0, 6.0, out=out)


def inputs(values: list[kg.Value], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in values}
