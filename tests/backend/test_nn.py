"""Intensive operators (MatMul, Gemm, Conv, pools, normalisations) on every backend against ONNX's
reference, on awkward shapes (odd channels, 1x1 and 7x7 kernels, stride 2, pads, dilation,
groups, depthwise, batch > 1, sizes that divide nothing), and random elementwise prologues and
epilogues fused around a GEMM or a convolution."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, prebuild, require, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import evaluate_chain, reference
from test_fusion import _available
from test_ops import Case

import kernelgen as kg

CASES: list[Case] = [
    # 13 products of normal values a sum: float32's rounding of the terms (up to about 10 each)
    # reaches 4e-6 in a sum that nearly cancels, twice the plain tolerance (a CI failure on
    # NEON with the data another test order drew from the shared generator)
    Case("MatMul", kg.matmul, [(7, 13), (13, 11)], scale=4),
    Case("MatMul-batched", kg.matmul, [(2, 3, 5), (5, 4)]),
    Case("MatMul-bcast-batch", kg.matmul, [(2, 1, 3, 5), (3, 5, 2)]),
    Case("MatMul-shared-batch", kg.matmul, [(2, 3, 7, 5), (2, 1, 5, 9)]),
    Case("MatMul-vec-mat", kg.matmul, [(5,), (5, 3)]),
    Case("MatMul-mat-vec", kg.matmul, [(3, 5), (5,)]),
    Case("MatMul-K1", kg.matmul, [(4, 1), (1, 6)]),
    Case("Gemm-bias", lambda a, b, c: kg.gemm(a, b, c), [(3, 5), (5, 7), (7,)]),
    Case("Gemm-trans", lambda a, b, c: kg.gemm(a, b, c, alpha=0.5, beta=2.0, transA=1,
                                                transB=1), [(5, 3), (7, 5), (3, 1)]),
    Case("Gemm-noC", kg.gemm, [(1, 9), (9, 1)], scale=4),
    Case("Conv-pad", lambda x, w: kg.conv(x, w, pads=[1, 1, 1, 1]), [(1, 3, 7, 9), (4, 3, 3, 3)],
         scale=10),
    Case("Conv-stride2-bias", lambda x, w, b: kg.conv(x, w, b, strides=[2, 2], pads=[1, 0, 2, 1]),
         [(2, 3, 9, 8), (5, 3, 3, 3), (5,)], scale=10),
    Case("Conv-dilation", lambda x, w: kg.conv(x, w, dilations=[2, 1], pads=[2, 1, 2, 1]),
         [(1, 2, 9, 7), (3, 2, 3, 3)], scale=10),
    Case("Conv-groups", lambda x, w: kg.conv(x, w, group=2, pads=[1, 1, 1, 1]),
         [(2, 4, 7, 7), (6, 2, 3, 3)], scale=10),
    # 11 output channels a group: the lowering splits them from the group (split_groups)
    Case("Conv-groups-1x1", lambda x, w, b: kg.conv(x, w, b, group=2),
         [(2, 18, 5, 7), (22, 9, 1, 1), (22,)], scale=10),
    # 33 output channels a group over a window (AlexNet's grouped convs): split too
    Case("Conv-groups-wide-window", lambda x, w, b: kg.conv(x, w, b, group=2, pads=[2, 1, 2, 1],
                                                           strides=[1, 2]),
         [(1, 10, 9, 11), (66, 5, 5, 3), (66,)], scale=10),
    Case("Conv-depthwise", lambda x, w: kg.conv(x, w, group=5, pads=[1, 1, 1, 1], strides=[2, 2]),
         [(1, 5, 9, 9), (5, 1, 3, 3)], scale=10),
    Case("Conv-1x1", kg.conv, [(2, 7, 5, 3), (3, 7, 1, 1)], scale=10),
    Case("Conv-7x7", lambda x, w: kg.conv(x, w, pads=[3, 3, 3, 3], strides=[2, 2]),
         [(1, 3, 11, 11), (2, 3, 7, 7)], scale=20),
    Case("Conv-same-upper", lambda x, w: kg.conv(x, w, auto_pad="SAME_UPPER", strides=[2, 2]),
         [(1, 2, 8, 7), (3, 2, 4, 3)], scale=10),
    Case("Conv-1d", lambda x, w: kg.conv(x, w, pads=[2, 2]), [(2, 3, 17), (4, 3, 5)], scale=10),
    Case("MaxPool", lambda x: kg.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         [(1, 3, 7, 9)]),
    Case("MaxPool-ceil-dil", lambda x: kg.max_pool(x, [2, 2], strides=[2, 2], ceil_mode=1,
                                                    dilations=[1, 2]), [(2, 2, 7, 8)]),
    Case("AveragePool", lambda x: kg.average_pool(x, [3, 3], pads=[1, 1, 1, 1]), [(1, 2, 5, 7)]),
    Case("AveragePool-incl-pad", lambda x: kg.average_pool(x, [3, 2], pads=[1, 0, 1, 1],
                                                            strides=[2, 1], count_include_pad=1),
         [(2, 3, 7, 5)]),
    # the count of a padded window's taps, written out tap by tap (nn._window_count): ceil
    # mode, dilation, 3-D, pads counted with a ceil-mode window past them; and a window of
    # more taps than COUNT_UNROLLED_TAPS, counted by a reduction
    Case("AveragePool-ceil-dil", lambda x: kg.average_pool(x, [3, 2], pads=[1, 1, 0, 1],
                                                            strides=[2, 3], dilations=[2, 1],
                                                            ceil_mode=1), [(2, 3, 11, 13)]),
    Case("AveragePool-3d", lambda x: kg.average_pool(x, [3, 2, 3], pads=[1, 0, 1, 1, 1, 2],
                                                      strides=[2, 1, 2]), [(1, 2, 5, 4, 7)]),
    Case("AveragePool-incl-pad-ceil", lambda x: kg.average_pool(
        x, [3, 3], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=1, count_include_pad=1),
        [(1, 2, 8, 6)]),
    Case("AveragePool-long-window", lambda x: kg.average_pool(x, [17, 19], pads=[8, 9, 8, 9]),
         [(1, 2, 19, 23)]),
    Case("GlobalAveragePool", lambda x: kg.global_pool("GlobalAveragePool", x), [(2, 3, 5, 7)]),
    Case("GlobalMaxPool", lambda x: kg.global_pool("GlobalMaxPool", x), [(1, 4, 3, 11)]),
    # H and W one reduction axis of 169: 'row' vectors with a tail of one on OpenCL
    Case("GlobalAveragePool-13x13", lambda x: kg.global_pool("GlobalAveragePool", x),
         [(1, 5, 13, 13)]),
    Case("BatchNormalization", kg.batch_normalization,
         [(2, 3, 5, 5), (3,), (3,), (3,), (3,)], kinds=("normal", "normal", "normal", "normal",
                                                         "pos")),
    Case("LayerNormalization", lambda x, s, b: kg.layer_normalization(x, s, b),
         [(3, 7, 129), (129,), (129,)], scale=20),
    Case("LayerNormalization-axis1",
         lambda x, s: kg.layer_normalization(x, s, axis=1, epsilon=1e-3), [(2, 5, 3), (5, 3)],
         scale=20),
    Case("InstanceNormalization", kg.instance_normalization, [(2, 3, 5, 7), (3,), (3,)],
         scale=20),
]


@pytest.fixture(scope="module", autouse=True)
def _neon_batch(request: pytest.FixtureRequest) -> None:
    prebuild(request, lambda: [kg.fuse(c.build(*c.inputs()[0])) for c in CASES])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_intensive_operator(backend: str, case: Case) -> None:
    values, arrays = case.inputs()
    op = case.build(*values)
    want = reference(op, *arrays)
    fused = kg.fuse(op)
    feeds = dict(zip((v.name for v in values), arrays))
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want.astype(got.dtype), scale=case.scale)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 5, 7, 3), (1, 13, 1, 11), (3, 7)])
def test_batch_norm_of_constants_reads_its_scale_and_shift(backend: str,
                                                           shape: tuple[int, ...]) -> None:
    """BatchNormalization by constant parameters reads two per-channel constants, computes
    x * s + t, and gives NumPy's (x - mean) / sqrt(var + eps) * gamma + beta; parameters
    whose s is not finite (a variance of 0 with epsilon 0) keep the formula and its NaN."""
    rng = np.random.default_rng(3)
    c = shape[1]
    gamma, beta, mean = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.1, 2.0, c).astype(np.float32)
    X = rng.standard_normal(shape).astype(np.float32)
    axes = (-1,) + (1,) * (len(shape) - 2)
    for epsilon, zero_channel in ((1e-3, False), (0.0, True)):
        v = var.copy()
        if zero_channel:
            v[0] = 0.0
        x = kg.tensor("x", shape)
        bn = kg.batch_normalization(x, kg.constant("gamma", gamma), kg.constant("beta", beta),
                                    kg.constant("mean", mean), kg.constant("var", v),
                                    epsilon=epsilon)
        assert len(bn.inputs) == (5 if zero_channel else 3)
        with np.errstate(all="ignore"):
            want = (X.astype(np.float64) - mean.reshape(axes)) / \
                np.sqrt(v.astype(np.float64).reshape(axes) + epsilon) * gamma.reshape(axes) + \
                beta.reshape(axes)
        fused = kg.fuse(bn)
        (got,) = run(backend, fused, *(X if v is x else v.value for v in fused.inputs))
        if zero_channel:  # channel 0 divides by zero: inf times gamma, NaN where x == mean
            want, got = want[:, 1:], got[:, 1:]
        assert_close(got, want, np.float32, scale=4)


@pytest.mark.parametrize("backend", ["opencl", "neon"])
def test_two_batch_norms_of_one_input_each_keep_their_scale_and_shift(backend: str) -> None:
    """Two normalisations of one tensor by different constants, built with the API into one
    graph: their computed scale and shift constants are named after each operator (named
    after the input, the graph refused two distinct values of one name), and each output
    matches NumPy's formula from its own four parameters."""
    from kernelgen.graph import Graph
    require(backend)
    rng = np.random.default_rng(11)
    shape = (2, 5, 3, 7)
    X = rng.standard_normal(shape).astype(np.float32)
    x = kg.tensor("x", shape)
    outs, wants = [], []
    for k in range(2):
        gamma, beta, mean = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
        var = rng.uniform(0.1, 2.0, 5).astype(np.float32)
        outs.append(kg.batch_normalization(
            x, *(kg.constant(f"{n}{k}", a) for n, a in
                 (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var)))))
        c = (-1, 1, 1)
        wants.append((X - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-5) * gamma.reshape(c)
                     + beta.reshape(c))
    session = kg.compile_model(Graph.build([x], outs, "two_bns"), backend=backend)
    for got, want in zip(session.run(None, {"x": X}), wants):
        assert_close(got, want, np.float32, scale=4)


