"""AGO's intensive fusion: Conv -> 1x1 Conv, MatMul -> MatMul and the attention pattern
MatMul -> Softmax -> MatMul as one kernel equal the unfused operators, and the contraction
templates compute each producer element once by default (redundancy 1.0), as does the attention
kernel, which stages each score row once per query (``kernelgen/lower/staging.py``)."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import assert_close, opencl_caps, require, run
from reference import evaluate_chain

from kernelgen import backends
from kernelgen.tune import tune
import kernelgen as kg
from kernelgen.fastrun import FastRunDB
from kernelgen.ir.expr import Call, Reduce, walk
from kernelgen.lower import unroll
from kernelgen.lower import lower
from kernelgen.lower.staging import unstage
from kernelgen.mapping_types.tiling import redundancy

rng = np.random.default_rng(11)


def _feeds(values: list[kg.Value]) -> dict[str, np.ndarray]:
    return {v.name: (rng.standard_normal(v.shape) * 0.5).astype(np.float32) for v in values}


def _conv_then_1x1() -> tuple[list[kg.Value], list[kg.Op]]:
    x, w1, w2 = (kg.tensor("x", (1, 5, 9, 11)), kg.tensor("w1", (7, 5, 3, 3)),
                 kg.tensor("w2", (6, 7, 1, 1)))
    p = kg.conv(x, w1, pads=[1, 1, 1, 1])
    r = kg.relu(p)
    return [x, w1, w2], [p, r, kg.conv(r, w2)]


def _matmul_chain() -> tuple[list[kg.Value], list[kg.Op]]:
    a, b, d = kg.tensor("a", (13, 7)), kg.tensor("b", (7, 9)), kg.tensor("d", (9, 5))
    first = kg.matmul(a, b)
    return [a, b, d], [first, kg.matmul(first, d)]


def _attention() -> tuple[list[kg.Value], list[kg.Op]]:
    q, k, v = kg.tensor("q", (6, 8)), kg.tensor("k", (8, 10)), kg.tensor("v", (10, 4))
    s = kg.matmul(q, k)
    p = kg.softmax(s, 1)
    return [q, k, v], [s, p, kg.matmul(p, v)]


PATTERNS = {"conv-1x1": _conv_then_1x1, "matmul-matmul": _matmul_chain,
            "attention": _attention}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_intensive_fusion_equals_unfused(backend: str, pattern: str) -> None:
    values, ops = PATTERNS[pattern]()
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    with pytest.raises(kg.FusionError, match="red"):
        kg.fuse(*ops)  # Many-to-Many -> Many-to-Many is red in DNNFusion's table ...
    fused = kg.fuse(*ops, force=True)  # ... AGO fuses it under its tiling constraint
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want, scale=50)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
@pytest.mark.parametrize("pattern", ["conv-1x1", "matmul-matmul"])
def test_default_tiling_computes_each_producer_element_once(backend_name: str,
                                                             pattern: str) -> None:
    require(backend_name)
    values, ops = PATTERNS[pattern]()
    fused = kg.fuse(*ops, force=True)
    kernel = fused.emit(backend_name)
    assert kernel.metadata["schedule"] == "tiled"
    assert kernel.metadata["producer_redundancy"] == 1.0
    consumer = ops[-1]  # the tiling analysis agrees: full columns recompute nothing
    full = list(consumer.shape)
    assert redundancy(consumer.index_maps[0], full) == 1.0
    # split tiles recompute: columns when the producer is the left operand; rows when it is
    # the right operand (vectors along the pixels) and no column tile packs it once
    narrow = fused.emit(backend_name, tile=(4, 4), pack=False)
    assert narrow.metadata["producer_redundancy"] > 1.0
    # ... unless each column tile computes its producer once into its panel (OpenCL's
    # default over several row tiles)
    packed = [fused.emit(backend_name, tile=(4, 4))] if backend_name == "opencl" and \
        pattern == "conv-1x1" else []
    for k in packed:
        assert k.metadata["tunables"]["pack_in_tile"] and \
            k.metadata["producer_redundancy"] == 1.0
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    for k in (kernel, narrow, *packed):
        assert_close(k(*(feeds[v.name] for v in fused.inputs)), want, scale=50)


def _conv_then_1x1_with(channels: int, out: int = 6) -> tuple[list[kg.Value], list[kg.Op]]:
    """conv3x3 + ReLU -> 1x1 (``out`` channels) over 2 images, the producer with ``channels``
    channels."""
    x, w1, w2 = (kg.tensor("x", (2, 5, 9, 11)), kg.tensor("w1", (channels, 5, 3, 3)),
                 kg.tensor("w2", (out, channels, 1, 1)))
    p = kg.conv(x, w1, pads=[1, 1, 1, 1])
    ops = [p, kg.relu(p)]
    ops.append(kg.conv(ops[-1], w2))
    return [x, w1, w2], ops


@pytest.mark.parametrize("channels, group", [(7, 7), (11, 6), (12, 6), (13, 7), (32, 8)])
def test_opencl_producer_channels_share_their_loads(channels: int, group: int) -> None:
    """OpenCL computes an AGO conv producer as the vector operand, several of its channels
    per reduction step (the largest divisor of the channel count up to 8), each vector of
    the input window loaded once for all of them. A prime count above 8 takes the group of
    4 to 8 whose steps cover the fewest channels (11: two of 6; 13: two of 7), its last step
    shifted back over channels already summed, which it weighs by zero."""
    require("opencl")
    values, ops = _conv_then_1x1_with(channels)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    kernel = fused.emit("opencl", tuning="none")
    assert kernel.metadata["producer_redundancy"] == 1.0
    assert f"kg_k += {group})" in kernel.source
    assert ("kg_k0 = kg_min(kg_k" in kernel.source) == bool(channels % group)
    # one interior and one masked-edge vector load of the input, shared by the group
    assert len(re.findall(r"vload\d+\(0, x \+ ", kernel.source)) == 2
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=50)


@pytest.mark.parametrize("channels, out, tile", [(13, 41, None), (12, 37, (5, 16)),
                                                (7, 100, (8, 32))])
def test_opencl_packs_the_producer_once_for_many_consumer_rows(
        channels: int, out: int, tile: tuple[int, int] | None) -> None:
    """Over more consumer rows than one OpenCL tile holds (41, 37, 100 output channels of the
    1x1 conv), each column tile's work-item computes its producer columns into a panel once,
    in channel groups (13 in two of 7, the last shifted back: its repeats rewrite equal
    values), and its row tiles (a partial last one shifted up) sweep the panel."""
    require("opencl")
    values, ops = _conv_then_1x1_with(channels, out)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    kernel = fused.emit("opencl", tuning="none", **({"tile": tile} if tile else {}))
    assert kernel.metadata["tunables"]["pack_in_tile"]
    assert kernel.metadata["producer_redundancy"] == 1.0
    assert ("kg_panel + (kg_k0 + kg_g)" in kernel.source) == (channels == 13)
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=50)


@pytest.mark.parametrize("channels", [7, 21])
def test_neon_packs_a_conv_producer_once_whatever_the_tiles(channels: int) -> None:
    """NEON computes an AGO conv producer (conv3x3 + ReLU -> 1x1) as the packed operand:
    vector accumulators along the pixels, each value once into a panel that every row tile
    reads, so narrow tiles recompute nothing; several blocks of panels too. The producer's
    channels are computed in groups sharing their input loads: 7 in one group; 21 in two of
    11, the second with one row past the end computed on a clamped channel and not stored."""
    require("neon")
    values, ops = _conv_then_1x1_with(channels)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    group = {7: 7, 21: 11}[channels]
    for options in ({}, {"tile": (1, 4), "pack_block_kib": 1}):
        kernel = fused.emit("neon", tuning="none", **options)
        assert kernel.metadata["tunables"]["pack"]
        assert kernel.metadata["producer_redundancy"] == 1.0
        assert kernel.metadata["right_operand_reads"] == ["w1", "x"]
        assert f"kg_k += {group})" in kernel.source
        assert "vfmaq_f32(" in kernel.source  # the producer's sums, 4 pixels a vector
        assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=50)


def _scaled_attention(batch: int, m: int, d: int, n: int, dv: int
                      ) -> tuple[list[kg.Value], list[kg.Op]]:
    """softmax(Q K * scale + mask) V, then ReLU: a prologue between the MatMuls (scale and a
    broadcast mask) and an epilogue after them."""
    q, k, v = (kg.tensor("q", (batch, m, d)), kg.tensor("k", (batch, d, n)),
               kg.tensor("v", (batch, n, dv)))
    scale, mask = kg.tensor("scale", (1,)), kg.tensor("mask", (m, n))
    s = kg.matmul(q, k)
    scaled = kg.mul(s, scale)
    masked = kg.add(scaled, mask)
    p = kg.softmax(masked, 2)
    o = kg.matmul(p, v)
    return [q, k, v, scale, mask], [s, scaled, masked, p, o, kg.relu(o)]


# one query and one key; primes; rows longer than two float8 vectors with a ragged end
ATTENTION_SHAPES = [(1, 1, 1, 1, 1), (1, 7, 13, 5, 3), (2, 5, 8, 11, 3), (1, 37, 16, 129, 17)]


@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_with_prologue_and_epilogue_equals_unfused(backend: str, shape) -> None:
    values, ops = _scaled_attention(*shape)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops, force=True)
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want, scale=50)


# (batch, queries, depth, keys, value depth): depth a multiple of the vector width (keys read as
# vectors along it) with a ragged last block of keys; a depth no width divides (keys read one
# by one)
TRANSPOSED_KEY_SHAPES = [(1, 37, 16, 129, 17), (2, 9, 32, 40, 3), (1, 7, 13, 5, 3)]


def _key_transposed_attention(batch: int, m: int, d: int, n: int, dv: int
                              ) -> tuple[list[kg.Value], list[kg.Op]]:
    q, kt, v = (kg.tensor("q", (batch, m, d)), kg.tensor("kt", (batch, n, d)),
                kg.tensor("v", (batch, n, dv)))
    k = kg.transpose(kt, [0, 2, 1])
    s = kg.matmul(q, k)
    scaled = kg.mul(s, kg.tensor("scale", (1,)))
    p = kg.softmax(scaled, 2)
    return [q, kt, v, scaled.inputs[1]], [k, s, scaled, p, kg.matmul(p, v)]


@pytest.mark.parametrize("shape", TRANSPOSED_KEY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_with_a_fused_key_transpose(backend: str, shape) -> None:
    """Q Kᵀ with the Transpose of K (keys, depth) fused: the staged score row reads K along
    the depth (its reduction), strided along the keys (its vector lanes). On the 'row'
    schedule (OpenCL, NEON) each score is a dot product of a query's row and a key's row read
    as vectors along the depth, the lanes folded by pair sums (``backends/c/dots.py``),
    where the depth is a multiple of the width and the row holds two vectors."""
    batch, m, d, n, dv = shape
    values, ops = _key_transposed_attention(*shape)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops, force=True)
    if backend in ("opencl", "neon"):
        kernel = fused.emit(backend, tuning="none")
        width = kernel.metadata["tunables"].get("vector_width", 0)
        key = r"vld1q_f32\(in1 \+" if backend == "neon" else r"vload\d+\(0, kt \+"
        vector_keys = re.search(key, kernel.source) is not None
        pair_sums = re.search(r"vpaddq_f32|shuffle2\(", kernel.source) is not None
        row = kernel.metadata["schedule"] == "row"
        assert vector_keys == pair_sums == (row and d % width == 0 and n >= 2 * width), \
            kernel.source
        assert_close(kernel(*(feeds[x.name] for x in fused.inputs)), want, scale=50)
    (got,) = run(backend, fused, *(feeds[x.name] for x in fused.inputs))
    assert_close(got, want, scale=50)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_key_dot_products_for_every_queries_per_work_item(backend_name: str) -> None:
    """The dot products take the queries of a work-item in pairs, or one by one where their
    count is odd (every ``group_rows`` choice of 12 queries), each with its own folding of
    the lanes: all equal the reference."""
    require(backend_name)
    values, ops = _key_transposed_attention(1, 12, 16, 24, 5)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops, force=True)
    for rows in unroll.group_row_choices(fused.lower()):
        kernel = fused.emit(backend_name, tuning="none", group_rows=rows)
        assert kernel.metadata["schedule"] == "row"
        assert_close(kernel(*(feeds[x.name] for x in fused.inputs)), want, scale=50)


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
def test_attention_computes_each_score_once(backend_name: str) -> None:
    require(backend_name)
    values, ops = _scaled_attention(2, 5, 8, 11, 3)
    fused = kg.fuse(*ops, force=True)
    loop = lower(fused, "attention")
    # the score row is staged once per query, then the exp row that the softmax's sum and
    # P V read; P V divides its sums by the exps' sum once (no row of weights)
    assert [st.buffer.shape for st in loop.staged] == [(11,), (11,)]
    (store,) = loop.stores  # relu(sum(E V) * (1 / sum(E)))
    scaled = store.value.args[0]
    assert isinstance(scaled, Call) and scaled.fn == "mul" and \
        {type(a) for a in scaled.args} == {Reduce, Call}
    exps = [n for st in loop.staged for n in walk(st.value)] + \
        [n for r in loop.hoisted for n in walk(r)]
    assert sum(isinstance(n, Call) and n.fn == "exp" for n in set(exps)) == 1
    assert {b.name for b in loop.inputs} == {"q", "k", "v", "scale", "mask"}
    inlined = unstage(loop)
    assert not inlined.staged and loop.flops() < inlined.flops()
    kernel = fused.emit(backend_name, tuning="none")
    assert kernel.metadata["producer_redundancy"] == 1.0
    assert kernel.metadata["staged_rows"] == ["stage0", "stage1"]
    # the keys are read by one loop (the staged row's), not by every reduction that uses a score
    key = {"neon": r"\bin1\[", "triton": r"\bin1 \+", "opencl": r"\bk\["}[backend_name]
    assert len(re.findall(key, kernel.source)) == 1
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=50)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_weights_without_the_max_stay_a_row(backend_name: str) -> None:
    """exp(s) / sum(exp(s)) with no max subtracted: its exps are unbounded, so P V keeps the
    row of weights instead of dividing unnormalised sums once. Scores of 80 make exp(s) V
    overflow float32 while the weights (about 1/2 each) times V do not."""
    require(backend_name)
    q, k, v = kg.tensor("q", (3, 2)), kg.tensor("k", (2, 2)), kg.tensor("v", (2, 3))
    s = kg.matmul(q, k)
    e = kg.exp(s)
    total = kg.reduce_sum(e, [1], 1)
    w = kg.div(e, total)
    ops = [s, e, total, w, kg.matmul(w, v)]
    fused = kg.fuse(*ops, force=True)
    assert len(lower(fused, "attention").staged) == 3  # scores, exps, weights
    feeds = {"q": np.full((3, 2), 8.0, np.float32), "k": np.full((2, 2), 5.0, np.float32),
             "v": np.full((2, 3), 1e4, np.float32)}
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    assert np.isfinite(want).all()
    got = fused.emit(backend_name, tuning="none")(feeds["q"], feeds["k"], feeds["v"])
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_staged_rows_do_not_clash_with_tensor_names(backend_name: str) -> None:
    require(backend_name)
    q, k, v = (kg.tensor("stage0", (3, 4)), kg.tensor("kg_stage0", (4, 5)),
               kg.tensor("stage1", (5, 2)))
    s = kg.matmul(q, k)
    p = kg.softmax(s, 1)
    ops = [s, p, kg.matmul(p, v)]
    feeds = _feeds([q, k, v])
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    kernel = kg.fuse(*ops, force=True).emit(backend_name, tuning="none")
    assert kernel.metadata["staged_rows"] == ["stage0_", "stage1_"]
    assert_close(kernel(feeds["stage0"], feeds["kg_stage0"], feeds["stage1"]), want, scale=50)


# (batch, queries, d, keys, dv): several queries a work-item, with a batch axis above them,
# keys and output columns no multiple of the vector width, and 64 keys in 16-wide vectors
GROUP_SHAPES = [(2, 8, 8, 37, 19), (1, 12, 5, 64, 33), (3, 6, 16, 40, 7)]


@pytest.mark.parametrize("shape", GROUP_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_several_queries_per_work_item(backend_name: str, shape) -> None:
    """Every group_rows choice computes the same attention; with more than one query a
    work-item, one loop reads each row of keys for all of them (the source reads the keys as
    often as with one query: in the vector loop and its scalar tail, one vector a step)."""
    require(backend_name)
    values, ops = _scaled_attention(*shape)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    choices = unroll.group_row_choices(fused.lower())
    assert choices == tuple(r for r in range(1, 9) if shape[1] % r == 0)
    key = r"\bin1\[|vld1q_f32\(in1 \+" if backend_name == "neon" else r"\bk\[|\(0, k \+ "
    reads = set()
    for rows in choices:
        kernel = fused.emit(backend_name, tuning="none", group_rows=rows, row_vectors=1)
        assert kernel.metadata["tunables"]["group_rows"] == rows
        reads.add(len(re.findall(key, kernel.source)))
        assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=50)
    assert len(reads) == 1 and reads <= {1, 2}
    default = fused.emit(backend_name, tuning="none").metadata["tunables"]["group_rows"]
    points = shape[0] * shape[1]
    # the default shares loads on the 'row' schedule only (a CPU's; a GPU's work-group row: 1)
    shares = backend_name == "neon" or opencl_caps().simd_within_work_item
    assert default == (max(r for r in choices if r == 1 or points // r >= 8) if shares else 1)


def test_bad_group_rows_are_refused() -> None:
    require("opencl")
    _, ops = _scaled_attention(1, 6, 4, 5, 2)
    fused = kg.fuse(*ops, force=True)
    with pytest.raises(ValueError, match=r"group_rows must be one of \(1, 2, 3, 6\).*got 4"):
        fused.emit("opencl", tuning="none", group_rows=4)
    with pytest.raises(ValueError, match="group_rows must be one of"):
        fused.emit("neon", tuning="none", group_rows=5)
    # a log-softmax stages nothing (its stores compute no term its sum does)
    unstaged = kg.fuse(kg.log_softmax(kg.tensor("x", (8, 40)), 1))
    with pytest.raises(ValueError, match=r"group_rows must be one of \(1,\)"):
        unstaged.emit("opencl", tuning="none", schedule="row", group_rows=2)
    with pytest.raises(ValueError, match="group_rows applies to the"):
        unstaged.emit("opencl", tuning="none", schedule="group", group_rows=2)


def test_staged_kernel_refuses_cooperative_schedules() -> None:
    require("opencl")
    _, ops = _scaled_attention(1, 3, 4, 5, 2)
    fused = kg.fuse(*ops, force=True)
    with pytest.raises(ValueError, match="stages a producer row.*'group'"):
        fused.emit("opencl", schedule="group", tuning="none")


# --- staging's limits (regressions found by Hypothesis) ---------------------------------------

def _softmax_of_softmax_across_axes() -> tuple[list[kg.Value], list[kg.Op]]:
    """The outer softmax's max and sum are keyed by rows, and read the inner softmax, whose max
    over a column keys on no domain axis: staging it would run the outer reductions per element
    and put the row in a kernel without a group."""
    x = kg.tensor("x", (2, 3))
    inner = kg.softmax(x, 0)
    return [x], [inner, kg.softmax(inner, 1)]


def _softmax_then_reduce_across_axes() -> tuple[list[kg.Value], list[kg.Op]]:
    """A per-element sum over ``c`` of a softmax over ``b``: the softmax's max and sum key on
    ``(a, c)``, so their rows over ``c`` are staged per ``a`` (and the row of the sums'
    reciprocals the softmax multiplies by), and nothing else is hoisted."""
    x = kg.tensor("x", (3, 5, 7))
    inner = kg.softmax(x, 1)
    return [x], [inner, kg.ops.reduce_op("ReduceSum", inner, [2], 0)]


STAGING_LIMITS = {"softmax-softmax": (_softmax_of_softmax_across_axes, 0),
                  "softmax-reducesum": (_softmax_then_reduce_across_axes, 3)}


@pytest.mark.parametrize("pattern", STAGING_LIMITS)
def test_staging_only_where_the_group_holds_the_row(backend: str, pattern: str) -> None:
    build, rows = STAGING_LIMITS[pattern]
    values, ops = build()
    fused = kg.fuse(*ops, force=True)
    loop = lower(fused, pattern)
    assert len(loop.staged) == rows
    if rows:
        assert not loop.hoisted and loop.grouped and loop.flops() < unstage(loop).flops()
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want, scale=50)


def test_triton_inlines_a_staged_row_it_cannot_hold_as_a_block() -> None:
    """A staged row read other than along a reduction over the whole row (here the output's
    sum runs over the keys backwards) cannot be one block of a Triton program, which has no
    run-time indexing into a block: Triton runs the inlined form, and stays right."""
    require("triton")
    from kernelgen.backends.triton.schedule import staged_as_blocks
    from kernelgen.ir.expr import Load, Reduce, transform, walk
    from kernelgen.compile import compile_loop
    from kernelgen.ir.loop import Store
    from kernelgen.ir.substitute import specialise

    values, ops = _scaled_attention(1, 3, 4, 5, 2)
    fused = kg.fuse(*ops, force=True)
    loop = lower(fused, "attention")
    weights = loop.staged[-1].buffer.name

    def backwards(node, recurse):
        if isinstance(node, Reduce) and any(isinstance(n, Load) and n.buffer == weights
                                            for n in walk(node.body)):
            (s, n), = node.axes
            return Reduce(node.dtype, node.kind, specialise(node.body, {s: n - 1 - s},
                                                            loop.ranges), node.axes)
        return None

    stores = tuple(Store(st.buffer, transform(st.value, backwards)) for st in loop.stores)
    reversed_loop = replace(loop, stores=stores)
    assert staged_as_blocks(loop) and not staged_as_blocks(reversed_loop)
    kernel = compile_loop(reversed_loop, "triton")
    assert "staged_rows" not in kernel.metadata
    feeds = _feeds(values)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=50)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_tuner_searches_queries_per_work_item(backend_name: str, tmp_path) -> None:
    """The staged kernel's search space holds every group_rows choice; every candidate is
    checked against the interpreter and the winner is one of them."""
    require(backend_name)
    _, ops = _scaled_attention(1, 8, 8, 37, 5)
    loop = lower(kg.fuse(*ops, force=True), "attention")
    space = backends.get(backend_name).search_space(loop)
    assert {c.as_options().get("group_rows") for c in space} >= {1, 2, 4, 8}
    result = tune(loop, backend_name, db=FastRunDB(tmp_path / "db"), repeat=2,
                  budget_s=math.inf)  # every status checked: no time budget
    assert all(c.status == "ok" for c in result.candidates), [c.status for c in result.candidates]
    assert result.best in space
