"""OpenCL's key panel (``kernelgen/backends/opencl/panel.py``): a staged score row whose keys are
read along the summed depth (Q Kᵀ with the Transpose of K fused) reads them from a transposed
copy in local memory that each work-item fills once for its queries. Every shape against ONNX's
reference evaluator: keys, depth and queries that are primes or not multiples of the
vector width (panel blocks cut at both edges), heads of BERT's layout (K read from a
``(seq, heads * depth)`` projection) with an additive mask, and every queries-a-work-item choice.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_close, opencl_caps
from reference import evaluate_chain
from test_ago import _key_transposed_attention

import kernelgen as kg
from kernelgen import backends, ops
from kernelgen.backends.opencl import panel
from kernelgen.fastrun import FastRunDB
from kernelgen.tune import tune

rng = np.random.default_rng(23)


def _heads(seq: int, heads: int, depth: int) -> tuple[list[kg.Value], list[kg.Op]]:
    """BERT's attention after its projections: Q, K and V as (1, seq, heads * depth), split
    into heads, K transposed to (heads, depth, seq), scores scaled plus a (1, 1, 1, seq)
    mask."""
    hidden = heads * depth
    q, k, v = (kg.tensor(n, (1, seq, hidden)) for n in "qkv")
    mask = kg.tensor("mask", (1, 1, 1, seq))
    qh = kg.transpose(kg.reshape(q, (1, seq, heads, depth)), [0, 2, 1, 3])
    kh = kg.transpose(kg.reshape(k, (1, seq, heads, depth)), [0, 2, 3, 1])
    vh = kg.transpose(kg.reshape(v, (1, seq, heads, depth)), [0, 2, 1, 3])
    s = kg.matmul(qh, kh)
    scaled = kg.mul(s, kg.tensor("scale", (1,)))
    masked = kg.add(scaled, mask)
    p = kg.softmax(masked, 3)
    out = kg.matmul(p, vh)
    ops = [kh, s, scaled, masked, p, out]
    return [qh, kh.inputs[0], vh, scaled.inputs[1], mask], ops


def _check(values: list[kg.Value], ops: list[kg.Op], **options) -> kg.FusedOp:
    """Every emitted panel kernel of ``ops`` equals the reference; returns the fused block."""
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(np.float32) for v in values}
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops, force=True)
    kernel = fused.emit("opencl", tuning="none", **options)
    meta = kernel.metadata
    assert meta["schedule"] == "row" and meta["tunables"]["panel"] is True, meta
    assert "__local float kg_panel[" in kernel.source
    args = [feeds[x.name] if x.name in feeds else kernel.constants[x.name]
            for x in fused.inputs]
    assert_close(kernel(*args), want, scale=50)
    return fused


# (batch, queries, depth, keys, value depth): keys and depth multiples of 16, neither (both
# panel edges, blocks of neither), depth under a vector (no block), 3 queries, 2 key vectors
SHAPES = [(2, 32, 16, 64, 16), (1, 17, 24, 37, 5), (3, 16, 13, 33, 7), (4, 3, 16, 32, 3),
          (2, 20, 32, 129, 17)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_panel_attention_equals_reference(shape: tuple[int, ...]) -> None:
    caps = opencl_caps()
    if not caps.simd_within_work_item:
        pytest.skip("the key panel is a CPU schedule (one work-item a thread)")
    fused = _check(*_key_transposed_attention(*shape), panel=True)
    loop = fused.lower()
    group_rows = fused.emit("opencl", tuning="none", panel=True).metadata["tunables"][
        "group_rows"]
    for rows in panel.row_choices(loop, group_rows):  # every queries-a-work-item choice
        _check(*_key_transposed_attention(*shape), panel=True, panel_rows=rows)


@pytest.mark.parametrize("seq,heads,depth", [(128, 2, 64), (37, 3, 16), (48, 2, 40)])
def test_panel_reads_bert_heads_with_a_mask(seq: int, heads: int, depth: int) -> None:
    """K read from its projection's (seq, heads * depth) layout: the panel's blocks are
    vectors along one head's depth; the mask and the scale stay in the score row."""
    if not opencl_caps().simd_within_work_item:
        pytest.skip("the key panel is a CPU schedule (one work-item a thread)")
    _check(*_heads(seq, heads, depth), panel=True)


