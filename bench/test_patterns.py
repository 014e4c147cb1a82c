"""pytest-benchmark view of bench/patterns.py (``./run bench`` or ``pytest bench
--benchmark-only``): the first shape of each pattern, kernelgen on OpenCL and onnxruntime, each
its own benchmark. The script prints the ratios and the copy-bandwidth fractions."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from patterns import PATTERNS, ort_runner  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.measure import runner  # noqa: E402


@pytest.mark.parametrize("family", sorted(PATTERNS))
def test_kernelgen(benchmark, family: str) -> None:
    p = PATTERNS[family][0]()
    fused = kg.fuse(*p.ops, force=True)
    kernel = fused.emit("opencl")
    arrays = [p.arrays.get(v.name, kernel.constants.get(v.name)) for v in fused.inputs]
    _, want = ort_runner(p)
    np.testing.assert_allclose(kernel(*arrays), want, rtol=2e-4, atol=2e-5)
    benchmark(runner(kernel, *arrays))


@pytest.mark.parametrize("family", sorted(PATTERNS))
def test_onnxruntime(benchmark, family: str) -> None:
    run, _ = ort_runner(PATTERNS[family][0]())
    benchmark(run)
