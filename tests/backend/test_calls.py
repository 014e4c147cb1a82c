"""The call convention every executable shares, on every backend: inputs by position (in the
order the block was built) or by name, ``out=`` (checked, read-only refused before anything
runs, overlapping inputs handled), ``launch`` on device buffers, for a ``Kernel`` and a
``Program`` alike; and kernels called from several threads at once, for every kind that
launches more than once per call (a packing launch, a padded Program, Winograd, im2col)."""
from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from conftest import BACKENDS, assert_close, require

import kernelgen as kg
from kernelgen import backends
from kernelgen.exec import Kernel, Program

rng = np.random.default_rng(23)
EMITTED = [b for b in BACKENDS if b != "interp"]


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _matmul(m: int, k: int, n: int) -> kg.FusedOp:
    return kg.fuse(kg.matmul(kg.tensor("a", (m, k)), kg.tensor("b", (k, n))))


def _winograd_conv() -> tuple[kg.FusedOp, np.ndarray, np.ndarray, np.ndarray]:
    x, w = _f32(1, 3, 7, 9), _f32(5, 3, 3, 3)
    fused = kg.fuse(kg.conv(kg.tensor("x", x.shape), kg.tensor("w", w.shape), pads=[1] * 4))
    return fused, x, w, _conv_reference(x, w)


def _conv_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3, pads 1, stride 1, by NumPy."""
    n, c, h, wd = x.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,mc->nmhw", padded[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out.astype(np.float32)


# ---- inputs by position and by name -------------------------------------------------------------

@pytest.mark.parametrize("backend", EMITTED)
def test_inputs_by_name_in_any_order(backend: str) -> None:
    require(backend)
    x, b = _f32(6, 7), _f32(7)
    kernel = kg.fuse(kg.sub(kg.tensor("x", x.shape), kg.tensor("b", b.shape))).emit(backend)
    want = x - b
    assert_close(kernel(x, b), want)
    assert_close(kernel(b=b, x=x), want)
    assert_close(kernel(x, b=b), want)
    with pytest.raises(kg.ArgumentError, match="no input named 'c'; its inputs are x, b"):
        kernel(x, c=b)
    with pytest.raises(kg.ArgumentError, match="input 'x' given twice"):
        kernel(x, x=x)
    with pytest.raises(kg.ArgumentError, match="missing b"):
        kernel(x)
    with pytest.raises(kg.ArgumentError, match="input 'b' is None; expected a float32 array"):
        kernel(x, None)
    with pytest.raises(kg.ArgumentError, match="out= takes a NumPy array, or a tuple of 1"):
        kernel(x, b, out=[[0.0] * 7] * 6)


@pytest.mark.parametrize("backend", EMITTED)
def test_program_takes_the_arguments_a_kernel_takes(backend: str) -> None:
    """A Winograd conv is a Program: by name, out=, launch, like a Kernel."""
    require(backend)
    fused, x, w, want = _winograd_conv()
    program = fused.emit(backend, algorithm="winograd")
    assert isinstance(program, Program)
    assert_close(program(w=w, x=x), want, scale=10)
    out = np.full(want.shape, np.nan, np.float32)
    assert program(x, w, out=out) is out
    assert_close(out, want, scale=10)
    runtime = program.runtime
    result = runtime.device_empty(program.output)
    program.launch(runtime.device_array(x), runtime.device_array(w), result)
    got = np.empty(want.shape, np.float32)
    runtime.to_host(result, got)
    assert_close(got, want, scale=10)


@pytest.mark.parametrize("backend", EMITTED)
def test_read_only_out_is_refused_before_the_kernel_runs(backend: str) -> None:
    require(backend)
    x = _f32(4)
    out = np.zeros(4, np.float32)
    out.flags.writeable = False
    kernel = kg.fuse(kg.relu(kg.tensor("x", (4,)))).emit(backend)
    with pytest.raises(kg.ArgumentError, match="output 'relu_.*' is a read-only array"):
        kernel(x, out=out)
    assert not out.any()


@pytest.mark.parametrize("backend", EMITTED)
def test_out_overlapping_an_input(backend: str) -> None:
    """A MatMul written over its own left operand, and a shifted slice written over its input:
    the kernel must not read what it has already overwritten."""
    require(backend)
    a = _f32(16, 16)
    b = a + 1
    want = (a.astype(np.float64) @ b).astype(np.float32)
    kernel = _matmul(16, 16, 16).emit(backend)
    assert kernel(a, b, out=a) is a
    assert_close(a, want, scale=10)
    x = np.arange(64, dtype=np.float32)
    want_slice = x[1:].copy()
    shifted = kg.fuse(kg.slice(kg.tensor("x", (64,)), [1], [64], [0])).emit(backend)
    shifted(x, out=x[:63])
    assert_close(x[:63], want_slice)


def _require_padding() -> None:
    if not backends.get("opencl").caps.pads_aliased_rows:
        pytest.skip("padding aliased rows is a CPU rule (the OpenCL device is not a CPU)")


def test_a_padded_program_takes_out() -> None:
    """MatMul 8x1024x1024 on OpenCL is a Program (rows aliasing in L1 are padded; with 4 row
    tiles or more the right operand would be packed instead)."""
    require("opencl")
    _require_padding()
    a, b = _f32(8, 1024), _f32(1024, 1024)
    program = _matmul(8, 1024, 1024).emit("opencl", tuning="none")
    assert isinstance(program, Program)
    out = np.empty((8, 1024), np.float32)
    program(a, b, out=out)
    assert_close(out, (a.astype(np.float64) @ b).astype(np.float32), scale=100)


# ---- several threads, one kernel ----------------------------------------------------------------

@contextmanager
def _fast_switching() -> Iterator[None]:
    """Switch threads every microsecond, so a race shows within a few calls."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _hammer(call: Callable[[int], tuple[Any, np.ndarray]], threads: int = 4,
            calls: int = 6) -> None:
    """``calls`` calls of ``call(seed) -> (got, want)`` in each of ``threads`` threads; every
    result must match and no call may raise."""
    failures: list[str] = []

    def work(t: int) -> None:
        for i in range(calls):
            try:
                got, want = call(1000 * t + i)
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                failures.append(f"thread {t} call {i}: {type(exc).__name__}: {exc}"[:300])

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    with _fast_switching():
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert not failures, "\n".join(failures)


