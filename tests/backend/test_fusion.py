"""Fused blocks against the operator-by-operator ONNX reference: every operator with neighbours on
both sides (a chain and a diamond), multi-output blocks, index-only operators leaving no buffer
behind, and a Hypothesis property test over random chains and diamonds of 2-6 operators."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import assert_close, backend_problem, prebuild, run
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from reference import evaluate_chain
from test_ops import CASES, Case, data

import kernelgen as kg
from kernelgen.mapping_types import folds_to_flat

# one case per operator kind keeps the matrix to a few seconds per backend
_SEEN: set[str] = set()
NEIGHBOUR_CASES: list[Case] = []
for _case in CASES:
    _kind = _case.name.split("(")[0].split("-")[0].rstrip("0123456789")
    if _kind not in _SEEN and all(d == "float32" for d in _case.dtypes) \
            and not _kind.startswith(("IsNaN", "IsInf", "Equal", "Less", "Greater")):
        _SEEN.add(_kind)
        NEIGHBOUR_CASES.append(_case)


def neighbour_block(case: Case) -> tuple[list[kg.Value], list[np.ndarray], list[kg.Op]]:
    """pre(x) -> op -> post(op) -> combine(post, op): a producer before, a diamond after."""
    values, arrays = case.inputs()
    if case.name.startswith("Gather"):
        arrays[1][...] = np.abs(arrays[1]) % values[0].shape[1]
    pre = kg.abs(values[0]) if case.kinds[0] in ("pos", "ge1") else kg.neg(values[0])
    if case.kinds[0] == "ge1":
        arrays[0] = np.abs(arrays[0]) + 1.0
    op = case.build(pre, *values[1:])
    if op.dtype.is_float:
        post, combine = kg.tanh(op), kg.add
    elif op.dtype is kg.DType.bool:
        post, combine = kg.logical_not(op), kg.logical_xor
    else:
        post, combine = kg.abs(op), kg.add
    return values, arrays, [pre, op, post, combine(post, op)]


@pytest.fixture(scope="module", autouse=True)
def _neon_batch(request: pytest.FixtureRequest) -> None:
    prebuild(request, lambda: [kg.fuse(*neighbour_block(c)[2], force=True)
                                    for c in NEIGHBOUR_CASES])


@pytest.mark.parametrize("case", NEIGHBOUR_CASES, ids=lambda c: c.name)
def test_operator_with_neighbours(backend: str, case: Case) -> None:
    values, arrays, ops = neighbour_block(case)
    out = ops[-1]
    fused = kg.fuse(*ops, force=True)
    feeds = {v.name: a for v, a in zip(values, arrays)}
    want = evaluate_chain(ops, feeds)[out.name]
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want.astype(got.dtype), scale=max(case.scale, 10))


def test_index_only_ops_leave_no_buffer(backend: str) -> None:
    """Transpose, Reshape and Slice inside a block are pure index arithmetic: the kernel reads
    only the block's input and writes only its output."""
    x = kg.tensor("x", (4, 6, 5))
    t = kg.transpose(x, [2, 0, 1])
    r = kg.reshape(t, [5, 24])
    s = kg.slice(r, [1, 3], [5, 20], [0, 1], [2, 3])
    e = kg.exp(s)
    fused = kg.fuse(t, r, s, e)
    loop = fused.lower()
    assert [b.name for b in loop.inputs] == ["x"] and [b.name for b in loop.outputs] == [e.name]
    X = data((4, 6, 5))
    (got,) = run(backend, fused, X)
    assert_close(got, np.exp(X.transpose(2, 0, 1).reshape(5, 24)[1:5:2, 3:20:3]))
    composed = fused.index_maps[(e.name, "x")]  # x's index straight from e's output index
    assert len(composed.exprs) == 3 and composed.out_shape == (2, 6)


