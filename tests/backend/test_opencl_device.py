"""The OpenCL device layer on a real device: choosing it by name, what is read and probed from
it, a kernel's own work-group limit, calls that use host memory in place, and constants that
need not be passed."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import probe
from kernelgen.backends.opencl.runtime import device


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_an_unknown_device_name_lists_the_devices() -> None:
    require("opencl")
    done = _python("import kernelgen as kg; kg.fuse(kg.relu(kg.tensor('x', (3,))))"
                   ".emit('opencl')(__import__('numpy').ones(3, 'f4'))",
                   KERNELGEN_OPENCL_DEVICE="no such device")
    assert done.returncode != 0
    assert "KERNELGEN_OPENCL_DEVICE='no such device' names no OpenCL device" in done.stderr
    assert "devices:" in done.stderr


def test_devices_command_lists_and_describes() -> None:
    require("opencl")
    done = subprocess.run([sys.executable, "-m", "kernelgen", "devices"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "kernelgen uses:" in done.stdout and "work-groups <=" in done.stdout


def test_device_info_is_read_and_probed() -> None:
    require("opencl")
    info = device().info
    assert info.max_work_group >= 1 and info.local_memory > 0 and info.compute_units >= 1
    assert info.vector_widths and 4 in info.vector_widths, info  # every device builds float4
    assert list(info.vector_widths) == sorted(info.vector_widths, reverse=True)
    assert backends.get("opencl").caps.vector_widths == info.vector_widths or \
        info.kind != "cpu"


def test_the_probe_catches_wrong_lanes() -> None:
    """The probe runs each width's kernel on the device and compares it with NumPy: the
    widths this device builds pass, and the same kernel with its deinterleaved lanes (a
    stride-2 read's even lanes) picked in a wrong order fails, as pip's PoCL 3.0 computed
    ``vload16(p).even`` on a Zen 4 (garbage in lanes 4-7)."""
    require("opencl")
    import pyopencl as cl
    dev = device().device
    for width in device().info.vector_widths:
        assert probe.check(cl, dev, width) is None, width
        right = probe.source(width)
        assert "a.s2" in right
        wrong = right.replace("a.s0, a.s2", "a.s2, a.s0", 1)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(probe, "source", lambda w, text=wrong: text)
            assert "wrong values" in (probe.check(cl, dev, width) or "")


def test_the_probe_builds_widths_together_and_alone_where_one_fails() -> None:
    """The widths' kernels are built as one program (one build); where one width's kernel
    does not build, the others are built alone and still pass, and only it fails."""
    require("opencl")
    import pyopencl as cl
    dev, widths = device().device, device().info.vector_widths
    assert probe.check_together(cl, dev, widths) == dict.fromkeys(widths)
    right = probe.source
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probe, "source", lambda w: right(w).replace(
            "vstore", "no_such_function" if w == widths[-1] else "vstore", 1))
        report = probe.check_together(cl, dev, widths)
    assert all(report[w] is None for w in widths[:-1]), report
    assert report[widths[-1]], report


def test_code_with_vectors_the_device_rejects_is_refused_by_name() -> None:
    """A kernel generated for a declared CPU (``cpu-avx512``: float16 tiles) and run on a
    device whose probe rejected float16 is refused with an error naming the kernel, the
    width and the widths the device builds, before its compiler sees it (pip's PoCL 3.0
    aborted the process there). The same kernel runs on a device that builds float16."""
    require("opencl")
    from kernelgen.backends.opencl import runtime
    avx512 = backends.REGISTRY["opencl"].for_device("cpu-avx512")  # type: ignore[attr-defined]
    rng = np.random.default_rng(16)
    a, b = rng.standard_normal((13, 31), np.float32), rng.standard_normal((31, 67), np.float32)
    kernel = kg.fuse(kg.matmul(kg.tensor("a", a.shape), kg.tensor("b", b.shape))).emit_kernel(
        avx512, tuning="none", tile=(8, 32))
    assert "float16" in kernel.source
    dev = device()
    narrow = replace(dev, info=replace(dev.info, vector_widths=(8, 4)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "_device", narrow)
        with pytest.raises(kg.KernelgenError) as error:
            kernel(a, b)
    message = str(error.value)
    assert all(part in message for part in (f"'{kernel.name}'", "float16", dev.name, "8/4"))
    assert "float8" not in message.split("build correctly")[0]  # float8 is not blamed
    if 16 in dev.info.vector_widths:
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_a_work_group_over_the_kernels_limit_is_an_error_naming_local_size() -> None:
    require("opencl")
    info = device().info
    big = replace(info, name="profile:too-wide", max_work_group=info.max_work_group * 2,
                  max_item_sizes=(info.max_work_group * 2,) * 3)
    fused = kg.fuse(kg.relu(kg.tensor("x", (4 * info.max_work_group,))))
    # a point a work-item (vectors of them would need fewer items than the group asked for)
    kernel = fused.emit(backends.REGISTRY["opencl"].for_device(big), tuning="none",
                        local_size=info.max_work_group * 2, vectors=False)
    with pytest.raises(kg.KernelgenError, match="local_size="):
        kernel(np.ones(4 * info.max_work_group, np.float32))


def _chain() -> tuple[kg.FusedOp, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    g = rng.standard_normal(1031).astype(np.float32)
    x = kg.tensor("x", (257, 1031))
    m = kg.mul(x, kg.constant("g", g))
    return kg.fuse(m, kg.relu(m)), g, rng.standard_normal((257, 1031)).astype(np.float32)


def test_constants_need_not_be_passed_and_stay_on_the_device() -> None:
    require("opencl")
    fused, g, x = _chain()
    kernel = fused.emit("opencl")
    want = np.maximum(x * g, 0)
    np.testing.assert_array_equal(kernel(x), want)
    kept = dict(kernel.runtime._kept)
    np.testing.assert_array_equal(kernel(x), want)
    assert kernel.runtime._kept == kept  # the same device buffer, not a new upload
    np.testing.assert_array_equal(kernel(x, 2 * g), np.maximum(x * 2 * g, 0))  # all given
    np.testing.assert_array_equal(kernel(x=x, g=-g), np.maximum(-x * g, 0))


def test_call_with_every_alignment() -> None:
    """Inputs and outputs at any address (Intel's runtime copies a buffer that is not 128-byte
    aligned; a view one float in is not) give the same answer; returned arrays are
    page-aligned."""
    require("opencl")
    fused, g, x = _chain()
    kernel = fused.emit("opencl")
    want = np.maximum(x * g, 0)
    got = kernel(x)
    assert got.ctypes.data % 4096 == 0
    shifted = np.empty(x.size + 1, np.float32)[1:].reshape(x.shape)
    shifted[...] = x
    np.testing.assert_array_equal(kernel(shifted), want)
    out = np.empty(x.size + 3, np.float32)[3:].reshape(x.shape)
    assert kernel(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    for _ in range(3):  # results from reused blocks are fresh each time
        np.testing.assert_array_equal(kernel(x), want)


def test_a_program_takes_its_constants_itself() -> None:
    require("opencl")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 5, 3, 3)).astype(np.float32)
    x = kg.tensor("x", (1, 5, 13, 11))
    conv = kg.conv(x, kg.constant("w", w), pads=[1, 1, 1, 1])
    program = kg.fuse(conv, kg.relu(conv)).emit("opencl", algorithm="winograd")
    xa = rng.standard_normal((1, 5, 13, 11)).astype(np.float32)
    want = kg.interpret(kg.fuse(conv, kg.relu(conv)).lower(), xa, w)[0]
    np.testing.assert_allclose(program(xa), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(program(xa, w), want, rtol=1e-4, atol=1e-4)


def test_ambiguous_argument_count_names_the_constants() -> None:
    require("opencl")
    a, b = kg.tensor("a", (3,)), kg.tensor("b", (3,))
    c1, c2 = kg.constant("c1", np.ones(3, np.float32)), kg.constant("c2", np.ones(3, np.float32))
    left, right = kg.add(a, c1), kg.add(c2, b)
    kernel = kg.fuse(left, right, kg.add(left, right)).emit("opencl")
    ones = np.ones(3, np.float32)
    with pytest.raises(kg.ArgumentError, match="2 constants that default"):
        kernel(ones, ones, ones)
    np.testing.assert_array_equal(kernel(ones, ones), 4 * ones)
    np.testing.assert_array_equal(kernel(ones, 2 * ones, ones, ones), 5 * ones)


def test_a_name_picks_the_platform_it_names_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an Intel CPU every implementation's device is an 'Intel(R) Xeon(R) Processor', so a
    query matches PoCL's device name as well as Intel's platform name: the platform's name
    wins, then its version ('pocl 3.0'), then a device name, each in platform order. (With
    the first match taken, ``--opencl-device=intel`` had run CI's Intel pass on PoCL.) Stand-in
    platforms, as ``pyopencl`` lists them on such a machine."""
    from types import SimpleNamespace

    from kernelgen.backends.opencl import runtime

    def platform(name: str, version: str, device_name: str) -> SimpleNamespace:
        dev = SimpleNamespace(name=device_name)
        return SimpleNamespace(name=name, version=version, get_devices=lambda: [dev])

    platforms = [
        platform("Oclgrind", "OpenCL 1.2 (Oclgrind 21.10)", "Oclgrind Simulator"),
        platform("Portable Computing Language", "OpenCL 3.0 PoCL 3.1+debian",
                 "pthread-skylake-avx512-Intel(R) Xeon(R) Processor"),
        platform("Intel(R) OpenCL", "OpenCL 3.1 LINUX", "Intel(R) Xeon(R) Processor"),
        platform("Portable Computing Language", "OpenCL 3.0 PoCL 3.0-rc2",
                 "pthread-Intel(R) Xeon(R) Processor")]
    cl = SimpleNamespace(get_platforms=lambda: platforms)
    monkeypatch.setattr(runtime, "_usable", lambda cl, dev: True)
    for query, want in [("intel", 2), ("Intel(R) OpenCL", 2), ("pocl 3.0", 3), ("pocl", 1),
                        ("oclgrind", 0), ("xeon", 1), ("skylake", 1),
                        ("language | opencl 3.0 pocl 3.0", 3)]:
        monkeypatch.setenv(runtime.SELECT_ENV, query)
        assert runtime._select(cl) == (want, 0), query
    monkeypatch.setenv(runtime.SELECT_ENV, "cuda")
    with pytest.raises(kg.KernelgenError, match="names no OpenCL device"):
        runtime._select(cl)
