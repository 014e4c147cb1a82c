"""Shared test setup: a per-run kernel cache, the backend fixture and tolerances.

PoCL reads its cache directory once, at the first ``get_platforms()``, so it is set here, at
import time, before any test touches OpenCL (TOOLCHAIN.md §3.3).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

_cache = os.environ.get("KERNELGEN_TEST_CACHE") or tempfile.mkdtemp(prefix="kernelgen-test-")
os.environ.setdefault("XDG_CACHE_HOME", _cache)
os.environ.setdefault("POCL_CACHE_DIR", str(Path(_cache) / "pocl"))
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kernelgen as kg  # noqa: E402

BACKENDS = ("interp", "opencl")


def _opencl_problem() -> str | None:
    try:
        from kernelgen.runtime.opencl import device
        device()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable device
        return f"OpenCL device unavailable (needs pyopencl + PoCL): {exc}"
    return None


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every kernel test runs on the IR interpreter and on OpenCL. CI sets
    KERNELGEN_REQUIRE_OPENCL=1 so a missing device fails instead of skipping."""
    if request.param == "opencl":
        problem = _opencl_problem()
        if problem:
            if os.environ.get("KERNELGEN_REQUIRE_OPENCL"):
                pytest.fail(problem)
            pytest.skip(problem)
    return request.param


def run(backend: str, fused: kg.FusedOp, *arrays: np.ndarray, **options) -> tuple[np.ndarray, ...]:
    """Run a fused operator on ``backend``; inputs in ``fused.inputs`` order."""
    if backend == "interp":
        return kg.interpret(fused.lower(), *arrays)
    out = fused.emit(backend, **options)(*arrays)
    return out if isinstance(out, tuple) else (out,)


def tolerance(dtype: np.dtype | str) -> dict[str, float]:
    dt = np.dtype(dtype)
    if dt == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if dt == np.float32:
        return {"rtol": 2e-5, "atol": 2e-6}
    if dt == np.float64:
        return {"rtol": 1e-12, "atol": 1e-12}
    return {"rtol": 0, "atol": 0}


def assert_close(got: np.ndarray, want: np.ndarray, dtype: np.dtype | str | None = None,
                 scale: float = 1.0) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != expected {want.shape}"
    tol = tolerance(dtype or want.dtype)
    if want.dtype == bool or np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=tol["rtol"] * scale, atol=tol["atol"] * scale,
                                   equal_nan=True)
