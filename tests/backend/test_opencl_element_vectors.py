"""Elementwise kernels as a vector of points a work-item (``backends/opencl/element_vectors.py``):
asked for with the schedule option ``vectors``, and by default where the device's probe
measured them faster (Intel's CPU runtime; not PoCL). Against ONNX's reference on awkward
shapes: a row shorter than one run of vectors, primes, a row of one vector and one more
point, broadcast operands computed once a run (a gate's sigmoid), a reshape; refused where it
cannot apply, naming the kernel; the probe's decision and its cache."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import device as device_mod
from kernelgen.backends.opencl import element_vectors
from kernelgen.backends.opencl.device import PROFILES, capabilities
from kernelgen.backends.opencl.schedule import choose


def _check(ops: list[kg.Op], feeds: dict[str, np.ndarray]) -> kg.Kernel:
    kernel = kg.fuse(*ops).emit("opencl", tuning="none", vectors=True)
    require_vectors_of(kernel.source)
    args = [feeds[a["name"]] for a in kernel.metadata["args"] if a["role"] == "input"]
    assert_close(kernel(*args), evaluate_chain(ops, feeds)[ops[-1].name])
    assert kernel.metadata["tunables"]["vectors"] is True
    assert kernel.metadata["vector_points"] == kernel.metadata["tunables"]["vector_width"]
    return kernel


# rows of 37 (2 vectors and a tail in one chunk of 4 runs), 131 (a chunk, then part of one),
# 2 x 33 (two vectors and one point; merged into one row of 66), 3 x 64 (whole runs), 1031
# (primes past several chunks)
SHAPES = [(37,), (131,), (2, 33), (3, 64), (1031,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_residual_add_with_relu(shape: tuple[int, ...]) -> None:
    require("opencl")
    rng = np.random.default_rng(len(shape) + shape[-1])
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "xy"}
    total = kg.add(kg.tensor("x", shape), kg.tensor("y", shape))
    kernel = _check([total, kg.relu(total)], feeds)
    assert "vstore" in kernel.source


@pytest.mark.parametrize("c,hw", [(3, 6), (5, 7), (2, 13), (4, 16)])
def test_gated_channels_compute_the_gate_once_a_run(c: int, hw: int) -> None:
    """x * sigmoid(g) with g per channel: the gate is a scalar before the vector loop."""
    require("opencl")
    rng = np.random.default_rng(c * hw)
    feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32),
             "g": 4 * rng.standard_normal((1, c, 1, 1)).astype(np.float32)}
    gate = kg.sigmoid(kg.tensor("g", (1, c, 1, 1)))
    _check([gate, kg.mul(kg.tensor("x", (1, c, hw, hw)), gate)], feeds)


def test_bias_over_rows_then_a_reshape_of_a_chain() -> None:
    require("opencl")
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((7, 41)).astype(np.float32),
             "b": rng.standard_normal((41,)).astype(np.float32)}
    biased = kg.add(kg.tensor("x", (7, 41)), kg.tensor("b", (41,)))
    _check([biased, kg.tanh(biased)], feeds)
    tanh = kg.tanh(kg.tensor("x", (7, 41)))
    _check([tanh, kg.reshape(tanh, (1, 287))], feeds)


def test_refused_where_it_cannot_apply() -> None:
    """A transposed read takes register tiles; an integer output has no float vectors; rows
    of 25 points (a per-channel operand keeps them apart) are under two vectors."""
    require("opencl")
    x = kg.tensor("x", (32, 48))
    t = kg.transpose(x, (1, 0))
    with pytest.raises(ValueError, match="vectors"):
        kg.fuse(t, kg.relu(t)).emit("opencl", tuning="none", vectors=True)
    i = kg.tensor("i", (64,), "int32")
    with pytest.raises(ValueError, match="kernel 'fused_add'.*vectors"):
        kg.fuse(kg.add(i, i)).emit("opencl", tuning="none", vectors=True)
    short = kg.add(kg.tensor("s", (3, 5, 5)), kg.tensor("c", (3, 1, 1)))
    with pytest.raises(ValueError, match="at least"):
        kg.fuse(short).emit("opencl", tuning="none", vectors=True)


def test_chosen_by_the_device_measurement() -> None:
    """A CPU whose probe measured vectors faster takes them by default; a CPU that did not, or
    a GPU, keeps one point a work-item; ``vectors=False`` keeps points anyway."""
    loop = kg.fuse(kg.relu(kg.tensor("x", (4, 1000)))).lower()
    cpu = PROFILES["cpu-avx512"]
    faster = capabilities(type(cpu)(**{**cpu.__dict__, "explicit_elementwise": True}))
    assert choose(loop, {}, faster).vectors is True
    assert choose(loop, {"vectors": False}, faster).vectors is None
    assert choose(loop, {}, capabilities(cpu)).vectors is None
    gpu = PROFILES["desktop-gpu"]
    assert not capabilities(type(gpu)(**{**gpu.__dict__, "explicit_elementwise": True})
                            ).explicit_elementwise
    assert element_vectors.choose(loop, capabilities(cpu), None) is None


def test_the_probe_decides_once_per_device(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KERNELGEN_OPENCL_EXPLICIT_ELEMENTWISE", raising=False)
    gains = {"A": 1.9, "B": 0.9}
    calls = []

    def fake(platform: int, dev: int, width: int) -> float:
        calls.append(platform)
        return gains["A" if platform == 1 else "B"]
    monkeypatch.setattr(device_mod, "_run_elementwise_probe", fake)
    assert device_mod.probed_elementwise(1, 0, "device A", 16)
    assert device_mod.probed_elementwise(1, 0, "device A", 16)
    assert not device_mod.probed_elementwise(2, 0, "device B", 16)
    assert calls == [1, 2]
    for path in tmp_path.rglob("elementwise-*.json"):  # a damaged record: measured again
        path.write_text("{")
    assert device_mod.probed_elementwise(1, 0, "device A", 16)
    assert calls == [1, 2, 1]
    assert any(json.loads(p.read_text())["gain"] == 1.9 for p in tmp_path.rglob("*.json"))
    monkeypatch.setenv("KERNELGEN_OPENCL_EXPLICIT_ELEMENTWISE", "0")
    assert not device_mod.probed_elementwise(1, 0, "device A", 16)


def test_the_probe_measures_a_real_device() -> None:
    """The child's measurement on this machine's device gives a positive gain."""
    require("opencl")
    if not backends.get("opencl").caps.simd_within_work_item:
        pytest.skip("the elementwise probe is for CPU devices; this OpenCL device is a GPU")
    gain = device_mod._run_elementwise_probe(*_device_indices(), 8)
    assert gain > 0.2


def _device_indices() -> tuple[int, int]:
    import pyopencl as cl

    from kernelgen.backends.opencl.runtime import device
    dev = device().device
    for p, platform in enumerate(cl.get_platforms()):
        for d, candidate in enumerate(platform.get_devices()):
            if candidate == dev:
                return p, d
    raise AssertionError("the device in use is on no platform")