# --- fused prologues and epilogues ---------------------------------------------------------------

PRO = ["Relu", "Neg", "Tanh", "Abs", "Sigmoid"]


@st.composite
def heavy_blocks(draw: st.DrawFn) -> tuple[list[kg.Value], list[kg.Op]]:
    """A random elementwise chain on the heavy operator's first input, the operator (GEMM or a
    convolution), then a random chain on its output with a broadcast bias."""
    heavy = draw(st.sampled_from(["gemm", "conv"]))
    if heavy == "gemm":
        m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
        x, w = kg.tensor("x", (m, k)), kg.tensor("w", (k, n))
    else:
        c, hw, m = draw(st.integers(1, 3)), draw(st.integers(3, 6)), draw(st.integers(1, 4))
        x, w = kg.tensor("x", (1, c, hw, hw)), kg.tensor("w", (m, c, 3, 3))
    ops: list[kg.Op] = []
    v: kg.Value = x
    for _ in range(draw(st.integers(0, 2))):
        v = kg.ops.unary(draw(st.sampled_from(PRO)), v)
        ops.append(v)  # type: ignore[arg-type]
    core = kg.gemm(v, w) if heavy == "gemm" else kg.conv(v, w, pads=[1, 1, 1, 1])
    ops.append(core)
    inputs = [x, w]
    v = core
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            bias = kg.tensor(f"bias{len(inputs)}", (v.shape[1],) + (1,) * (v.rank - 2))
            inputs.append(bias)
            v = kg.ops.binary(draw(st.sampled_from(["Add", "Mul", "Sub"])), v, bias)
        else:
            v = kg.ops.unary(draw(st.sampled_from(PRO)), v)
        ops.append(v)  # type: ignore[arg-type]
    return inputs, ops


