"""Shared test setup: a per-run kernel cache, the backend fixture and tolerances.

PoCL reads its cache directory once, at the first ``get_platforms()``, so it is set here, at
import time, before any test touches OpenCL (TOOLCHAIN.md §3.3).
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_cache = os.environ.get("KERNELGEN_TEST_CACHE") or tempfile.mkdtemp(prefix="kernelgen-test-")
os.environ.setdefault("XDG_CACHE_HOME", _cache)
os.environ.setdefault("POCL_CACHE_DIR", str(Path(_cache) / "pocl"))
# Triton runs on CPU tensors through its interpreter in this process; the ahead-of-time CUDA
# compile check runs in a subprocess without it (one Triton mode per process, TOOLCHAIN.md §2).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kernelgen as kg  # noqa: E402

BACKENDS = ("interp", "opencl", "neon", "triton")


def _opencl_problem() -> str | None:
    try:
        from kernelgen.runtime.opencl import device
        device()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable device
        return f"OpenCL device unavailable (needs pyopencl + PoCL): {exc}"
    return None


def _neon_problem() -> str | None:
    try:
        from kernelgen.runtime.neon import toolchain
        toolchain()
    except Exception as exc:  # noqa: BLE001
        return f"NEON C unavailable (needs gcc, and SIMDe off ARM: pip install cmeel-simde): {exc}"
    return None


def _triton_problem() -> str | None:
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        return f"Triton unavailable (pip install triton torch==2.13.0): {exc}"
    return None


def _aarch64_problem() -> str | None:
    try:
        from kernelgen.runtime.aarch64 import tools
        tools()
    except kg.KernelgenError as exc:
        return f"AArch64 check unavailable: {exc}"
    return None


PROBLEMS = {"opencl": _opencl_problem, "neon": _neon_problem, "triton": _triton_problem,
            "aarch64": _aarch64_problem}


def backend_problem(name: str) -> str | None:
    """Why ``name`` cannot run here, or None. Cached per process."""
    if name not in _problem_cache:
        _problem_cache[name] = PROBLEMS[name]() if name in PROBLEMS else None
    return _problem_cache[name]


_problem_cache: dict[str, str | None] = {}


def require(name: str) -> None:
    """Skip (or, in CI with KERNELGEN_REQUIRE_BACKENDS=1, fail) when a backend's tool is
    missing; the message names the tool."""
    problem = backend_problem(name)
    if problem:
        if os.environ.get("KERNELGEN_REQUIRE_BACKENDS"):
            pytest.fail(problem)
        pytest.skip(problem)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every kernel test runs on the IR interpreter, OpenCL, NEON C and Triton."""
    require(request.param)
    return request.param


def prebuild_neon(request: pytest.FixtureRequest, blocks: Callable[[], list[kg.FusedOp]]
                  ) -> None:
    """Batch-compile the NEON kernels a module's tests will build, when NEON tests of that
    module are selected: one SIMDe parse per 80 kernels instead of one per kernel."""
    module = request.node.nodeid
    if backend_problem("neon") or not any(
            item.nodeid.startswith(module) and "neon" in item.nodeid
            for item in request.session.items):
        return
    from kernelgen.emit.neon import emit_neon
    from kernelgen.runtime.neon import build_kernels

    sources = []
    for block in blocks():
        try:
            sources.append(emit_neon(block.lower())[0])
        except kg.KernelgenError:
            continue  # the test itself reports it
    for start in range(0, len(sources), 80):
        build_kernels(sources[start:start + 80])


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
