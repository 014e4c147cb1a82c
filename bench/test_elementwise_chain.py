"""pytest-benchmark view of the fused-chain benchmark, per backend: ``./run bench`` or
``pytest bench --benchmark-only``. The plain script bench/elementwise_chain.py prints the ratios
(interleaved rounds); here each variant is its own benchmark."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chains import elementwise_chain, inputs, numpy_chain  # noqa: E402
from elementwise_chain import timeable_backends  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.compile import copy_kernel, unfused  # noqa: E402
from kernelgen.measure import runner  # noqa: E402


@pytest.fixture(scope="module")
def chain():
    values, ops = elementwise_chain()
    return values, ops, inputs(values)


@pytest.mark.parametrize("backend", timeable_backends())
def test_fused(benchmark, chain, backend: str) -> None:
    _, ops, arrays = chain
    kernel = kg.fuse(*ops).emit(backend)
    benchmark(runner(kernel, *(arrays[b.name] for b in kernel.loop.inputs)))


@pytest.mark.parametrize("backend", timeable_backends())
def test_unfused(benchmark, chain, backend: str) -> None:
    _, ops, arrays = chain
    benchmark(runner(unfused(ops, backend), arrays["x"], arrays["scale"], arrays["shift"]))


@pytest.mark.parametrize("backend", timeable_backends())
def test_copy(benchmark, chain, backend: str) -> None:
    _, _, arrays = chain
    benchmark(runner(copy_kernel(arrays["x"].shape, backend=backend), arrays["x"]))


def test_numpy(benchmark, chain) -> None:
    _, _, arrays = chain
    out = np.empty_like(arrays["x"])
    benchmark(numpy_chain, arrays["x"], arrays["scale"], arrays["shift"], out)