def test_default_takes_the_panel_for_long_heads_only() -> None:
    """By default on a CPU: a panel where a work-item takes at least ``MIN_ROWS`` queries and
    still leaves ``ITEMS_PER_UNIT`` work-items a compute unit; none for few queries, and none
    on a device without local memory enough for it (``panel=True`` then names the bytes)."""
    caps = opencl_caps()
    if not caps.simd_within_work_item:
        pytest.skip("the key panel is a CPU schedule (one work-item a thread)")
    _, long_ops = _key_transposed_attention(8, 64, 32, 64, 32)
    meta = kg.fuse(*long_ops, force=True).emit("opencl", tuning="none").metadata
    assert meta["tunables"]["panel"] is True and meta["key_panel_reads"] == "kt"
    units = caps.compute_units or 1
    assert 8 * 64 // meta["tunables"]["panel_rows"] >= min(8, panel.ITEMS_PER_UNIT * units)
    _, few_ops = _key_transposed_attention(1, 6, 16, 64, 8)
    meta = kg.fuse(*few_ops, force=True).emit("opencl", tuning="none").metadata
    assert meta["tunables"]["panel"] is False and "key_panel_reads" not in meta
    deep = kg.fuse(*_key_transposed_attention(1, 256, 4096, 64, 8)[1], force=True)  # a 1.3 MB panel
    avx2 = backends.get("opencl").for_device("cpu-avx2")  # 512 KiB of local memory
    assert deep.emit(avx2, tuning="none").metadata["tunables"]["panel"] is False
    with pytest.raises(ValueError, match=r"panel needs 1310720 bytes of local memory for the "
                                         r"panel; the device has 524288"):
        deep.emit(avx2, tuning="none", panel=True)


def test_bad_panel_options_name_the_problem() -> None:
    opencl_caps()
    fused = kg.fuse(*_key_transposed_attention(1, 32, 16, 64, 8)[1], force=True)
    with pytest.raises(ValueError, match=r"panel_rows must be one of \[.*32\].*got 5"):
        fused.emit("opencl", tuning="none", panel=True, panel_rows=5)
    with pytest.raises(ValueError, match="panel applies to the 'row' schedule"):
        fused.emit("opencl", tuning="none", schedule="item", panel=True)
    with pytest.raises(ValueError, match="panel_rows applies where the keys are read from a"):
        fused.emit("opencl", tuning="none", panel=False, panel_rows=32)
    q, kt, v = kg.tensor("q", (1, 32, 16)), kg.tensor("kt", (1, 16, 64)), \
        kg.tensor("v", (1, 64, 8))
    s = kg.matmul(q, kt)  # K given transposed: its rows are read as vectors already
    p = kg.softmax(s, 2)
    plain = kg.fuse(s, p, kg.matmul(p, v), force=True)
    with pytest.raises(ValueError, match="panel needs a staged score row reading its keys"):
        plain.emit("opencl", tuning="none", schedule="row", panel=True)
    rows = kg.fuse(ops.reduce_op("ReduceSum", kg.tensor("x", (64, 256)), [1], 1))
    with pytest.raises(ValueError, match="panel needs a staged score row reading its keys"):
        rows.emit("opencl", tuning="none", schedule="row", panel=True)  # nothing staged


def test_tuner_searches_the_panel(tmp_path) -> None:
    """The tuner's space holds the row schedule without the panel and with it for every
    queries-a-work-item choice; each candidate runs and matches the interpreter, and the
    winner is one of them. A device without room for the panel is offered none of it."""
    caps = opencl_caps()
    if not caps.simd_within_work_item:
        pytest.skip("the key panel is a CPU schedule (one work-item a thread)")
    fused = kg.fuse(*_key_transposed_attention(2, 16, 13, 37, 5)[1], force=True)
    loop = fused.lower()
    space = backends.get("opencl").search_space(loop)
    options = [c.as_options() for c in space]
    rows = {o["panel_rows"] for o in options if o.get("panel") is True}
    group_rows = fused.emit("opencl", tuning="none", panel=True).metadata["tunables"][
        "group_rows"]
    assert {"schedule": "row", "panel": False} in options and 16 in rows and \
        rows == set(panel.row_choices(loop, group_rows))
    result = tune(loop, "opencl", db=FastRunDB(tmp_path / "db"), repeat=2, budget_s=math.inf)
    assert all(c.status == "ok" for c in result.candidates), [c.status for c in result.candidates]
    assert result.best in space
    deep = kg.fuse(*_key_transposed_attention(1, 256, 4096, 64, 8)[1], force=True).lower()
    avx2 = backends.get("opencl").for_device("cpu-avx2")
    assert not any(c.as_options().get("panel") for c in avx2.search_space(deep))