def _check_heavy(block: tuple[list[kg.Value], list[kg.Op]], seed: int,
                 backends: list[str]) -> None:
    inputs, ops = block
    rng = np.random.default_rng(seed)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in inputs}
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops)  # all edges green: One-to-One into and out of Many-to-Many
    assert len(fused.lower().outputs) == 1 and {b.name for b in fused.lower().inputs} == set(feeds)
    for backend in backends:
        (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
        assert_close(got, want, scale=50)


_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))


@settings(max_examples=60, **_SETTINGS)
@given(block=heavy_blocks(), seed=st.integers(0, 2**16))
def test_prologue_epilogue_fusion(block, seed: int) -> None:
    _check_heavy(block, seed, ["interp", *_available("opencl")])


@settings(max_examples=15, **_SETTINGS)
@given(block=heavy_blocks(), seed=st.integers(0, 2**16))
def test_prologue_epilogue_fusion_neon_triton(block, seed: int) -> None:
    _check_heavy(block, seed, _available("neon", "triton"))


def test_prologue_sees_zero_padding(backend: str) -> None:
    """Regression: a producer fused into a padded convolution must contribute 0 in the padding
    (the convolution's input is 0 there), not its value on zero inputs (sigmoid(0) = 0.5)."""
    x, w = kg.tensor("x", (1, 1, 3, 3)), kg.tensor("w", (2, 1, 3, 3))
    s = kg.sigmoid(x)
    c = kg.conv(s, w, pads=[1, 1, 1, 1])
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((1, 1, 3, 3), np.float32), rng.standard_normal((2, 1, 3, 3),
                                                                              np.float32)
    want = evaluate_chain([s, c], {"x": X, "w": W})[c.name]
    (got,) = run(backend, kg.fuse(s, c), X, W)
    assert_close(got, want, scale=10)


