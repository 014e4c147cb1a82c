"""Code generated for declared OpenCL devices (no device needed: ``emit`` builds nothing until a
call): every launch within the device's work-group and per-dimension limits, reductions'
scratch within its local memory, vector widths within what its compiler builds; the probe's
report read right when the child process crashes; aligned host memory and its pool."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import kernelgen as kg
from kernelgen import backends, hostmem
from kernelgen.backends.opencl import device as device_mod
from kernelgen.backends.opencl.device import PROFILES, capabilities

OPENCL = backends.REGISTRY["opencl"]


def _blocks() -> dict[str, kg.FusedOp]:
    """One block per schedule family, at awkward sizes."""
    x = kg.tensor("x", (37, 1031))
    b = kg.tensor("b", (1031,))
    a = kg.add(x, b)
    out = {"elementwise": kg.fuse(a, kg.relu(a))}
    out["softmax rows"] = kg.fuse(kg.softmax(kg.tensor("s", (5, 4099)), axis=1))
    out["column sums"] = kg.fuse(kg.reduce_sum(kg.tensor("c", (3001, 7)), axes=[0]))
    m = kg.matmul(kg.tensor("l", (67, 45)), kg.tensor("r", (45, 131)))
    out["matmul"] = kg.fuse(m, kg.relu(m))
    conv = kg.conv(kg.tensor("img", (1, 8, 19, 23)), kg.tensor("w", (8, 1, 3, 3)), group=8,
                   pads=[1, 1, 1, 1])
    out["depthwise"] = kg.fuse(conv)
    q, k, v = (kg.tensor(n, (2, 33, 16)) for n in "qkv")
    s = kg.matmul(q, kg.transpose(k, [0, 2, 1]))
    p = kg.softmax(s, axis=2)
    out["attention"] = kg.fuse(s.inputs[1], s, p, kg.matmul(p, v), force=True)
    return out


def _launches(metadata: dict) -> list[dict]:
    stages = metadata.get("stages", [metadata])
    out = []
    for m in stages:
        launch = m["launch"]
        out.append(launch)
        if launch.get("pack"):
            out.append(launch["pack"])
    return out


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("name", sorted(_blocks()))
def test_kernels_respect_the_device_limits(profile: str, name: str) -> None:
    info = PROFILES[profile]
    kernel = _blocks()[name].emit(OPENCL.for_device(profile), tuning="none")
    for launch in _launches(kernel.metadata):
        local = launch["local_size"] or [1]
        assert int(np.prod(local)) <= info.max_work_group, (profile, name, launch)
        assert all(n <= m for n, m in zip(local, info.max_item_sizes)), (profile, name, launch)
    src = kernel.source
    widths = {int(w) for w in re.findall(r"\bfloat(\d+)\b", src)}
    assert widths <= set(info.vector_widths) | {2}, (profile, name, widths)  # .lo/.hi halves
    for line in src.splitlines():  # __local scratch arrays within local memory
        if "__local" in line and "[" in line:
            n = int(line.split("[")[1].split("]")[0])
            assert 8 * n <= info.local_memory, (profile, name, line)


def test_gpu_profiles_reduce_rows_across_a_work_group() -> None:
    """A CPU reduces a row in one work-item with explicit vectors; a GPU across the items of a
    work-group (the 'row' schedule would leave a GPU's lanes idle)."""
    block = _blocks()["softmax rows"]
    cpu = block.emit(OPENCL.for_device("cpu-avx512"), tuning="none")
    gpu = block.emit(OPENCL.for_device("mobile-gpu"), tuning="none")
    assert cpu.metadata["schedule"] == "row"
    assert gpu.metadata["schedule"] == "group"
    assert gpu.metadata["launch"]["local_size"][0] <= 256


def test_a_small_local_memory_shrinks_the_group() -> None:
    tiny = replace(PROFILES["mobile-gpu"], name="profile:tiny", local_memory=256)
    kernel = _blocks()["softmax rows"].emit(OPENCL.for_device(tiny), tuning="none")
    assert kernel.metadata["launch"]["local_size"][0] * 4 <= 256


def test_sse_tiles_take_vectors_one_register_wide() -> None:
    """The SSE profile builds float8 but has 16 registers of 4 lanes: 4 rows x 3 float4 sums
    (131 columns: eleven 12-wide tiles)."""
    kernel = _blocks()["matmul"].emit(OPENCL.for_device("cpu-sse"), tuning="none")
    assert "float16" not in kernel.source and "float8" not in kernel.source
    assert "float4" in kernel.source
    assert tuple(kernel.metadata["tunables"]["tile"]) == (4, 12)


def test_a_device_without_fp64_refuses_double_kernels() -> None:
    x = kg.tensor("x", (4,), "float64")
    with pytest.raises(kg.UnsupportedError, match="float64"):
        kg.fuse(kg.relu(x)).emit(OPENCL.for_device("mobile-gpu"), tuning="none")


def test_search_space_stays_within_the_work_group_limit() -> None:
    caps = capabilities(PROFILES["mobile-gpu"])
    from kernelgen.backends.opencl.search import search_space
    for block in _blocks().values():
        for config in search_space(block.lower(), caps):
            assert config.as_options().get("local_size", 1) <= 256


def test_probe_report_when_the_child_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's PoCL aborts building float16 code: the widths reported before the crash stand,
    the crashing one and wider fail, with the compiler's last words."""
    def fake_run(*args, **kwargs):
        return subprocess.CompletedProcess(args, -6, "4 ok\n8 ok\n",
                                           "LLVM ERROR: Cannot select: fma\n")
    monkeypatch.setattr(device_mod.subprocess, "run", fake_run)
    report = device_mod._run_probe(0, 0)
    assert report[4] is None and report[8] is None
    assert "Cannot select" in report[16]


def test_probe_tries_each_width_alone_after_a_crash_building_them_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe builds every width in one program first; a child that dies there (pip's PoCL
    on float16 code) reports nothing, and a second child tries one width at a time, whose
    answers before its own crash stand."""
    commands: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        commands.append(cmd)
        if "--each" not in cmd:
            return subprocess.CompletedProcess(cmd, -11, "", "Segmentation fault\n")
        return subprocess.CompletedProcess(cmd, -6, "4 ok\n", "LLVM ERROR: Cannot select\n")
    monkeypatch.setattr(device_mod.subprocess, "run", fake_run)
    report = device_mod._run_probe(1, 0)
    assert len(commands) == 2 and "--each" in commands[1] and commands[1][-2:] == ["1", "0"]
    assert report[4] is None
    assert "Cannot select" in report[8] and "Cannot select" in report[16]


def test_the_probe_child_imports_no_kernelgen() -> None:
    """The probe runs from its file (a child importing kernelgen first took longer than the
    probe itself): its module loads no kernelgen module, and the parent runs it by path."""
    cmd = device_mod._probe_command("1", "0")
    assert cmd[0] == sys.executable and cmd[-3:] == [device_mod.probe.__file__, "1", "0"]
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='probe'); "
            "print(sorted(m for m in sys.modules if m.startswith('kernelgen')))")
    done = subprocess.run([sys.executable, "-c", code, device_mod.probe.__file__],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_probe_widths_can_be_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELGEN_OPENCL_VECTOR_WIDTHS", "4, 8")
    assert device_mod.probed_widths(0, 0, "any") == (8, 4)


def test_probe_result_is_cached_per_device(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KERNELGEN_OPENCL_VECTOR_WIDTHS", raising=False)
    calls = []

    def fake_probe(platform: int, dev: int) -> dict[int, str | None]:
        calls.append((platform, dev))
        return {4: None, 8: None, 16: "crashed"}
    monkeypatch.setattr(device_mod, "_run_probe", fake_probe)
    assert device_mod.probed_widths(1, 0, "device A") == (8, 4)
    assert device_mod.probed_widths(1, 0, "device A") == (8, 4)
    assert len(calls) == 1
    device_mod.probed_widths(2, 0, "device B")
    assert len(calls) == 2


def test_aligned_arrays_and_the_pool() -> None:
    small = hostmem.empty((3, 5), np.float32)
    assert small.ctypes.data % hostmem.ALIGN == 0 and small.shape == (3, 5)
    big = hostmem.empty((1024, 1024), np.float32)
    address = big.ctypes.data
    view = big[10:20]
    del big
    gc.collect()
    other = hostmem.empty((1024, 1024), np.float32)  # the block is still in use by the view
    assert other.ctypes.data != address
    view[...] = 1.0
    del view
    gc.collect()
    again = hostmem.empty((1024, 1024), np.float32)  # released: handed out again
    assert again.ctypes.data == address
    copy = hostmem.copy(np.arange(7, dtype=np.int64)[1:])
    assert copy.ctypes.data % hostmem.ALIGN == 0 and list(copy) == list(range(1, 7))
