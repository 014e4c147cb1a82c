"""pytest-benchmark view of the fused-chain benchmark: ``./run bench`` or
``pytest bench --benchmark-only``. The plain script bench/elementwise_chain.py prints the ratios."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chains import elementwise_chain, inputs, numpy_chain  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.measure import copy_kernel, runner, unfused  # noqa: E402


@pytest.fixture(scope="module")
def chain():
    values, ops = elementwise_chain()
    return values, ops, inputs(values)


def test_fused(benchmark, chain) -> None:
    _, ops, arrays = chain
    kernel = kg.fuse(*ops).emit("opencl")
    benchmark(runner(kernel, *(arrays[b.name] for b in kernel.loop.inputs)))


def test_unfused(benchmark, chain) -> None:
    _, ops, arrays = chain
    benchmark(runner(unfused(ops), arrays["x"], arrays["scale"], arrays["shift"]))


def test_copy(benchmark, chain) -> None:
    _, _, arrays = chain
    copy = copy_kernel(arrays["x"].shape)
    benchmark(runner(copy, arrays["x"]))


def test_numpy(benchmark, chain) -> None:
    _, _, arrays = chain
    out = np.empty_like(arrays["x"])
    benchmark(numpy_chain, arrays["x"], arrays["scale"], arrays["shift"], out)