def test_neon_packed_row_blocks(monkeypatch) -> None:
    """The packed NEON template sweeps column panels with blocks of row tiles; with several
    blocks, the last one partial, every row is still computed exactly once."""
    from conftest import require

    from kernelgen.backends.neon import schedule as neon_schedule
    require("neon")
    m, k, n, tm = 29, 7, 10, 3  # 10 row tiles: blocks of 3, 3, 3 and 1
    monkeypatch.setattr(neon_schedule, "ROW_BLOCK_BYTES", 4 * tm * k * 3)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    mm = kg.matmul(kg.tensor("a", (m, k)), kg.tensor("b", (k, n)))
    out = kg.add(mm, kg.tensor("bias", (n,)))
    kernel = kg.fuse(mm, out).emit("neon", tile=(tm, 4), pack=True, tuning="none")
    assert "blocks of 3 row tiles" in kernel.source
    want = (a.astype(np.float64) @ b + bias).astype(np.float32)
    assert_close(kernel(a, b, bias), want, scale=4)


def test_neon_packed_blocks_cross_batches() -> None:
    """NEON packs the right operand a cache-sized block of panels at a time; blocks of 3
    panels over a batched MatMul with 4 panels a batch point straddle batch points, and the
    last block is partial. The packed operand loads as vectors along its rows, with the last
    panel's columns past the end element by element."""
    from conftest import require
    require("neon")
    batch, m, k, n = 3, 5, 37, 29  # 29 columns: 4 panels of 8 a batch point, 12 in all
    rng = np.random.default_rng(5)
    a = rng.standard_normal((batch, m, k), np.float32)
    b = rng.standard_normal((batch, k, n), np.float32)
    mm = kg.matmul(kg.tensor("a", a.shape), kg.tensor("b", b.shape))
    out = kg.relu(mm)
    kernel = kg.fuse(mm, out).emit("neon", tile=(4, 8), pack=True,
                                   pack_block_kib=4, tuning="none")  # 1184 bytes a panel
    assert kernel.metadata["pack_panels"] == 3
    assert "vst1q_f32(kg_b + kg_jv" in kernel.source
    want = np.maximum(a.astype(np.float64) @ b, 0).astype(np.float32)
    assert_close(kernel(a, b), want, scale=4)


