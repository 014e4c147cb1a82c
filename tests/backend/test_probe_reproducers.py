"""The reproducer of every defect in the reliability probe (shared/research/RELIABILITY_PROBE.md,
D1-D16), run as written there, with the behaviour the fix promises: a right answer or a typed
error that names what is at fault, on every backend the defect concerns. Broader tests of each
fix live beside the code they test (test_calls, test_special_values, test_names,
unit/test_errors, unit/test_cache_robustness)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import BACKENDS, require

import kernelgen as kg

T = kg.tensor
EMITTED = [b for b in BACKENDS if b != "interp"]


def test_d1_threads_on_a_kernel_that_packs_in_a_first_launch() -> None:
    require("opencl")
    k = kg.fuse(kg.matmul(T("a", (128, 1024)), T("b", (1024, 256)))).emit(
        "opencl", tuning="none", pack=True, pack_in_tile=False)
    bad: list[int] = []

    def w(t: int) -> None:
        r = np.random.default_rng(t)
        for _ in range(5):
            a = r.standard_normal((128, 1024)).astype("f4")
            b = r.standard_normal((1024, 256)).astype("f4")
            if not np.allclose(k(a, b), a @ b, rtol=1e-3, atol=1e-3):
                bad.append(t)
    ts = [threading.Thread(target=w, args=(t,)) for t in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not bad


@pytest.mark.parametrize("backend", BACKENDS)
def test_d2_gather_indices_out_of_range_raise(backend: str) -> None:
    require(backend)
    f = kg.fuse(kg.gather(T("d", (5, 4)), T("i", (3,), "int64"), axis=0))
    d = np.arange(20, dtype="f4").reshape(5, 4)
    run = (lambda *a: kg.interpret(f.lower(), *a)[0]) if backend == "interp" else \
        f.emit(backend)
    np.testing.assert_array_equal(run(d, np.array([4, -5, 2])), d[[4, -5, 2]])
    for bad in (5, -6, 10**8, -10**8):
        with pytest.raises(kg.ArgumentError, match=r"\[-5, 4\]"):
            run(d, np.array([0, bad, 2]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["relu", "clip", "reduce_max", "reduce_min", "sign"])
def test_d3_nan_propagates(backend: str, op: str) -> None:
    require(backend)
    x = np.array([np.nan, -1, 2], "f4")
    build = {"relu": lambda: kg.relu(T("x", (3,))),
             "clip": lambda: kg.clip(T("x", (3,)), -1.0, 1.0),
             "reduce_max": lambda: kg.reduce_max(T("x", (1, 3)), axes=[1]),
             "reduce_min": lambda: kg.reduce_min(T("x", (1, 3)), axes=[1]),
             "sign": lambda: kg.sign(T("x", (3,)))}[op]
    f = kg.fuse(build())
    arg = x[None] if op.startswith("reduce") else x
    got = kg.interpret(f.lower(), arg)[0] if backend == "interp" else f.emit(backend)(arg)
    assert np.isnan(got.reshape(-1)[0])


@pytest.mark.parametrize("backend", EMITTED)
def test_d4_gather_takes_data_then_indices(backend: str) -> None:
    require(backend)
    k = kg.fuse(kg.gather(T("data", (3,), "int64"), T("indices", (3,), "int64"))).emit(backend)
    data, idx = np.array([1, 2, 0]), np.array([0, 0, 0])
    np.testing.assert_array_equal(k(data, idx), data[idx])
    assert [a["name"] for a in k.metadata["args"]][:2] == ["data", "indices"]


@pytest.mark.parametrize("backend", EMITTED)
def test_d5_out_overlapping_an_input(backend: str) -> None:
    require(backend)
    a = np.random.default_rng(0).standard_normal((16, 16)).astype("f4")
    b = a + 1
    ref = a @ b
    kg.fuse(kg.matmul(T("a", (16, 16)), T("b", (16, 16)))).emit(backend)(a, b, out=a)
    np.testing.assert_allclose(a, ref, rtol=1e-4, atol=1e-4)


def test_d6_triton_contractions_index_in_64_bits() -> None:
    src = kg.fuse(kg.matmul(T("a", (70000, 40000)), T("b", (40000, 4)))).emit(
        "triton", tuning="none").source
    assert "int64" in src and "tl.int32" not in src


@pytest.mark.parametrize("backend", BACKENDS)
def test_d7_inputs_named_alike_are_refused(backend: str) -> None:
    with pytest.raises(kg.FusionError, match="'x'"):
        kg.fuse(kg.sub(T("x", (3,)), T("x", (3,))))


@pytest.mark.parametrize("name", ["fmax", "get_global_id", "__kernel"])
def test_d7_builtin_names_build_on_opencl(name: str) -> None:
    require("opencl")
    k = kg.fuse(kg.relu(T(name, (5,)))).emit("opencl")
    x = np.array([-1, 2, -3, 4, 0], "f4")
    np.testing.assert_array_equal(k(x), np.maximum(x, 0))


@pytest.mark.parametrize("backend", EMITTED)
def test_d8_a_program_takes_out(backend: str) -> None:
    require(backend)
    shape = (8, 1024, 1024) if backend == "opencl" else (4, 16, 24)
    m, k_, n = shape
    k = kg.fuse(kg.matmul(T("a", (m, k_)), T("b", (k_, n)))).emit(backend, tuning="none")
    a, b = np.ones((m, k_), "f4"), np.ones((k_, n), "f4")
    o = np.empty((m, n), "f4")
    assert k(a, b, out=o) is o
    np.testing.assert_allclose(o, a @ b)
    assert callable(k.launch)


@pytest.mark.parametrize("backend", EMITTED)
def test_d9_read_only_out_is_refused(backend: str) -> None:
    require(backend)
    o = np.zeros(4, "f4")
    o.flags.writeable = False
    with pytest.raises(kg.ArgumentError, match="read-only"):
        kg.fuse(kg.relu(T("x", (4,)))).emit(backend)(np.ones(4, "f4"), out=o)
    assert not o.any()


def test_d11_invalid_conv_attributes_are_typed_errors() -> None:
    x, w = T("x", (1, 3, 8, 8)), T("w", (4, 3, 3, 3))
    for attrs in ({"dilations": [0, 0]}, {"group": 0}, {"strides": [0, 0]}):
        with pytest.raises(kg.AttributeError_, match=next(iter(attrs))):
            kg.conv(x, w, **attrs)
    with pytest.raises(kg.AttributeError_, match="strides"):
        kg.max_pool(T("p", (1, 3, 8, 8)), kernel_shape=[2, 2], strides=[0, 0])


def test_d12_non_integer_sizes_and_indices_are_refused() -> None:
    with pytest.raises(kg.ShapeError):
        T("x", (2.5, 4))
    with pytest.raises(kg.AttributeError_, match="starts"):
        kg.slice(T("x", (6,)), [1.5], [4], [0])


@pytest.mark.parametrize("backend", EMITTED)
def test_d13_bench_checks_dtypes(backend: str) -> None:
    require(backend)
    k = kg.fuse(kg.relu(T("x", (10, 10)))).emit(backend)
    with pytest.raises(kg.ArgumentError, match="float32"):
        kg.bench(k, np.ones((10, 10), "f2"))


def test_d16_messages() -> None:
    with pytest.raises(kg.KernelgenError):
        kg.concat([], axis=0)
    with pytest.raises(kg.KernelgenError, match="separate arguments|\\*"):
        kg.fuse([kg.relu(T("x", (3,)))])
    with pytest.raises(kg.KernelgenError, match="num_outputs"):
        kg.split(T("s", (3, 4)), num_outputs=5)
    with pytest.raises(kg.KernelgenError):
        kg.softmax(T("x", (3, 4)), axis="1")
    with pytest.raises(kg.DtypeError, match="int8"):
        T("x", (3,), "int8")
    with pytest.raises(kg.KernelgenError, match="'left'.*'right'|'right'.*'left'"):
        kg.matmul(T("left", (2, 3, 4)), T("right", (3, 4, 6)))