@pytest.mark.parametrize("shape", [(1, 7, 3, 5), (2, 13, 1, 1), (3, 1, 4, 11)])
def test_free_reshapes_fuse_beside_reductions(backend: str, shape: tuple[int, ...]) -> None:
    """A classifier head: GlobalAveragePool -> Flatten fuses without a measurement (a reshape
    that folds back to the flat offset is green, docs/algorithms.md), and so does Flatten ->
    Gemm; both against NumPy on shapes with 1s and primes."""
    x = kg.tensor("x", shape)
    pooled = kg.global_pool("GlobalAveragePool", x)
    flat = kg.flatten(pooled)
    head = kg.fuse(pooled, flat)  # green: no force, no measurement
    assert not head.needs_measurement
    X = data(shape)
    (got,) = run(backend, head, X)
    assert_close(got, X.mean(axis=(2, 3)))
    rows = kg.flatten(x)
    w = kg.tensor("w", (3, int(np.prod(shape[1:]))))
    gemm = kg.gemm(rows, w, transB=1)
    fc = kg.fuse(rows, gemm)
    # a merge of three axes folds too (Triton 3.6 on an H200 miscompiled its divisions in a
    # 32x32x32 tile's operand read: docs/algorithms.md, "A reshape moves nothing")
    assert folds_to_flat(rows.index_maps[0]) and not fc.needs_measurement
    if backend == "triton":
        assert "//" not in fc.emit("triton").source
    W = data(w.shape)
    (got,) = run(backend, fc, X, W)
    assert_close(got, X.reshape(shape[0], -1) @ W.T, scale=10)


def test_multi_output_block(backend: str) -> None:
    """A block whose intermediate is also an output, plus a second sink of the same shape."""
    x, b = kg.tensor("x", (5, 7)), kg.tensor("b", (7,))
    a = kg.add(x, b)
    r = kg.relu(a)
    s = kg.sigmoid(a)
    fused = kg.fuse(a, r, s, outputs=[a])
    assert [o.name for o in fused.outputs] == [a.name, r.name, s.name]
    X, B = data((5, 7)), data((7,))
    got = run(backend, fused, X, B)
    assert_close(got[0], X + B)
    assert_close(got[1], np.maximum(X + B, 0))
    assert_close(got[2], 1 / (1 + np.exp(-(X + B))))


def test_decomposed_layernorm(backend: str) -> None:
    """The decomposed LayerNorm (two dependent row reductions, a diamond on x) as one kernel."""
    x = kg.tensor("x", (6, 37))
    mean = kg.reduce_mean(x, [1])
    d = kg.sub(x, mean)
    sq = kg.mul(d, d)
    var = kg.reduce_mean(sq, [1])
    y = kg.div(d, kg.sqrt(var))
    ops = [mean, d, sq, var, y.inputs[1], y]
    with pytest.raises(kg.FusionError, match="red"):
        kg.fuse(*ops)  # Many-to-Many -> Many-to-Many is red in Table 3 ...
    fused = kg.fuse(*ops, force=True)  # ... but the schedule hoists both reductions per row
    X = data((6, 37))
    (got,) = run(backend, fused, X)
    dx = X - X.mean(1, keepdims=True)
    assert_close(got, dx / np.sqrt((dx * dx).mean(1, keepdims=True)), scale=10)
    assert fused.forced


def test_deeply_inlined_reductions() -> None:
    """Regression (found by Hypothesis): softmax of softmax of ... inlines hundreds of distinct
    reduction symbols; the interpreter gives unnested ones shared NumPy axes, so it stays
    under NumPy's dimension limit and still matches the reference."""
    x = kg.tensor("x", (1, 2))
    ops: list[kg.Op] = [kg.reduce_sum(x, [0])]
    for _ in range(5):
        ops.append(kg.softmax(ops[-1], 1))
    X = data((1, 2))
    want = evaluate_chain(ops, {"x": X})[ops[-1].name]
    (got,) = run("interp", kg.fuse(*ops, force=True), X)
    assert_close(got, want, scale=10)