@pytest.mark.parametrize("backend_tile", [("opencl", (1, 1)), ("opencl", (2, 3)),
                                          ("opencl", (4, 4)), ("opencl", (8, 2)),
                                          ("neon", (1, 4)), ("neon", (3, 8)), ("neon", (8, 12)),
                                          ("neon-packed", (4, 8)), ("neon-packed", (3, 4)),
                                          ("neon-blocks", (4, 8)), ("neon-blocks", (3, 4)),
                                          ("opencl-packed", (3, 16)),
                                          ("opencl-tilepack", (5, 16)),
                                          ("triton-packed", (16, 16))])
@pytest.mark.parametrize("name", ["MatMul", "MatMul-bcast-batch", "MatMul-shared-batch",
                                  "Gemm-trans",
                                  "Conv-stride2-bias", "Conv-1x1", "Conv-7x7", "Conv-1d"])
def test_tiled_contraction_tiles(name: str, backend_tile: tuple[str, tuple[int, int]]) -> None:
    """The register-tiled contraction templates on sizes that no tile divides, for several
    tiles; a tile taller than the matrix clamps. NEON's packed template also with 1 KiB
    blocks of panels (several blocks, the last partial); OpenCL's packed panels by a first
    kernel and by each column tile's item; Triton's tl.dot tiles with each row block's
    left operand packed first."""
    from conftest import require
    backend_name, tile = backend_tile
    extra = {"neon-packed": {"pack": True},
             "neon-blocks": {"pack": True, "pack_block_kib": 1},
             "opencl-packed": {"pack": True, "pack_in_tile": False},
             "opencl-tilepack": {"pack_in_tile": True},
             "triton-packed": {"pack": True}}.get(backend_name, {})
    backend_name = backend_name.split("-")[0]
    require(backend_name)
    case = next(c for c in CASES if c.name == name)
    values, arrays = case.inputs()
    op = case.build(*values)
    fused = kg.fuse(op)
    tiles = {"tile": (tile[0], tile[1], 16) if backend_name == "triton" else tile}
    # a conv block's algorithm choice would read the patches in place: packed variants emit
    # the block as one kernel
    emit = fused.emit_kernel if extra else fused.emit
    kernel = emit(backend_name, tuning="none", **tiles, **extra)
    assert kernel.metadata["schedule"] == "tiled"
    for option, value in extra.items():  # absent where OpenCL's scalar template runs
        assert kernel.metadata["tunables"].get(option, value) is value
    feeds = dict(zip((v.name for v in values), arrays))
    got = kernel(*(feeds[v.name] for v in fused.inputs))
    assert_close(got, reference(op, *arrays).astype(got.dtype), scale=case.scale)


def test_a_padded_average_pool_counts_its_taps_without_a_second_reduction() -> None:
    """An AveragePool whose border windows count fewer taps divides by a count written tap by
    tap on the output index (one sum per output, 1.5-1.6x faster on OpenCL's 'item' than a
    second reduction); a window longer than ``COUNT_UNROLLED_TAPS`` taps keeps a reduction.
    Values: the cases above."""
    from kernelgen.ir.expr import Reduce, walk
    from kernelgen.ops.nn import COUNT_UNROLLED_TAPS
    x = kg.tensor("x", (1, 2, 9, 9))
    for kernel, reductions in (([3, 3], 1), ([COUNT_UNROLLED_TAPS, 1], 2)):
        pads = [k // 2 for k in kernel] * 2
        body = kg.average_pool(x, kernel, pads=pads).body
        assert sum(isinstance(n, Reduce) for n in walk(body)) == reductions