def _matmul_call(kernel: Any, m: int, k: int, n: int) -> Callable[[int], tuple[Any, np.ndarray]]:
    def call(seed: int) -> tuple[Any, np.ndarray]:
        r = np.random.default_rng(seed)
        a = r.standard_normal((m, k)).astype(np.float32)
        b = r.standard_normal((k, n)).astype(np.float32)
        return kernel(a, b), (a.astype(np.float64) @ b).astype(np.float32)
    return call


# backend -> options that make a contraction pack a panel in a separate launch or step
PACKED = {"opencl": {"pack": True, "pack_in_tile": False}, "neon": {"pack": True},
          "triton": {"pack": True}}


@pytest.mark.parametrize("backend", EMITTED)
def test_threads_share_a_packing_kernel(backend: str) -> None:
    require(backend)
    # without the runtime's lock, OpenCL gave 3-10 wrong results of 40 calls at this shape
    m, k, n = (9, 13, 10) if backend == "triton" else (64, 512, 130)
    kernel = _matmul(m, k, n).emit_kernel(backend, tuning="none", **PACKED[backend])
    assert isinstance(kernel, Kernel) and kernel.metadata["tunables"]["pack"] is True
    _hammer(_matmul_call(kernel, m, k, n), calls=3 if backend == "triton" else 10)


def test_threads_share_a_padded_program() -> None:
    require("opencl")
    _require_padding()
    program = _matmul(8, 1024, 1024).emit("opencl", tuning="none")
    assert isinstance(program, Program)
    _hammer(_matmul_call(program, 8, 1024, 1024), calls=2)


@pytest.mark.parametrize("backend", EMITTED)
@pytest.mark.parametrize("algorithm", ["winograd", "im2col"])
def test_threads_share_a_conv_program(backend: str, algorithm: str) -> None:
    require(backend)
    fused, _, w, _ = _winograd_conv()
    conv = fused.emit(backend, algorithm=algorithm)

    def call(seed: int) -> tuple[Any, np.ndarray]:
        x = np.random.default_rng(seed).standard_normal((1, 3, 7, 9)).astype(np.float32)
        return conv(x, w), _conv_reference(x, w)
    _hammer(call, calls=2 if backend == "triton" else 4)


@pytest.mark.parametrize("backend", EMITTED)
def test_threads_launch_one_kernel_on_device_buffers(backend: str) -> None:
    """``launch`` from several threads, each on its own buffers (the benchmarks' path)."""
    require(backend)
    m, k, n = (5, 7, 9) if backend == "triton" else (37, 129, 66)
    kernel = _matmul(m, k, n).emit_kernel(backend, tuning="none", **PACKED[backend])
    runtime = kernel.runtime

    def call(seed: int) -> tuple[Any, np.ndarray]:
        r = np.random.default_rng(seed)
        a = r.standard_normal((m, k)).astype(np.float32)
        b = r.standard_normal((k, n)).astype(np.float32)
        out = runtime.device_empty(kernel.loop.outputs[0])
        kernel.launch(runtime.device_array(a), runtime.device_array(b), out)
        got = np.empty((m, n), np.float32)
        runtime.to_host(out, got)
        return got, (a.astype(np.float64) @ b).astype(np.float32)
    _hammer(call, calls=3 if backend == "triton" else 6)


_WRONG_KINDS = [("tile", (4.5, 8)), ("tile", "ab"), ("tile", (4, None)), ("tile", (0, 8)),
                ("pack", "yes"), ("schedule", 3), ("local_size", 0)]


@pytest.mark.parametrize("backend,option,value", [
    (b, option, value) for b in EMITTED for option, value in _WRONG_KINDS
    if option != "local_size" or b == "opencl"])  # the others have no local_size
def test_emit_options_of_the_wrong_kind_are_refused(backend: str, option: str,
                                                    value: Any) -> None:
    """Checked before anything is printed: a float tile once printed C that did not build."""
    require(backend)
    with pytest.raises(ValueError, match=re.escape(f"{option}={value!r}: expected")):
        _matmul(5, 7, 3).emit(backend, tuning="none", **{option: value})