@pytest.mark.parametrize("shape", [(1, 2, 2), (3, 5, 7)])
def test_a_reshape_read_through_one_floor_division(backend: str, shape: tuple[int, ...]) -> None:
    """Regression (found by Hypothesis on NEON): relu(x + b) -> softmax -> transpose ->
    reshape to 1-D; at (1, 2, 2) a hoisted reduction's index is the floor division
    ``o0 // 2`` itself, which the grouped-convolution split (``lower/passes.py:
    split_groups``) replaced by a Python 0 and failed on. Against NumPy on every backend."""
    x, b = kg.tensor("x", shape), kg.tensor("b", shape[2:])
    a = kg.add(x, b)
    r = kg.relu(a)
    s = kg.softmax(r, 1)
    t = kg.transpose(s, [0, 2, 1])
    y = kg.reshape(t, [int(np.prod(shape))])
    X, B = data(shape), data(shape[2:])
    (got,) = run(backend, kg.fuse(a, r, s, t, y, force=True), X, B)
    z = np.maximum(X + B, 0)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    assert_close(got, (e / e.sum(axis=1, keepdims=True)).transpose(0, 2, 1).ravel())


def test_reversed_strided_slice_concatenated_with_itself(backend: str) -> None:
    """Regression (found by Hypothesis on NEON): GCC 12.2 at -O3 with AVX2 masked loads
    if-converted this kernel's guarded reads, with their negative stride, into wrong code
    (``backends/neon/runtime.py`` now turns that if-conversion off)."""
    x = kg.tensor("x", (3, 3))
    s = kg.slice(x, [2], [-1000], [-1], [-2])
    ops = [s, kg.concat([s, s], 0)]
    X = data((3, 3))
    (got,) = run(backend, kg.fuse(*ops), X)
    assert_close(got, evaluate_chain(ops, {"x": X})[ops[-1].name])


# --- Hypothesis: random chains and diamonds --------------------------------------------------

UNARY = ["Relu", "Neg", "Tanh", "Sigmoid", "Abs", "Softsign", "Exp"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def chains(draw: st.DrawFn) -> tuple[list[kg.Value], list[kg.Op]]:
    """A random block of 2-6 operators on one input; each op consumes the newest value (so the
    last op is the only sink), binary ops may also take an older value (a diamond)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=rank, max_size=rank)))
    x = kg.tensor("x", shape)
    inputs: list[kg.Value] = [x]
    values: list[kg.Value] = [x]
    ops: list[kg.Op] = []
    for _ in range(draw(st.integers(2, 6))):
        v = values[-1]
        choice = draw(st.sampled_from(["unary", "binary", "bias", "transpose", "reshape",
                                       "reduce", "softmax", "slice", "pad", "concat"]))
        if choice == "binary":
            other = draw(st.sampled_from([w for w in values if w.shape == v.shape]))
            if draw(st.booleans()):
                op = kg.ops.binary(draw(st.sampled_from(["Add", "Sub", "Mul"])), v, other)
            else:
                op = kg.ops.variadic(draw(st.sampled_from(["Max", "Min"])), v, other)
        elif choice == "bias":
            b = kg.tensor(f"b{len(inputs)}", v.shape[-1:])
            inputs.append(b)
            op = kg.add(v, b)
        elif choice == "transpose" and v.rank > 1:
            op = kg.transpose(v, draw(st.permutations(range(v.rank))))
        elif choice == "reshape":
            op = kg.reshape(v, [v.numel]) if v.rank > 1 else kg.unsqueeze(v, [0])
        elif choice == "reduce":
            axis = draw(st.integers(0, v.rank - 1))
            op = kg.ops.reduce_op(draw(st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMean"])),
                                  v, [axis], 1)
        elif choice == "softmax":
            op = kg.softmax(v, draw(st.integers(0, v.rank - 1)))
        elif choice == "slice" and v.shape[-1] > 1:
            op = kg.slice(v, [v.shape[-1] - 1], [-1000], [-1], [-draw(st.integers(1, 2))])
        elif choice == "pad":
            op = kg.pad(v, [0] * v.rank + [1] * v.rank, 0.25)
        elif choice == "concat":
            same = [w for w in values if w.shape[1:] == v.shape[1:]]
            op = kg.concat([v, draw(st.sampled_from(same))], 0)
        else:
            op = kg.ops.unary(draw(st.sampled_from(UNARY)), v)
        ops.append(op)
        values.append(op)
    return inputs, ops


def check_random_block(chain: tuple[list[kg.Value], list[kg.Op]], seed: int,
                       backends: list[str], max_flops: int | None = None) -> None:
    """The fused kernel equals evaluating the operators one by one, on every given backend;
    chains whose fused kernel counts more than ``max_flops`` operations are not drawn."""
    inputs, ops = chain
    fused = kg.fuse(*ops, force=True)
    if max_flops is not None:
        assume(fused.lower().flops() <= max_flops)
    rng = np.random.default_rng(seed)
    feeds = {v.name: np.clip(rng.standard_normal(v.shape), -2, 2).astype(np.float32)
             for v in inputs}  # clipped: keeps Exp chains finite
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    arrays = [feeds[v.name] for v in fused.inputs]
    for backend in backends:
        (got,) = run(backend, fused, *arrays)
        assert_close(got, want, scale=50)


def _available(*names: str) -> list[str]:
    """The named backends that can run here; in CI (KERNELGEN_REQUIRE_BACKENDS) all must."""
    ok = [n for n in names if not backend_problem(n)]
    if os.environ.get("KERNELGEN_REQUIRE_BACKENDS") and len(ok) < len(names):
        pytest.fail("; ".join(str(backend_problem(n)) for n in names if n not in ok))
    if not ok:
        pytest.skip("; ".join(str(backend_problem(n)) for n in names))
    return ok


_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))


@settings(max_examples=220, **_SETTINGS)
@given(chain=chains(), seed=st.integers(0, 2**16))
def test_random_blocks_interpreter_and_opencl(chain, seed: int) -> None:
    check_random_block(chain, seed, ["interp", *_available("opencl")])


@settings(max_examples=40, **_SETTINGS)  # each example compiles C through SIMDe (~0.7 s)
@given(chain=chains(), seed=st.integers(0, 2**16))
def test_random_blocks_neon(chain, seed: int) -> None:
    check_random_block(chain, seed, _available("neon"))


@settings(max_examples=40, **_SETTINGS)  # the Triton interpreter costs ms per program
@given(chain=chains(), seed=st.integers(0, 2**16))
def test_random_blocks_triton(chain, seed: int) -> None:
    # The interpreter runs every loop in Python: a drawn chain of nested softmaxes and reductions
    # (about 1 in 300 counts over 1e5 operations) ran for more than 30 minutes while Hypothesis
    # kept shrinking it. Such chains still run on the interpreter, OpenCL and NEON tests above.
    check_random_block(chain, seed, _available("triton"), max_flops=100_000)


def test_loop_kernel_prints_as_a_listing() -> None:
    """``str(kernel.loop)`` lists buffers, the domain, staged rows, hoisted reductions and each
    store, with loads as ``buffer[offset]`` (it used to import a module that did not exist).
    A softmax stages its exp row once (``stage_shared_terms``): the sum and the stores read it."""
    x = kg.tensor("x", (4, 8))
    text = str(kg.fuse(kg.softmax(x, 1)).lower())
    lines = text.splitlines()
    assert lines[0] == "kernel fused_softmax"
    assert "  in  x: float32[4, 8]" in lines
    assert sum(line.startswith("  hoisted: ") for line in lines) == 2  # max, then sum
    assert "  staged: stage0[_row0 < 8] = exp(sub(x[_row0 + 8*o0], max[" in text
    assert any(re.fullmatch(r"  hoisted: sum\[(r\d+) < 8\]\(stage0\[\1\]\)", line)
               for line in lines)
    assert lines[-1].startswith("  softmax_") and "mul(stage0[o1], div(1.0, sum[" in lines[-1]
